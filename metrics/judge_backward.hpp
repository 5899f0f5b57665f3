// The verdict on an attention backward kernel: its dQ, dK, dV (and dsink, and D when exposed) against the
// correctly rounded gradients (reference/attention_backward.hpp), each element within its tolerance entry
// (kernels/tolerance.hpp's BackwardTolerance) relative to the element's magnitude, computed here.
#pragma once

#include <string>

#include "kernels/attention_backward.hpp"
#include "kernels/softmax_backward.hpp"
#include "metrics/comparison.hpp"
#include "reference/attention_backward.hpp"

namespace sharpcheck::metrics {

struct BackwardJudgement {
  reference::AttentionGradients expected;
  Comparison d_queries, d_keys, d_values;
  std::optional<Comparison> d_sink;
  std::optional<Comparison> d_rows;  // D_i = rowsum(dO * O), when the kernel exposes it
  // How a math-path recipe's projected tests took the scores, when they emulated them
  // ("scores = F(F(q k^T) * scale), the scale in fp32"); empty otherwise.
  std::string score_chain;

  [[nodiscard]] bool passed() const;
  // The gradient with the largest bound ratio and its worst element, e.g.
  // "dQ row 3 index 7: expected ... got ... (bound ratio 5.2)".
  [[nodiscard]] std::string describe_worst() const;
};

// InputError as the reference's for bad input; UndecidedRounding passed on. `expected`, when given,
// is the reference's result for this problem and format (computed once for several kernels).
[[nodiscard]] BackwardJudgement judge_attention_backward(
    const kernels::BackwardTolerance& tolerance, const FloatFormat& output,
    const kernels::BackwardProblem& problem, const kernels::KernelGradients& actual,
    const reference::AttentionGradients* expected = nullptr);

// A softmax or log-softmax backward kernel on rows of logits and dy (-inf logits are masked; a
// fully masked row's gradient is 0): dx against reference/softmax_backward.hpp's correctly rounded
// gradient, each element within the kernel's entry relative to M_j = y_j (|dy_j| + sum_i y_i |dy_i|)
// (softmax) or |dy_j| + y_j sum_i |dy_i| (log-softmax), n and the spread taken per row.
[[nodiscard]] Comparison judge_softmax_backward(const kernels::SoftmaxBackwardKernel& kernel,
                                                const Matrix& logits, const Matrix& dy, const Matrix& dx);
// The same for gradients computed elsewhere: the entry `tolerance`, the gradient in `format`.
[[nodiscard]] Comparison judge_softmax_backward(bool log_softmax, const Tolerance& tolerance,
                                                const FloatFormat& format, const Matrix& logits,
                                                const Matrix& dy, const Matrix& dx);

}  // namespace sharpcheck::metrics
