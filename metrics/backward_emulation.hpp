// PyTorch's math path, emulated for the attention backward (internal to metrics/judge_backward.cpp).
// Autograd differentiates through the very scores the math path rounded (score_emulation.hpp's
// chains): dS is that of the softmax of those scores, and the gradients flow through the operands
// as the kernel multiplied them. So a math-path recipe's statistical tier can be centred on the
// gradients of the emulated scores instead of charging the scores' roundings as noise (about
// 2 u_S |z| each, as much as a D 10% off moves dQ along D's direction).
//
// How: a problem whose gradients are the kernel's up to its own roundings. Its operands are the
// kernel's (Q~, K~) and its scale s' such that s' sum_j dS_ij K~_j is what autograd forms for dQ
// (before its last roundings) and s' sum_i dS_ij Q~_i for dK:
//   (q @ k^T) * f, (q @ k^T) / F(1/f), baddbmm(alpha f):  Q~ = q, K~ = k, s' = f
//   (q * f) @ k^T:                                      Q~ = F(q f), K~ = f k, s' = 1
//   (q * r) @ (k * r)^T (SDPA's math):                   Q~ = F(q r), K~ = F(k r), s' = r
// (f, r the factor as the kernel holds it, in fp32: k's products with it are exact in double), and
// an additive bias that makes its logits the emulated scores: bias = z~ - s' Q~.K~ in double, off
// by at most 2^-52 (|z~| + |s' Q~.K~|) + s' (d + 1) 2^-53 sum |Q~ K~|, which joins each score's
// slack (the emulator's ambiguity, the fp32 summation order's reach).
//
// A soft-cap c tanh(x / c) (score_emulation.hpp's CapChain) makes the emulated scores capped ones,
// and autograd multiplies dS by the cap's slope 1 - t^2 at the t the kernel holds (F's value when
// each step rounds to F): the problem keeps the capped scores as its logits (no cap), and the centre's
// dQ and dK are formed with the kernel's slopes (apply_cap_slopes), which the magnitudes read too.
//
// What the centre leaves to charge: the recipe's roundings of P, dP and dS (dS twice where autograd
// multiplies it by an inexact f; a cap's backward up to three times more), the gradients' extra roundings
// where autograd rounds dQ or dK before multiplying by an inexact factor (`extra_dq`, `extra_dk`: one
// relative u each), a kernel whose operand elements may differ from Q~, K~ (their deviations: each moves
// dK_jc by s' dS_ij delta_ic, dQ_ic by s' dS_ij delta_jc, added to the radii in full), and a factor held as
// a quotient or in fp32 (2^-23 relative, in full).
#pragma once

#include <string>
#include <vector>

#include "core/matrix.hpp"
#include "kernels/attention_backward.hpp"
#include "metrics/backward_magnitudes.hpp"
#include "metrics/score_emulation.hpp"
#include "reference/attention_backward.hpp"

namespace sharpcheck::metrics {

struct EmulatedBackward {
  EmulatedBackward() = default;
  EmulatedBackward(const EmulatedBackward&) = delete;  // `heads` hold spans into `biases`
  EmulatedBackward& operator=(const EmulatedBackward&) = delete;
  Matrix queries, keys;                     // Q~ (stacked as the problem's) and K~
  Matrix query_deviation, key_deviation;    // how far an honest kernel's operands may be from them
  std::vector<std::vector<double>> biases;  // per head, positions x keys
  std::vector<tensor::HeadScores> heads;    // with those biases and the scale s', and no soft-cap
  // A soft-cap's slope is in slack.slopes (the magnitudes read it); how far an honest kernel's may
  // be from it, per head (positions x keys; empty without a cap).
  std::vector<std::vector<double>> slope_deviation;
  EmulatedScoreSlack slack;
  double extra_dq = 0, extra_dk = 0;  // extra relative roundings of each element
  double relative_in_full = 0;
  std::string description;  // "scores = F(F(q k^T) * scale), the scale in fp32"

  // The problem whose logits are the emulated scores (valid while this object lives, unmoved).
  [[nodiscard]] tensor::AttentionBackwardProblem problem(const kernels::BackwardProblem& p) const;
};

// Whether every head scores as the math path does (no sink, temperature or LSE gradient;
// score_emulation.hpp's scores_emulable: a bias, ALiBi and a soft-cap are emulated), with one scale
// and one cap, and the problem is small enough to hold its scores twice.
[[nodiscard]] bool backward_emulable(const kernels::BackwardProblem& p);

// The emulation of one variant (chain, cap and way of holding the factor) into `out`
// (default-constructed); false when the variant is not distinct from the fp32 one or a score cannot
// be emulated.
// `fp32_slope`: a cap of each step in F whose slope is the fp32 tanh's
// (ScoreEmulator::take_slope_from_fp32_tanh).
bool emulate_backward(const kernels::BackwardProblem& p, const ScoreVariant& variant,
                      const FloatFormat& format, bool fp32_slope, EmulatedBackward& out);

// A soft-capped emulation (no-op without a cap): the double stage's dQ and dK (of the problem's
// logits, slope s') replaced by s' sum_j dS_ij t'_ij K~_j and s' sum_i dS_ij t'_ij Q~_i, t' the
// kernel's cap slope, formed in double from the stage's D (its radius carried), and the radii of
// what the centre cannot know: the slope an ambiguous score's kernel may take (its deviation,
// times exp(4 eps) P_ij (|dP_ij| + A_i), eps the row's largest slack: the kernel's |dS_ij| at most,
// in full) and the cap's fp32 steps (five relative 2^-24s of each |dS_ij| t'_ij: the products by c
// and the slope, the quotient, the slope's own rounding; and 1 - t t's, 2^-24 t^2 absolute).
void apply_cap_slopes(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                      reference::AttentionGradients& centre, reference::AttentionGradients& radii);

// dQ's worst-case first order of the emulation's slack (Magnitudes::dq_slack_worst) with its part
// through the row's mean slack, |dQ_ic| slack_mean_i, |dQ_ic| at most the centre's value plus radius.
[[nodiscard]] Matrix worst_dq_slack(const Magnitudes& m, const reference::AttentionGradients& centre,
                                    const reference::AttentionGradients& radii);
// The slack's first-order charge, over lambda (comparison.cpp's inside_charge multiplies it back):
// Hoeffding's root, or the same perturbations' worst case where that is smaller.
[[nodiscard]] Matrix first_order_slack(const Matrix& root, const Matrix& worst);
// Two bounds of one charge: the smaller, element by element.
[[nodiscard]] Matrix smaller(const Matrix& a, const Matrix& b);

// What the operands' deviations move the gradients by, in full, added to `radii` (the double
// stage's) given the centre's gradients (its D).
void add_deviation_radii(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                         const reference::AttentionGradients& centre, reference::AttentionGradients& radii);

}  // namespace sharpcheck::metrics
