#include "kernels/softmax_backward.hpp"

#include <cmath>
#include <vector>

#include "kernels/registry.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
namespace {

enum class Flaw { none, fp16_accumulator, nan_on_masked_rows };

template <bool Log, Flaw F>
void backward_rows(const Matrix& logits, const Matrix& dy, Matrix& dx, const FloatFormat& format) {
  dx = Matrix(logits.rows, logits.cols);
  std::vector<float> row(logits.cols), y(logits.cols);
  for (std::size_t r = 0; r < logits.rows; ++r) {
    bool all_masked = true;
    for (std::size_t j = 0; j < logits.cols; ++j) {
      row[j] = static_cast<float>(logits(r, j));
      all_masked = all_masked && row[j] == -INFINITY;
    }
    if (all_masked && F != Flaw::nan_on_masked_rows) continue;  // zeros
    softmax_safe3_fp32(row.data(), y.data(), logits.cols, 1.0F);
    if (all_masked) y.assign(logits.cols, NAN);  // what exp(-inf - (-inf)) gives an unguarded kernel
    float sum = 0.0F;
    for (std::size_t j = 0; j < logits.cols; ++j) {
      if (row[j] == -INFINITY && !all_masked) continue;
      const float term = Log ? static_cast<float>(dy(r, j)) : y[j] * static_cast<float>(dy(r, j));
      sum += term;
      if (F == Flaw::fp16_accumulator) sum = static_cast<float>(round_to_format(sum, fp16));
    }
    for (std::size_t j = 0; j < logits.cols; ++j) {
      if (row[j] == -INFINITY && !all_masked) continue;
      const auto g = static_cast<float>(dy(r, j));
      const float value = Log ? g - y[j] * sum : y[j] * (g - sum);
      dx(r, j) = round_to_format(value, format);
    }
  }
}

template <bool Log, Flaw F, const FloatFormat& Format>
void run(const Matrix& logits, const Matrix& dy, Matrix& dx) {
  backward_rows<Log, F>(logits, dy, dx, Format);
}

// Derivation: y_j errs by at most (3 |z_j| + 3 spread + n + 10) u (safe3's entry, registry.cpp),
// |z_j| <= spread after the shift, so by (6 spread + n + 10) u. softmax: s = sum_i y_i dy_i errs by
// (eps_y + n u) sum_i y_i |dy_i|; dx_j = y_j (dy_j - s) then by (eps_y + n u + 2u) times
// M_j = y_j (|dy_j| + sum_i y_i |dy_i|). log-softmax: S = sum_i dy_i errs by n u sum_i |dy_i|,
// dx_j = dy_j - y_j S by (eps_y + n u + 2u) times M_j = |dy_j| + y_j sum_i |dy_i|. So "spread 6,
// per_item 2, constant 16" (with margin); the output's rounding is charged relative to |expected|.
constexpr Tolerance backward_tolerance{
    .accumulation = &fp32,
    .spread = 6,
    .per_item = 2,
    .constant = 16,
    .basis = "analysis: safe3's y, an fp32 sum, one product and difference",
    .reason = "y from the three-pass softmax; the sum over the row in fp32"};

const SoftmaxBackwardKernel table[] = {
    {"softmax_backward", "fp32: y by safe3, dx = y (dy - sum y dy)", &fp32, false, false,
     run<false, Flaw::none, fp32>, backward_tolerance},
    {"softmax_backward_bf16", "bf16 in and out, the fp32 softmax backward inside", &bf16, false, false,
     run<false, Flaw::none, bf16>, backward_tolerance},
    {"softmax_backward_nan_masked", "broken: NaN on a fully masked row (PyTorch #41508)", &fp32, false, true,
     run<false, Flaw::nan_on_masked_rows, fp32>, backward_tolerance},
    {"log_softmax_backward", "fp32: y by safe3, dx = dy - y sum dy", &fp32, true, false,
     run<true, Flaw::none, fp32>, backward_tolerance},
    {"log_softmax_backward_bf16", "bf16 in and out, the fp32 log-softmax backward inside", &bf16, true, false,
     run<true, Flaw::none, bf16>, backward_tolerance},
    {"log_softmax_backward_fp16acc", "broken: sum dy accumulated in fp16 (MIOpen PR #3427)", &fp32, true,
     true, run<true, Flaw::fp16_accumulator, fp32>, backward_tolerance},
};

}  // namespace

std::span<const SoftmaxBackwardKernel> softmax_backward_kernels() { return table; }

const SoftmaxBackwardKernel* find_softmax_backward_kernel(std::string_view name) {
  return find_named(softmax_backward_kernels(), name);
}

}  // namespace sharpcheck::kernels
