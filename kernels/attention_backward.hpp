// Attention backward kernels under test (one head; scores, masks, soft-cap and sink as
// tensor/head_scores.hpp; no bias), fp32 arithmetic on inputs that are values of the kernel's
// format, gradients rounded to it once:
//   plain: a fresh fp32 forward materialises P (three-pass softmax per row), then
//          D_i = sum_j P_ij dP_ij, dS = P (dP - D + dLSE), dQ/dK/dV summed in fp32.
//   flash: FlashAttention 2's backward: the forward output O (rounded to the format) and the
//          log-sum-exp L (fp32) come from the flash forward; D_i = rowsum(dO_i * O_i) in fp32;
//          P recomputed per tile as exp(s - L); dV and dK per key tile, dQ accumulated in fp32; a
//          query whose L is -inf (it sees no key) is skipped.
// And deliberately broken twins of the flash kernel, each the bug class of a real port:
//   stale_d:            D summed over the first half of the head's columns only (a partial tile;
//                       flash-attention PR #2481: dQ and dK wrong, dV right);
//   dq_in_output:       dQ accumulated in the output format (bf16) instead of fp32;
//   no_softcap_grad:    the soft-cap's derivative 1 - tanh^2 left out;
//   nan_on_masked_rows: no guard for a query that sees no key (PyTorch #41508: NaN gradients).
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "kernels/tolerance.hpp"
#include "tensor/backward_problem.hpp"

namespace sharpcheck::kernels {

// The kernels compute one head (group 1); judges take grouped heads too.
using BackwardProblem = tensor::AttentionBackwardProblem;

struct KernelGradients {
  Matrix d_queries, d_keys, d_values;
  std::vector<double> d_sinks;  // one per head when there are sinks
  std::vector<double> d_rows;   // D_i as the kernel kept it (fp32), when it exposes D; else empty
};

enum class BackwardBug { none, stale_d, dq_in_output, no_softcap_grad, nan_on_masked_rows };

[[nodiscard]] KernelGradients attention_backward_plain(const BackwardProblem& problem,
                                                       const FloatFormat& format);
struct FlashBackwardOptions {
  BackwardBug bug = BackwardBug::none;
  // FlashAttention 2/3 on bf16/fp16: P rounded to this format before dV = P^T dO, and
  // dS = P (dP - D) before dQ = dS K and dK = dS^T Q (the products run on the tensor cores).
  // nullptr: both kept in fp32.
  const FloatFormat* intermediates = nullptr;
  std::size_t tile = 64;
};
[[nodiscard]] KernelGradients attention_backward_flash(const BackwardProblem& problem,
                                                       const FloatFormat& format,
                                                       const FlashBackwardOptions& options = {});
// PyTorch's math path in `format` (the same-precision reference its tests compare against): every
// matmul's result and the softmax rounded to the format, the softmax backward in fp32 from them.
[[nodiscard]] KernelGradients attention_backward_math_lowp(const BackwardProblem& problem,
                                                           const FloatFormat& format);

struct AttentionBackwardKernel {
  std::string_view name;
  std::string_view description;
  const FloatFormat* format;  // inputs and gradients
  bool deliberately_broken;
  KernelGradients (*run)(const BackwardProblem& problem);
  BackwardTolerance tolerance;  // the kernel's own entry; unused when `recipe` names one
  // The backward recipe (metrics/recipes.hpp) the kernel's design implies; empty: `tolerance`.
  std::string_view recipe = {};
};

[[nodiscard]] std::span<const AttentionBackwardKernel> attention_backward_kernels();
[[nodiscard]] const AttentionBackwardKernel* find_attention_backward_kernel(std::string_view name);

}  // namespace sharpcheck::kernels
