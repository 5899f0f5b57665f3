// Judging attention backward gradients computed elsewhere (a GPU kernel, PyTorch autograd): dQ,
// dK, dV (and the sinks' gradients, and D) of whole tensors in any layout of
// tensor/attention_problem.hpp (padded, packed, GQA, masks, bias, ALiBi, sinks), group by group, against the
// correctly rounded gradients (reference/attention_backward.hpp) under a backward tolerance entry
// (kernels/attention_backward_registry.cpp). The path shared by `compare --dout` and Python.
#pragma once

#include <vector>

#include "gate/judge_arrays.hpp"

namespace sharpcheck::gate {

// q, k, v, d_out (the gradient reaching the output) and the gradients judged, in the options'
// layout (2-D arrays are one head's matrices); d_lse, when given, is laid out as the log-sum-exp.
struct BackwardArrays {
  const Array* q = nullptr;
  const Array* k = nullptr;
  const Array* v = nullptr;
  const Array* d_out = nullptr;
  const Array* dq = nullptr;
  const Array* dk = nullptr;
  const Array* dv = nullptr;
  const Array* d_lse = nullptr;
  const Array* d = nullptr;     // the kernel's D = rowsum(dO * O) in fp32, laid out as the log-sum-exp
  std::vector<double> d_sinks;  // the kernel's gradients of the sinks, per head (judged when given)
  // The scores' per-head values and masks as the forward takes them: sinks, ALiBi slopes, an
  // explicit mask, an additive bias (its q, k, v, out and lse are not read).
  AttentionArrays scores;
};

struct BackwardGradients {
  std::vector<double> dq, dk, dv;  // laid out as q, k and v
  std::vector<double> d_sinks;     // per head, when there are sinks
};

// The correctly rounded gradients in `format` (dq, dk, dv and d_sinks of `arrays` are not read);
// padded queries and keys get 0. The sinks' gradients only for a batch of 1 (each sums over the
// batch, which is not rounded once): empty otherwise. InputError as judge_attention_arrays.
[[nodiscard]] BackwardGradients attention_backward_of_arrays(const JudgeOptions& options,
                                                             const BackwardArrays& arrays);

// Judges dq, dk and dv (and d_sinks, and D) group by group, padded positions not judged; the tolerance entry
// is options.tolerance_entry (default attention_backward_flash). The worst element is named by gradient and
// full index. Each group's reference is computed once, whatever the recipes tried; with `reference`,
// it is also written there, as attention_backward_of_arrays gives it (a caller that wants the
// gradients and the verdict computes them once).
[[nodiscard]] CaseOutcome judge_attention_backward_arrays(const JudgeOptions& options,
                                                          const BackwardArrays& arrays,
                                                          BackwardGradients* reference = nullptr);

}  // namespace sharpcheck::gate
