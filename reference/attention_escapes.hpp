// Correctly rounded references for the escapes from dispersion that act on whole attention
// matrices rather than one row of logits (issue 19): linear attention, selective attention and the
// Differential Transformer's attention. Row-level escapes are in reference/dispersion_escapes.hpp.
//
// Accuracy contract: every returned value is the exact real result of the definition below rounded
// to nearest-even in the target format, by Ziv's strategy on Arb balls at doubling precision.
// Termination, for all three: every result is a ratio N / D of sums of exponentials with rational
// exponents and coefficients (the inputs are doubles, so rational; D > 0). Such a ratio is rational
// only when N's grouped coefficients are proportional to D's (Lindemann-Weierstrass, see
// reference/exponential_polynomial.hpp), and that is checked exactly, with GMP, for every result a
// first pass leaves undecided: a rational result (an exact 0, a tie, 1/k) is rounded exactly, and
// an irrational one is no rounding boundary, so the loop ends. The one gap: Differential's check
// costs (keys)^2 terms and is skipped past 2,048 x 2,048 unmasked pairs; such a result, if it were
// rational, would reach the cap and be refused (UndecidedRounding), never guessed.
#pragma once

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {

// Katharopoulos et al. 2020 with phi(x) = elu(x) + 1 (x + 1 for x > 0, e^x otherwise), per entry:
//   s_ij = phi(q_i) . phi(k_j) > 0,  A_ij = s_ij / sum_l s_il,  O_i = sum_j A_ij v_j,
// j over every key, or j <= i when causal. No exponential normalisation: the weights are ratios of
// feature-map similarities. Masked weights are exactly 0.
struct LinearAttention {
  Matrix weights;  // m x n
  Matrix outputs;  // m x dv
};
[[nodiscard]] LinearAttention linear_attention(const Matrix& queries, const Matrix& keys,
                                               const Matrix& values, bool causal, const FloatFormat& target,
                                               ZivStatistics* statistics = nullptr);

// Leviathan et al. 2024 (arXiv 2410.02703), one causal head of n tokens: the selection
// S'_kj = ReLU(selection_kj) for 1 <= j < k (the first token and the diagonal are never masked;
// entries above the diagonal are causal-masked), shifted so token k masks j from k + 1 on:
//   F_ij = sum_{k < i} S'_kj,   W_i = softmax_{j <= i, logits_ij finite}(logits_ij - F_ij).
// `selection` is head 0's logits (pass `logits` itself for head 0); -inf entries select nothing.
[[nodiscard]] Matrix selective_attention_weights(const Matrix& logits, const Matrix& selection,
                                                 const FloatFormat& target,
                                                 ZivStatistics* statistics = nullptr);

// Ye et al. 2024 (arXiv 2410.05258), per row: w = softmax(z1) - lambda softmax(z2), -inf entries
// masked in their softmax. The weights can be negative and sum to 1 - lambda; the head's later
// normalisation and (1 - lambda_init) scale are not part of this. Every row needs a finite entry
// in both.
[[nodiscard]] Matrix differential_attention_weights(const Matrix& logits1, const Matrix& logits2,
                                                    double lambda, const FloatFormat& target,
                                                    ZivStatistics* statistics = nullptr);

// lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init with lambda_init =
// 0.8 - 0.6 exp(-0.3 (layer - 1)), layer from 1 (the paper's schedule), in double.
[[nodiscard]] double differential_lambda_init(int layer);

}  // namespace sharpcheck::reference
