// The honest noise of the projected tests (the gradient-scale, row-scale and D-direction tests):
// project_errors (declared in metrics/inside_rounding.hpp) turns a ScaleNoise into the statistic's
// sub-Gaussian proxy and its in-full part, and the helpers below assemble the attention
// backward's ScaleNoise from its Magnitudes sums (metrics/judge_backward.cpp): how its fp32 dot
// products are charged, a recipe's score terms, the math path's exact coefficients, and the fp32
// errors split by what each scales.
#pragma once

#include <cstddef>

#include "kernels/attention_backward.hpp"
#include "kernels/tolerance.hpp"
#include "metrics/backward_magnitudes.hpp"
#include "metrics/inside_rounding.hpp"

namespace sharpcheck::metrics {

// How an entry charges the fp32 dot products (the logit's d_q products, dP's and D's d_v): by
// their worst case (the element tier), or by their roundings' Hoeffding root (the projected
// tests). A dot product of d terms rounds at most 2d times (d products, d - 1 additions), each by
// at most u sum_t |a_t b_t| (every partial sum is at most that), so as independent sources its
// error's sub-Gaussian proxy is sqrt(2d) u sum |a b|, where the worst case is d u sum |a b|. The
// projected tests add the pairs' and rows' errors by Hoeffding already (ScaleNoise's `pairs`,
// `rows`); charging each dot product as one source bounded by its worst case made the fp32 terms
// twice the bf16 roundings' at d = 256, and a 5% dQ scale passed. Where the math path's scores
// are emulated, the logit's dot product is the emulator's (its ambiguity is the slack, charged
// with the scores' terms): only the logit's other roundings remain.
enum class DotCharge { worst_case, hoeffding, hoeffding_scores_emulated };

// A d-term dot product's units under `charge` (d, or sqrt(2d) where smaller).
[[nodiscard]] double dot_units_of(double d, DotCharge charge);

// The entry every attention-backward gradient is judged by: the backward tolerance's units for this
// problem (its logits' and dot products' fp32 errors charged as `charge` says), and a recipe's
// roundings of P, dP and dS and of the scores (metrics/recipes.cpp).
[[nodiscard]] Tolerance gradient_entry(const kernels::BackwardTolerance& tolerance, const Magnitudes& m,
                                       const kernels::BackwardProblem& p,
                                       DotCharge charge = DotCharge::worst_case);

// What the split sums (with_split_pairs) are charged at: dP's dot product's relative error, the
// forward's and D's errors but the scores' (ScaleNoise::dot_relative, rest_relative), and whether
// D is formed from O.
struct SplitUnits {
  double pair_relative = 0, dot_relative = 0, rest_relative = 0;
  bool d_from_o = false;
};

// The split sums' units for a problem of `length` (its longer side) under `tolerance`, `m` its
// magnitudes: a pair's own P error is its logit's once (the entry's `logit` margin covers the
// forward's LSE and O as well, which the rows carry), with the exp's argument and dS's own
// roundings (ScaleNoise::pair_relative); dP's dot product by its roundings' Hoeffding root; the
// rest (the forward's sums and division, D's dot product) by the entry's length, worst-case
// dimension and constant units.
[[nodiscard]] SplitUnits split_units(const kernels::BackwardTolerance& tolerance, const Magnitudes& m,
                                     const kernels::BackwardProblem& p, std::size_t length);

// The scores' roundings (a recipe that rounds them), or their slack when emulated, in a projected
// test's noise: the projections' Hoeffding root, the second order, and the growth of the other
// roundings' coefficients.
[[nodiscard]] ScaleNoise with_score_terms(ScaleNoise n, const Magnitudes& m,
                                          const Magnitudes::ScaleScoreTerms& terms);

// The pairs' and rows' fp32 errors split by what they scale (Magnitudes::SplitPairs), where D is
// formed from O (an entry with output_units: FlashAttention's design, and autograd's, whose D from
// a P normalised by its own sum is centred alike) and the scores are the problem's own: a
// perturbation of the scores (a recipe's roundings, an emulation's slack) moves dS itself, which
// the split's |dS_ij| does not bound. Split, a D 10% off on a sharp head (|q k| of 8 sigma: the
// logits' fp32 worst case large against dS and D's centred share, which cancel) no longer hides in
// the noise of the D-direction test.
[[nodiscard]] ScaleNoise with_split_pairs(ScaleNoise n, const Magnitudes& m,
                                          const Magnitudes::SplitPairs& split, const SplitUnits& units);

// The math path's three roundings by their exact coefficients (backward_score_terms.cpp), where the
// recipe rounds P, dP and dS; other recipes keep the bounds' sums.
[[nodiscard]] ScaleNoise with_exact_terms(ScaleNoise n, const Tolerance& entry,
                                          const Magnitudes::ExactSums& sums);

}  // namespace sharpcheck::metrics
