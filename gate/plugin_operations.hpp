// A plugin's operations through the version-6 entry sharpcheck_op (kernels/plugin_abi.h): every
// case an operation hands a kernel outside the gate (Operation::external_cases, the cases
// sharpcheck.sweep runs too), in each format the plugin declares, run in a child and judged by the
// operation's own judge. Nothing here names an operation: a new operation with external cases
// that say their outputs can be computed by a plugin with no change here.
#pragma once

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

}  // namespace sharpcheck::gate
