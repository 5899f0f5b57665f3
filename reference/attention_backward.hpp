// The correctly rounded backward pass of one attention head: dQ, dK, dV, and the gradient of the
// sink logit, given dO and (optionally) the gradient reaching the log-sum-exp output.
//
// Definitions (scores, masks and modifiers as tensor/head_scores.hpp: raw r_ij = q_i . k_j,
// logit z_ij = (cap tanh(scale r_ij / cap) + b_ij) / theta, or (scale r_ij + b_ij) / theta without
// a cap; a sink is one more logit z_sink / theta with no value), L_i = ln(sum_j e^{z_ij} [+ e^{z_sink}]),
// P_ij = e^{z_ij - L_i}, O_i = sum_j P_ij v_j:
//   dP_ij = dO_i . v_j,   D_i = sum_j P_ij dP_ij (= dO_i . O_i),   g_i = dLSE_i (0 when not given)
//   dz_ij = P_ij (dP_ij - D_i + g_i),   dz_i,sink = P_i,sink (g_i - D_i)
//   dr_ij = dz_ij dz/dr = dz_ij scale (1 - tanh^2(scale r_ij / cap)) / theta   (scale / theta uncapped)
//   dQ_i = sum_j dr_ij k_j,  dK_j = sum_i dr_ij q_i,  dV_j = sum_i P_ij dO_i,  dsink = sum_i dz_i,sink /
//   theta.
// A query that sees no key and has no sink contributes nothing (its gradients are 0); so do padded
// queries and keys (past HeadScores::queries and ::keys). Grouped heads may each have their own
// bias, ALiBi slope, mask and sink (AttentionBackwardProblem::per_head); the bias is exact
// (additive - slope distance) and moves z but not dz/dr.
//
// Accuracy contract: every returned value is the exact real result rounded to nearest-even in the
// target format. For targets of at most 24 bits a certified double stage decides nearly every
// result first (reference/attention_backward_double.hpp: BLAS products with proven bounds); the
// rest are decided by Ziv's strategy on Arb balls (every operation's error enclosed) at doubling
// precision, a pass computing only what is still undecided (the dQ and D of some rows, the dK and
// dV of some keys, which need every row's log-sum-exp and D), capped (ZivSchedule) with UndecidedRounding
// naming the output past the cap. A result whose ball lies within half the format's least subnormal of 0
// rounds to zero: -0 where the ball (or the double stage's interval) lies below 0, +0 otherwise. So
// every -0 is claimed, and a +0 is claimed only where the enclosure lay at or above 0; a tiny
// negative result whose enclosure still held both signs when it was decided is +0 (the sign of
// such a zero is not claimed: finding it would need exact arithmetic on the row's double sums, as
// softmax_backward does for its one sum). Why the loop ends: a nonzero
// result is eventually separated from every rounding boundary unless it *is* a boundary, and an exact zero
// eventually lies inside the zero band. A boundary is rational; the results that are rational for a reason
// the exact stage knows (reference/attention_backward_exact.hpp: rows whose logits are all equal,
// so P = 1/(entries), and terms that vanish exactly, such as dP - D = 0) are computed in exact
// rationals once a pass leaves anything undecided, and rounded exactly, ties to even. The argument
// that no other result is a boundary is incomplete: terms of two rows can cancel into a rational
// sum, a row whose groups of equal logits have equal means has a rational D, and once a soft-cap's
// tanh enters the exponents are no longer algebraic. Such a result that is a boundary reaches the
// cap and the call refuses (UndecidedRounding) instead of guessing.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/exact_rounding.hpp"
#include "tensor/backward_problem.hpp"

namespace sharpcheck::reference {

using AttentionBackwardInputs = tensor::AttentionBackwardProblem;

struct AttentionGradients {
  Matrix d_queries, d_keys, d_values;
  std::vector<double> d_sinks;  // one per query head of the group, when there are sinks
  // D_i = sum_j P_ij dP_ij per query (0 for a query that sees no key), rounded to fp32 when the
  // target is narrower (as kernels keep it), else to the target: FlashAttention's rowsum(dO * O).
  std::vector<double> d_rows;
};

// The format D is rounded to: fp32 when the target is narrower (as kernels keep D), else the target.
[[nodiscard]] inline const FloatFormat& d_format(const FloatFormat& target) {
  return target.precision() < 24 ? fp32 : target;
}

// Which results a caller needs: D is skipped by callers that never read it (Python's reference
// returns the gradients only), so a D the loop cannot decide does not refuse the gradients; d_rows
// then holds NaN.
enum class RowsOfD { decided, not_needed };

// InputError for mismatched shapes, a non-finite entry (named), or a theta that is 0 or not finite.
[[nodiscard]] AttentionGradients attention_backward(const AttentionBackwardInputs& inputs,
                                                    const FloatFormat& target,
                                                    ZivStatistics* statistics = nullptr,
                                                    RowsOfD rows_of_d = RowsOfD::decided);

}  // namespace sharpcheck::reference
