// Planning a sweep: every operation's cases in a fixed order (gate/operation.hpp), then the
// shard's share.
#include <algorithm>

#include "core/errors.hpp"
#include "gate/case_tools.hpp"
#include "gate/cases.hpp"
#include "gate/operation.hpp"
#include "gate/plugin_operations.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::gate {

std::vector<std::size_t> sweep_sizes(const GateSettings& settings) {
  std::vector<std::size_t> sizes;
  for (const std::size_t n : settings.sizes) {
    if (n == 0)
      throw InputError(InputProblem::out_of_range, "gate: --sizes: a row needs at least 1 element, got 0");
    if (std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);  // repeats folded
  }
  if (sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) sizes.push_back(n);
  }
  return sizes;
}

namespace {

void check_kernel_names(const GateSettings& settings) {
  for (const auto& name : settings.kernels) {
    if (name == "all" || name == "none") continue;
    const bool known =
        std::any_of(settings.operations.begin(), settings.operations.end(), [&](const Operation* op) {
          const auto rows = op->kernels();
          return std::any_of(rows.begin(), rows.end(),
                             [&](const KernelRow& row) { return row.name == name; });
        });
    if (!known)
      throw InputError(InputProblem::out_of_range,
                       "gate: no built-in kernel named '" + name + "' (sharpcheck gate --list shows them)");
  }
}

// Every case of the unsharded sweep, in sweep order: each operation's built-in cases in the
// registry's order, then (a plugin given) each operation's plugin cases. Each case carries the
// name of the operation that runs it.
std::vector<GateCase> all_cases(const GateSettings& settings, const std::vector<std::size_t>& sizes) {
  const PlanContext context{settings, sizes};
  std::vector<GateCase> cases;
  const auto plan = [&](const Operation& operation, auto planner) {
    if (planner == nullptr) return;
    const std::size_t first = cases.size();
    planner(context, cases);
    for (std::size_t i = first; i < cases.size(); ++i) cases[i].operation = std::string(operation.name);
  };
  for (const Operation* operation : settings.operations) plan(*operation, operation->plan_builtin);
  if (!settings.plugin) return cases;
  for (const Operation* operation : settings.operations) plan(*operation, operation->plan_plugin);
  plan_plugin_operations(context, cases);
  return cases;
}

}  // namespace

std::string GateCase::id() const {
  std::string modifiers;
  if (softmax_scale != 1) modifiers += "/scale=" + std::string(softmax_scale < 1 ? "0.25" : "4");
  if (attention_theta != 1) modifiers += "/theta=2";
  if (causal) modifiers += "/causal";
  return kernel + "/" + input + modifiers + "/n=" + std::to_string(n);
}

std::vector<GateCase> plan_cases(const GateSettings& settings) {
  check_kernel_names(settings);
  (void)metrics::tolerance_for(settings.plugin_attention_model);  // an unknown model is an input error now
  std::vector<GateCase> cases = all_cases(settings, sweep_sizes(settings));
  std::vector<GateCase> selected;
  for (std::size_t index = 0; index < cases.size(); ++index) {
    GateCase& gate_case = cases[index];
    gate_case.seed = case_seed(settings.seed, gate_case.id());
    gate_case.index = index;
    if (!settings.only_case.empty() && gate_case.id() != settings.only_case) continue;
    if (index % settings.shard_count != settings.shard_index) continue;
    selected.push_back(gate_case);
  }
  if (!settings.only_case.empty() && selected.empty()) {
    throw InputError(InputProblem::out_of_range,
                     "gate: no case with id '" + settings.only_case + "' in this sweep");
  }
  if (selected.empty()) {
    throw InputError(InputProblem::empty_input,
                     cases.empty()
                         ? "gate: the sweep has no cases (no kernel selected, or a plugin without formats)"
                         : "gate: shard " + std::to_string(settings.shard_index) + "/" +
                               std::to_string(settings.shard_count) + " of " + std::to_string(cases.size()) +
                               " cases is empty");
  }
  return selected;
}

}  // namespace sharpcheck::gate
