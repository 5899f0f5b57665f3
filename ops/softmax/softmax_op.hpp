// softmax and log_softmax over rows (the softmax kernel registry's rows, a plugin's
// sharpcheck_softmax), and what the row escapes (ops/row_escapes/) share with them: planning the
// registry's kernels of one row operation over the row kinds and sizes, running such a case, and
// judging rows computed elsewhere along a dim.
#pragma once

#include <string_view>
#include <vector>

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation softmax_operation;
extern const gate::Operation log_softmax_operation;

// The row options: dim and theta.
[[nodiscard]] std::span<const gate::OptionSpec> row_options();
// The dim option alone (the softmax backward takes no theta).
[[nodiscard]] std::span<const gate::OptionSpec> dim_option();

// The softmax registry's kernels computing `operation`.
[[nodiscard]] std::vector<gate::KernelRow> row_kernels(kernels::Operation operation);
// Every wanted kernel of `operation` on every row kind at every size.
void plan_row_kernels(const gate::PlanContext& context, kernels::Operation operation,
                      std::vector<gate::GateCase>& cases);
// A built-in row kernel's case (one generated row), or a plugin's sharpcheck_softmax case.
void run_row_case(const gate::GateCase& gate_case, const gate::GateSettings& settings,
                  gate::CaseOutcome& outcome);
// The sweep's row cases for a kernel outside the gate (a plugin's row cases): every row kind at
// every size as `logits` [1, n], and scaled rows (option theta, needing "theta"). `judged` names
// the result a plugin's sharpcheck_op fills ([1, n]); empty: the operation has its own entry.
[[nodiscard]] std::vector<gate::ExternalCase> row_external_cases(std::string_view operation,
                                                                 const gate::ExternalSweep& sweep,
                                                                 std::string_view judged = {});
// Rows computed elsewhere: `logits` and the judged tensor `judged` along options' dim, under the
// tolerance named, else `default_entry`.
[[nodiscard]] gate::CaseOutcome judge_rows(const gate::OpCall& call, kernels::Operation operation,
                                           std::string_view judged, std::string_view default_entry,
                                           bool log_softmax = false);

}  // namespace sharpcheck::ops
