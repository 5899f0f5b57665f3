// What a recipe's roundings inside an attention kernel can do to each row of its output, for the
// row's own exact weights, scores and values: the statistical charges of P's and the scores'
// roundings (Hoeffding, metrics/recipes.cpp) and the row-scale test. Internal to metrics/
// (evaluate.cpp's judge_attention reads it).
#pragma once

#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "metrics/comparison.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::metrics {

// The visible keys' exact weights p_j (in double) and |z_j| = |s_j / theta|, their scores' sizes.
// Optionally (empty: not known), each score's rounding bound in the units the tolerance's
// dot_product term multiplies (evaluate.cpp's logit roundings): the row-scale test then charges the
// scores' fp32 errors by Hoeffding over the keys instead of in full in every column.
struct VisibleWeights {
  std::vector<double> p, z, dot;
};

// What the recipe's roundings inside the kernel can do to one row, for this row's exact weights
// p_j (in double, relative error below (n + 10) 2^-53), scores z_j and values (derivations in
// metrics/recipes.cpp). P's roundings d_j (|d_j| <= u_P) move o_c by sum_j d_j p_j v_jc, or with
// a row sum of the rounded P by sum_j d_j p_j (v_jc - o_c): spread sqrt(sum_j p_j^2 v_jc^2), resp.
// with v_jc - o_c, the larger taken. The scores' roundings e_j (|e_j| <= eps_j = 2.0001 u_S |z_j|)
// move o_c to sum_j p_j w_j v_jc / W, w_j = exp(e_j), W = sum_j p_j w_j >= exp(-eps): the change
// is (sum_j p_j e_j (v_jc - o_c) + sum_j p_j r_j (v_jc - o_c)) / W with |r_j| <= rho_j =
// expm1(eps_j) - eps_j: a Hoeffding part of spread sqrt(sum_j p_j^2 z_j^2 (v_jc - o_c)^2) (times
// 2.0001 u_S) and a second-order part at most sum_j p_j rho_j (|v_jc| + |o_c|), both over W.
struct RowRounding {
  std::vector<double> exact;     // o_c = sum_j p_j v_jc, in double
  std::vector<double> p_spread;  // per column, P's rounding
  std::vector<double> s_spread;  // per column, the scores' rounding (first order)
  std::vector<double> s_second;  // per column, the scores' rounding (second order)
  // The same for the row-scale statistic (judge_row_scale) and for the log-sum-exp, L moving by
  // ln W (spread sqrt(sum_j p_j^2 z_j^2), second order sum_j p_j rho_j) or, with a row sum of the
  // rounded P, by ln(1 + sum_j d_j p_j) (spread sqrt(sum_j p_j^2)).
  double scale_p_spread = 0, scale_s_spread = 0, scale_s_second = 0;
  double lse_p_spread = 0, lse_s_spread = 0, lse_s_second = 0;
  // How many of the head's rows are this row's copies, itself included (the same query where the
  // scores do not depend on the position): they round alike (HeadScale).
  double copies = 1;
  // The scores' fp32 errors e_j (|e_j| <= dot_product u L_j, L_j = VisibleWeights::dot) projected
  // as the scores' roundings are: spread sqrt(sum_j p_j^2 L_j^2 (sum_c s_c (v_jc - o_c))^2); negative
  // where the logit roundings are not known (they are then charged in full).
  double scale_dot_spread = -1;
  // Computed for emulated scores' weights (metrics/score_emulation.hpp): `exact` is then the
  // centre o~, the scores' spreads are 0 and their second order is what the emulation leaves open.
  bool emulated = false;
};

// rho_j / p_j = expm1(eps_j) - eps_j, eps_j = 2.0001 u_s |z_j|: what a score's rounding does to its
// exponential beyond first order (above).
[[nodiscard]] double second_order(double z, double u_s);

// The row's exact output o_c (in double) and the spreads above, u_s the scores' unit roundoff (0:
// the recipe keeps them in fp32).
[[nodiscard]] RowRounding row_rounding(const Matrix& values, std::span<const std::size_t> visible,
                                       const VisibleWeights& w, double u_s);

// An emulated row (metrics/score_emulation.hpp): the kernel's own weights p~ (from its emulated
// scores), so `exact` is the centre o~ and the P spreads are p~'s, and in place of the scores'
// roundings what the emulation leaves open: score j may move by Delta_j, |Delta_j| <= a_j (0 for
// all but the scores near a rounding tie), moving o~_c by sum_j p~_j (e^Delta_j - 1) (v_jc - o~_c)
// / W, W >= exp(-max a). Its first order sum_j p~_j Delta_j (v_jc - o~_c) is charged by Hoeffding
// as the statistical tier charges every rounding (which side of its tie a score lands on is set by
// the dot product's low bits, unrelated to p and v; keys of equal weight and ambiguity as one),
// spread sqrt(sum_G (sum_G p~ a (v_c - o~_c))^2) in `s_spread` (already in the scores' units, and
// over W); the second order sum_j p~_j (expm1(a_j) - a_j) (|v_jc| + |o~_c|) over W and the double
// arithmetic's own error, (n + 10) 2^-50 (M~_c + |o~_c|), in full in `s_second`. The sink (no
// value) moves every o~_c the same way with v = 0. The row-scale fields likewise, projected on
// the signs of o~.
struct EmulatedSink {
  double weight = 0, ambiguity = 0;
};
// Emulated scores' weights p~ over the first `keys` of z (the visible keys; a sink, last in z,
// takes its share of the denominator and its weight is returned).
double emulated_weights(std::span<const double> z, std::size_t keys, VisibleWeights& weights);
[[nodiscard]] RowRounding emulated_rounding(const Matrix& values, std::span<const std::size_t> visible,
                                            const VisibleWeights& w, std::span<const double> ambiguity,
                                            EmulatedSink sink, std::span<const double> magnitudes);

