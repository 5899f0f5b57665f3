// Running one case: the operation that planned it runs and judges it (a built-in kernel in this
// process, a plugin in a child), against the correctly rounded reference.
#include <chrono>

#include "core/errors.hpp"
#include "gate/cases.hpp"
#include "gate/operation.hpp"
#include "gate/plugin_operations.hpp"

namespace sharpcheck::gate {

const char* CaseOutcome::status() const {
  if (crashed) return "crash";
  if (!passed()) return "fail";
  return inconclusive() ? "inconclusive" : "pass";
}

CaseOutcome run_case(const GateCase& gate_case, const GateSettings& settings) {
  const auto start = std::chrono::steady_clock::now();
  CaseOutcome outcome;
  outcome.gate_case = gate_case;
  const Operation& operation = find_operation(settings.operations, gate_case.operation);
  if (gate_case.plugin_operation) {
    run_plugin_operation_case(operation, gate_case, settings, outcome);
  } else {
    operation.run(gate_case, settings, outcome);
  }
  if (!outcome.crashed && !outcome.interrupted && !outcome.comparison.passed(settings.strictest) &&
      outcome.failures.empty()) {
    outcome.failures.push_back(outcome.comparison.failure_summary(settings.strictest));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

}  // namespace sharpcheck::gate
