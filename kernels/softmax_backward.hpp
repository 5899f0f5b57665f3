// Softmax and log-softmax backward kernels under test, on rows: each recomputes y with the fp32
// three-pass softmax (softmax_safe3_fp32) from the logits, then
//   softmax:     dx_j = y_j (dy_j - sum_i y_i dy_i)
//   log-softmax: dx_j = dy_j - y_j sum_i dy_i
// with the sum in fp32 (the twin: in fp16, the accumulator of MIOpen PR #3427, whose error was
// 2.3e-4 against 2.2e-5 with fp32), outputs rounded to the kernel's format. A row whose logits are
// all -inf (fully masked) gets zeros (the twin: NaN, as PyTorch #41508).
#pragma once

#include <span>
#include <string_view>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "kernels/tolerance.hpp"

namespace sharpcheck::kernels {

struct SoftmaxBackwardKernel {
  std::string_view name;
  std::string_view description;
  const FloatFormat* format;  // logits, dy and dx
  bool log_softmax;
  bool deliberately_broken;
  // Rows of logits and of dy (values of `format`) -> rows of dx.
  void (*run)(const Matrix& logits, const Matrix& dy, Matrix& dx);
  Tolerance tolerance;  // relative to the magnitudes of metrics/judge_backward.hpp
};

[[nodiscard]] std::span<const SoftmaxBackwardKernel> softmax_backward_kernels();
[[nodiscard]] const SoftmaxBackwardKernel* find_softmax_backward_kernel(std::string_view name);

}  // namespace sharpcheck::kernels