// The unit roundoffs a tolerance's inside roundings are charged in (0 where it has none).
struct InsideUnits {
  double p = 0, s = 0;
};
[[nodiscard]] InsideUnits inside_units(const Tolerance& tolerance, const FloatFormat& output);

// One row's scale statistic, as the head-scale tests pool it: its signed deviation
// sum_c s_c (y_c - o_c) and weight sum_c |o_c|, the Hoeffding variance proxy of its independent
// roundings (`noise_sq`: the deviation's noise part N satisfies E exp(t N) <= exp(t^2 noise_sq / 2))
// and what is charged in full (`in_full`: |deviation - N| <= in_full).
struct RowScaleStat {
  double deviation = 0, weight = 0, noise_sq = 0, in_full = 0;
};

// The row-scale test of row `row` of `actual` (derivation in inside_rounding.cpp); a failure is
// recorded in `comparison` as a statistical-tier finding. Returns the row's statistic.
RowScaleStat judge_row_scale(const Matrix& actual, std::size_t row, const RowRounding& rounding,
                             std::span<const double> magnitudes, const Tolerance& tolerance,
                             const RowScale& scale, const FloatFormat& output, Comparison& comparison);

// judge_row_scale for every row of a head (`roundings[i]` row i's; with emulated_only, the rows
// whose rounding is emulated alone), then the head-scale tests on them.
void judge_head_scales(const Matrix& actual, std::span<const RowRounding> roundings, const Matrix& magnitudes,
                       const Tolerance& tolerance, std::span<const RowScale> scales,
                       const FloatFormat& output, bool emulated_only, Comparison& comparison);

// The head-scale tests (statistical tier): one head's rows pooled, which sees what no row alone
// does. A head whose output is scaled by 0.5%, or whose rows are each mis-normalised by a few
// tenths of a percent at random (a row sum kept in bf16), stays inside every row's allowance,
// because a row's allowance is its d roundings' noise; pooled over m rows the noise averages out.
// Two tests (derivations in inside_rounding.cpp): the pooled scale, sum_r deviation_r / sum_r
// weight_r, against the rows' noise together; and the spread, sum_r (max(|deviation_r| -
// in_full_r, 0))^2 / noise_sq_r, against what m independent sub-Gaussian rows can reach.
// A row with copies (the same query in a head whose scores do not depend on the position) rounds
// as they do: its noise is theirs, not independent of it. add() takes how many copies the row has:
// the pooled noise sums (copies sigma)^2 over the distinct rows (copies sigma^2 over every row),
// and the spread test counts each distinct row once (1 / copies per row).
class HeadScale {
 public:
  void add(const RowScaleStat& row, double copies = 1);
  void judge(Comparison& comparison) const;

 private:
  double deviation_ = 0, weight_ = 0, noise_sq_ = 0, in_full_ = 0;
  double spread_ = 0, relative_sq_ = 0, allowed_sq_ = 0;  // the spread test's sums
  double noisy_rows_ = 0;                                 // distinct rows with noise
  std::size_t rows_ = 0;
};

// Row `row`'s spreads into the matrices compare() reads.
void store_spreads(const RowRounding& rounding, std::size_t row, InsideSpreads& spreads);

