// Built-in merge kernels for the gate: the combine step of split-KV decoding as serving kernels
// write it (vLLM's merge_attn_states, FlashInfer's merge_state: the largest partial LSE m, weights
// exp(lse_i - m) in fp32, o = sum w_i o_i / sum w_i, lse = m + log(sum w_i), an empty partial
// skipped and a token with none giving o = 0), and twins carrying the merge bugs serving kernels
// shipped. They run on the merge's external cases (ops/attention_merge/merge_cases.cpp), the cases
// a plugin or a Python kernel gets, and are judged by the operation's own judge.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"
#include "gate/operation.hpp"

namespace sharpcheck::ops::merge {

enum class Bug {
  none,
  nan_when_all_empty,  // no guard for a token whose partials are all empty: exp(-inf - -inf) = NaN
  max_for_lse,         // the merged LSE is the largest partial LSE, not their logsumexp
  wrong_lse_slot,      // head h's weights read from head h + 1's LSE (a stride mismatch)
  fixed_max,           // exp(lse_i) without subtracting the largest: overflows at large LSEs
  lse_in_bf16,         // the merged LSE stored in the output's dtype (bf16), not fp32
  sum_in_bf16,         // the weights' sum accumulated in bf16 (every output and the LSE off by ~0.2%)
};

struct Kernel {
  std::string_view name, description;
  Bug bug = Bug::none;
  bool deliberately_broken = false;
  const FloatFormat* format = &bf16;  // its outputs' (the arithmetic is fp32)
};
[[nodiscard]] std::span<const Kernel> kernels();
[[nodiscard]] const Kernel* find_kernel(std::string_view name);

// The case's outputs (c.outputs' elements one after another: out in `format`, lse in fp32).
[[nodiscard]] std::vector<double> run(const Kernel& kernel, const gate::ExternalCase& c,
                                      const FloatFormat& format);

// The gate's side (attention_merge's record): the kernels' rows, every kernel on every bf16 merge
// case (ids merge_splits_2 ... merge_large_lse), and one case run and judged.
[[nodiscard]] std::vector<gate::KernelRow> kernel_rows();
void plan_builtin(const gate::PlanContext& context, std::vector<gate::GateCase>& cases);
void run_case(const gate::GateCase& gate_case, const gate::GateSettings& settings,
              gate::CaseOutcome& outcome);

}  // namespace sharpcheck::ops::merge
