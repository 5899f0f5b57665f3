// Correctly rounded references for the operators proposed as ways out of softmax's dispersion:
// adaptive temperature, scalable softmax (SSMax), sigmoid attention, stick-breaking attention and
// length-scaled logits. Each takes one row of logits, like reference/softmax.hpp.
//
// Accuracy contract: every returned value is the exact real result of the definition below
// rounded to nearest-even in the target format (subnormals included), by Ziv's strategy on Arb
// balls at growing precision. Rational results are detected and rounded exactly. Termination is
// proven per operator in dispersion_escapes.cpp for SSMax, sigmoid and stick-breaking; for
// adaptive temperature (with beta > 1) and length-scaled logits (with an irrational factor) the
// argument is incomplete, so those loops are capped and throw UndecidedRounding rather than guess.
//
// Shared conventions: masked entries (logit -inf, or keep[j] == 0) get exactly 0 and take no part;
// z_j = e_j / theta over the unmasked entries; n is the number of unmasked entries unless `length`
// says otherwise (a causal row's visible keys, say). Bad input is an InputError as for softmax.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "formats/float_format.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::reference {

// Veličković et al. 2024, the paper's code: p = softmax(z); H = -sum_j p_j log(p_j + 1e-9);
// beta = max(poly(H), 1) if H > 0.5 else 1 with poly(H) = -0.037 H^4 + 0.481 H^3 - 2.3 H^2
// + 4.917 H - 1.791, every constant the exact decimal; result softmax(beta z).
[[nodiscard]] std::vector<double> adaptive_temperature_softmax(std::span<const double> logits,
                                                               const FloatFormat& target,
                                                               const RowOptions& options = {});

// Nakanishi 2025, SSMax: softmax(s log(n) e) with the per-head scalar s = 1 / theta.
[[nodiscard]] std::vector<double> scalable_softmax(std::span<const double> logits, const FloatFormat& target,
                                                   const RowOptions& options = {},
                                                   std::optional<std::uint64_t> length = std::nullopt);

// Ramapuram et al. 2024: a_j = sigmoid(z_j + b), each weight on its own (rows need not sum to 1),
// with b = -log n unless `bias` is given.
[[nodiscard]] std::vector<double> sigmoid_attention_weights(
    std::span<const double> logits, const FloatFormat& target, const RowOptions& options = {},
    std::optional<double> bias = std::nullopt, std::optional<std::uint64_t> length = std::nullopt);

// Tan et al. 2024: keys in order, the query just after the last one. beta_j = sigmoid(z_j) and
// A_j = beta_j prod_{k > j, unmasked} (1 - beta_k): the nearest key breaks the stick first.
// Rows sum to 1 - prod_j (1 - beta_j) < 1.
[[nodiscard]] std::vector<double> stick_breaking_weights(std::span<const double> logits,
                                                         const FloatFormat& target,
                                                         const RowOptions& options = {});

// Length-scaled logits as Qwen's "logn attention" (QWen-7B modeling_qwen.py, use_logn_attn:
// queries multiplied by log(n) / log(L) for n > L, L the training length): softmax(f z) with
// f = max(1, ln n / ln L). L must be at least 2.
[[nodiscard]] std::vector<double> length_scaled_softmax(std::span<const double> logits,
                                                        const FloatFormat& target,
                                                        std::uint64_t training_length,
                                                        const RowOptions& options = {},
                                                        std::optional<std::uint64_t> length = std::nullopt);

// The factor f = max(1, ln n / ln L) above, in double (for kernels and reports, not the reference).
[[nodiscard]] double length_scale_factor(std::uint64_t n, std::uint64_t training_length);

}  // namespace sharpcheck::reference
