// Fast kernels for the dispersion escapes, judged by the gate against reference/dispersion_escapes.
//
// Each takes a row of logits and `scale` = 1/theta as the softmax kernels do; -inf entries are
// masked (weight 0) and n in the formulas is the number of unmasked entries. Arithmetic is fp32;
// the registry's bf16 variants widen, run them and round once (narrow_through_fp32). Their error
// contracts are entries of the tolerance table (metrics/tolerance_table.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sharpcheck::kernels {

// The training length L of the built-in length-scaled kernels: the paper's 16-item training sets.
inline constexpr std::uint64_t length_scaled_training_length = 16;

// SSMax: softmax(s ln(n) e) with s = scale; safe3 at scale * ln n.
void scalable_softmax_fp32(const float* logits, float* out, std::size_t n, float scale);
// Qwen's logn attention: softmax(f scale e), f = max(1, ln n / ln L), L = 16.
void length_scaled_softmax_fp32(const float* logits, float* out, std::size_t n, float scale);
// Sigmoid attention weights sigmoid(scale e - ln n), in the form that neither overflows nor
// loses subnormal results: exp(x) / (1 + exp(x)) for x < 0.
void sigmoid_attention_fp32(const float* logits, float* out, std::size_t n, float scale);
// Stick-breaking weights in log space: from the nearest key back, log A_j = -softplus(-z_j) minus
// the running sum of softplus(z_k) over later keys; one exp per weight.
void stick_breaking_fp32(const float* logits, float* out, std::size_t n, float scale);

}  // namespace sharpcheck::kernels
