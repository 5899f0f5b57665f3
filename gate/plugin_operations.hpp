// A plugin's operations through the version-6 entry sharpcheck_op (kernels/plugin_abi.h): every
// case an operation hands a kernel outside the gate (Operation::external_cases, the cases
// sharpcheck.sweep runs too), in each format the plugin declares, run in a child and judged by the
// operation's own judge. Nothing here names an operation: a new operation with external cases
// that say their outputs can be computed by a plugin with no change here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gate/cases.hpp"
#include "gate/operation.hpp"

namespace sharpcheck::gate {

// Adds the plugin's version-6 cases (none without a plugin or without declared operations).
// InputError naming the plugin for an operation sharpcheck does not have, or one whose cases
// cannot be run through sharpcheck_op yet.
void plan_plugin_operations(const PlanContext& context, std::vector<GateCase>& cases);

// Runs one of those cases (gate_case.plugin_operation) and judges its outputs.
void run_plugin_operation_case(const Operation& operation, const GateCase& gate_case,
                               const GateSettings& settings, CaseOutcome& outcome);

// What built-in kernels of an operation share with plugins (ops/attention_merge's merge kernels):
// the operation's external cases in one format, made once per process and seed;
[[nodiscard]] std::shared_ptr<const std::vector<ExternalCase>> external_cases_of(
    const Operation& operation, const FloatFormat& format, const GateSettings& settings);
// the gate case of one (its id's input and n, the kernel's name), and back;
[[nodiscard]] GateCase external_gate_case(const ExternalCase& c, std::string kernel,
                                          const GateSettings& settings, bool broken,
                                          const FloatFormat* plugin_format);
[[nodiscard]] const ExternalCase& find_external_case(const std::vector<ExternalCase>& cases,
                                                     const GateCase& gate_case);
// and the judgement of outputs computed for it (values: c.outputs' elements, one after another),
// by the operation's own judge, into outcome.
void judge_external_outputs(const Operation& operation, const ExternalCase& c, const FloatFormat& format,
                            const std::vector<double>& values, const std::string& kernel,
                            CaseOutcome& outcome);

// and, for a batch-invariance case (c.reruns), the first call's outputs and each rerun's (null:
// it produced none) compared request by request and judged (gate/invariance.hpp).
void judge_external_invariance(const Operation& operation, const ExternalCase& c, const FloatFormat& format,
                               const std::vector<double>& first,
                               const std::vector<const std::vector<double>*>& reruns,
                               const std::string& kernel, CaseOutcome& outcome);

}  // namespace sharpcheck::gate