// The gradient-scale test (statistical tier), the backward's row-scale test: over one gradient of
// a group, T = sum s_e (y_e - e_e) / sum |e_e| (s_e the sign of the correctly rounded e_e). Honest
// kernels' T is a weighted sum of independent roundings: the kernel's and the reference's output
// roundings (u_out |y|, u_out |e|), the recipe's k intermediate roundings of each (i, j) pair and
// D's error in each row (projected on the signs in magnitudes_of), bounded together by
// Hoeffding's inequality at lambda; plus every element's other terms (its statistical allowance
// without the intermediates' and D's charges) in full. A kernel that scales a gradient (dQ scaled
// at batch >= 2, a softmax scale applied twice) moves T by the scale, over sqrt(elements) more
// than any one element shows it.
// The fp32 arithmetic's own errors are charged the same way, by Hoeffding over their independent
// sources (each bounded by the entry's units times its magnitude): one per (i, j) pair, one shared
// by each query row (L_i, D_i), one per element (its accumulation); only what every element shares
// (the roundings of the scale, theta and the cap: (2 max|z| + 4) u) and a recipe's score roundings
// are charged in full. (Charged in full, the fp32 worst case hid a 1% dQ scale at 200 keys.)
struct ScaleNoise {
  double inside = 0;  // sum of squares of the intermediate roundings' projections (over u_i^2)
  // Their worst case, sum of |projection| (over u_i), charged in full in place of lambda times the
  // root where that is smaller (project_errors); negative: not formed.
  double inside_linear = -1;
  double from_d = 0;    // the same for D's errors (over u_o^2)
  double absolute = 0;  // the subnormal roundings' worst case over all elements (charged in full)
  double pairs = 0;     // the fp32 errors' sums of squares, per pair and per query row
  double rows = 0;      // (Magnitudes::dq_scale_pairs, dq_scale_rows, ...), over (units u)^2
  // The pairs and rows split by what each error scales (Magnitudes::SplitPairs; pairs_ds negative:
  // not split): each pair's error is then at most pair_relative |dS_ij| + dot_relative P_ij |dO| |v|
  // dz/dr + relative (relative mag_ij + u_o P_ij B_i dz/dr), each row's relative (its centred share)
  // + (rest_relative + relative^2) |B_on| A_i; the sums' roots added, where smaller.
  double pairs_ds = -1, pairs_dp = 0, pairs_from_d = 0, pair_relative = 0, dot_relative = 0;
  double rows_centred = 0, rows_rest = 0, rest_relative = 0;
  // A recipe's score roundings (Magnitudes::ScaleScoreTerms): the first order's Hoeffding spread
  // (absolute: its sum of squares' root), the second order (in full), the growth they cause in the
  // other roundings' coefficients (a factor on the intermediate and fp32 spreads, and dS's rounding's
  // own, absolute, over u_i); a negative `scores`: not known, their worst case is charged in full.
  double scores = -1;
  double scores_second = 0;
  double growth = 1;
  double inside_growth = 0;
  // The math path's roundings with exact coefficients (Magnitudes::ExactSums): their sum of
  // squares over u_i^2 (negative: not known; `inside`'s bounds are charged) and their products'
  // bound sum mag |on|, charged in full at 6 (1 + u_i) u_i^2.
  double inside_exact = -1;
  double inside_cross = 0;
  // A systematic relative error of every element, charged in full times the statistic's weight
  // (sum |w_x e_x|): a kernel's scale factor that may differ from the judged one by this much.
  double relative_in_full = 0;
  // Each element's extra roundings' u^2, summed (a gradient autograd rounds again): Hoeffding's.
  double element_roundings = 0;
};

// One gradient as the scale test reads it: its name in findings, the reference, the kernel's, each
// element's magnitude, and the noise its scale may show.
struct GradientScaleInput {
  const char* name;
  const Matrix& expected;
  const Matrix& actual;
  const Matrix& magnitudes;
  ScaleNoise noise;
  const Matrix* accumulated = nullptr;  // ProjectedInput::accumulated (nullptr: none)
  // Elements [first, first + count) only (one query head of a GQA group's dQ), named `name` as
  // given; count 0: every element, "<name> as a whole".
  std::size_t first = 0, count = 0;
};

void judge_gradient_scale(const GradientScaleInput& gradient, const Tolerance& entry, double u_o,
                          const FloatFormat& output, const RowScale& scale, Comparison& comparison);

// The statistic both the gradient-scale test and the D-direction test read: the errors projected
// on weights w_x, T = sum_x w_x (y_x - e_x) (the gradient-scale test: w = the signs of e), and
// the noise an honest kernel's roundings give it (ScaleNoise's sums, taken for the same w, plus
// the elements' own output roundings |w_x| u_out |y_x|, |w_x| u_out |e_x| and fp32 errors).
struct ProjectedInput {
  std::span<const double> expected, actual, magnitudes;
  std::span<const double> weights;  // empty: the signs of `expected`
  ScaleNoise noise;
  // What each element's own fp32 accumulation sums (Magnitudes::dq_accumulated), charged at the
  // entry's per-item units alone; empty: the magnitudes, at all the entry's units.
  std::span<const double> accumulated = {};
};
struct ProjectedStat {
  double deviation = 0;  // T
  double weight = 0;     // sum_x |w_x e_x|, what a relative scale is relative to
  double noise = 0;      // the sub-Gaussian proxy's root: |T - in_full part| <= lambda noise at the tier
  double in_full = 0;    // charged in full
};
[[nodiscard]] ProjectedStat project_errors(const ProjectedInput& in, const Tolerance& entry, double u_o,
                                           const FloatFormat& output, const RowScale& scale);

// The spread test's threshold a for m independent rows (HeadScale): m/2 (a - 1 - ln a) =
// lambda^2 / 2, so sum_r Y_r^2 / noise_sq_r >= m a has probability below exp(-lambda^2 / 2).
[[nodiscard]] double spread_threshold(std::size_t m);

}  // namespace sharpcheck::metrics
