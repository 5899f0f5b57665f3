// The projected tests' noise (metrics/projected_noise.hpp): project_errors, and the backward's
// ScaleNoise assembled from its Magnitudes sums.
#include "metrics/projected_noise.hpp"

#include <algorithm>
#include <cmath>

#include "metrics/backward_pair_block.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::metrics {

double dot_units_of(double d, DotCharge charge) {
  return charge == DotCharge::worst_case ? d : std::min(d, std::sqrt(2 * d));
}

SplitUnits split_units(const kernels::BackwardTolerance& tolerance, const Magnitudes& m,
                       const kernels::BackwardProblem& p, std::size_t length) {
  const double d_q = static_cast<double>(p.queries.cols), d_v = static_cast<double>(p.values.cols);
  const double dots = dot_units_of(d_q, DotCharge::hoeffding) + dot_units_of(d_v, DotCharge::hoeffding);
  const double rest =
      tolerance.length * static_cast<double>(length) + tolerance.constant + tolerance.dims * (d_q + d_v);
  const double logit =
      (d_q > 0 ? m.logit_dot * dot_units_of(d_q, DotCharge::hoeffding) / d_q : 0.0) + m.logit_rest;
  const double pair = logit + tolerance.lse * (m.largest_lse + m.largest_gap) + tolerance.constant;
  return {.pair_relative = std::expm1(pair * 0x1p-24),
          .dot_relative = std::expm1(tolerance.dims * dots * 0x1p-24),
          .rest_relative = std::expm1(rest * 0x1p-24),
          .d_from_o = tolerance.output_units > 0};
}

ScaleNoise with_score_terms(ScaleNoise n, const Magnitudes& m, const Magnitudes::ScaleScoreTerms& terms) {
  if (!m.scale_scores_charged || !m.scale_scores_known) return n;
  n.scores = std::sqrt(terms.first) * (1 + 1e-9);
  n.scores_second = terms.second * (1 + 1e-9);
  n.growth = m.scale_growth * (1 + 1e-9);
  n.inside_growth = terms.growth * (1 + 1e-9);
  return n;
}

ScaleNoise with_split_pairs(ScaleNoise n, const Magnitudes& m, const Magnitudes::SplitPairs& split,
                            const SplitUnits& units) {
  if (m.scale_scores_charged || !units.d_from_o) return n;
  n.pairs_ds = split.ds;
  n.pairs_dp = split.dp;
  n.pairs_from_d = split.from_d;
  n.rows_centred = split.rows_centred;
  n.rows_rest = split.rows_rest;
  n.pair_relative = units.pair_relative;
  n.dot_relative = units.dot_relative;
  n.rest_relative = units.rest_relative;
  return n;
}

ScaleNoise with_exact_terms(ScaleNoise n, const Tolerance& entry, const Magnitudes::ExactSums& sums) {
  if (entry.probabilities_in_output != 3) return n;
  n.inside_exact = sums.squares;
  n.inside_cross = sums.cross;
  return n;
}

namespace {

// What a projected test charges the fp32 arithmetic and a recipe's score roundings (see
// ScaleNoise in inside_rounding.hpp): the elements' sum of squares for the Hoeffding part, and
// what is charged in full; each element's share weighted by |w_x|.
struct Fp32Charge {
  double squares = 0;  // sum over elements of (w_x M_x)^2 (each element's own accumulation)
  double in_full = 0;  // the shared roundings, the score roundings, the absolute floors
};

Fp32Charge fp32_charge(const ProjectedInput& in, const Tolerance& entry, const FloatFormat& output,
                       const RowScale& scale) {
  Tolerance fp32_only = entry;
  fp32_only.probabilities_in_output = fp32_only.scores_in_output = 0;
  Tolerance with_scores = fp32_only;
  with_scores.scores_in_output = entry.scores_in_output;
  const double u = entry.accumulation->unit_roundoff();
  const double floor = absolute_floor(fp32_only, scale, output);
  Fp32Charge charge;
  double total = 0;
  for (std::size_t x = 0; x < in.magnitudes.size(); ++x) {
    const double m = in.magnitudes[x], w = in.weights.empty() ? 1.0 : std::fabs(in.weights[x]);
    if (w == 0) continue;  // nothing projected (and 0 times an infinite magnitude is NaN)
    charge.squares += w * w * m * m;
    total += w * m;
    charge.in_full += w * floor;
    if (entry.scores_in_output > 0 && in.noise.scores < 0)  // exp(a + b) - exp(a) >= exp(b) - 1
      charge.in_full += w * (allowed_error(with_scores, m, 0.0, scale, output, Tier::statistical, 0.0) -
                             allowed_error(fp32_only, m, 0.0, scale, output, Tier::statistical, 0.0));
  }
  charge.in_full += (2 * scale.largest_score + 4) * u * total * in.noise.growth;
  if (entry.scores_in_output > 0 && in.noise.scores >= 0) charge.in_full += in.noise.scores_second;
  return charge;
}

// The intermediate roundings' part in full, by their worst case `linear` (sqrt(a + b) <= sqrt(a) +
// sqrt(b) keeps the rest's root, `rest_noise`, a bound), where that allowance is the smaller: few
// independent roundings (repeated tokens: one rounding of P per pair of tokens, shared by every copy).
ProjectedStat inside_in_full(const ProjectedStat& stat, double rest_noise, double linear) {
  ProjectedStat in_full = stat;
  in_full.noise = rest_noise * (1 + 0x1p-20);
  in_full.in_full = stat.in_full + linear * (1 + 0x1p-20);
  const auto allowance = [](const ProjectedStat& s) { return statistical_lambda * s.noise + s.in_full; };
  return allowance(in_full) < allowance(stat) ? in_full : stat;
}

}  // namespace

ProjectedStat project_errors(const ProjectedInput& in, const Tolerance& entry, double u_o,
                             const FloatFormat& output, const RowScale& scale) {
  const ScaleNoise& noise = in.noise;
  const double u_i =
      entry.probabilities_in_output > 0
          ? (entry.probability_format != nullptr ? *entry.probability_format : output).unit_roundoff()
          : 0.0;
  const double u_out = output.unit_roundoff();
  ProjectedStat stat;
  double roundings = 0;
  for (std::size_t x = 0; x < in.expected.size(); ++x) {
    const double e = in.expected[x], y = in.actual[x];
    // A non-finite output is judged by the element check (a correct overflow passes there, a wrong
    // one fails): it is left out here, and the rest of the test still runs.
    if (!std::isfinite(y)) continue;
    const double w = in.weights.empty() ? (e > 0 ? 1.0 : (e < 0 ? -1.0 : 0.0)) : in.weights[x];
    stat.weight += std::fabs(in.weights.empty() ? e : w * e);
    stat.deviation += w * (y - e);
    // The output roundings (each |w| u_out |y| and |w| u_out |e|; |w| = 1 for signs), and extra ones.
    const double scale_of_x = in.weights.empty() ? 1.0 : w;
    roundings += (u_out * u_out + noise.element_roundings) * scale_of_x * scale_of_x * (y * y + e * e);
  }
  // The entry's fp32 units for this problem (gradient_entry's constant, and per_item times the
  // statistical length) as a relative bound of each source's error.
  const double units =
      entry.constant + entry.per_item * charged_length(static_cast<double>(scale.n), Tier::statistical);
  const double relative = std::expm1(units * entry.accumulation->unit_roundoff());
  const Fp32Charge fp32 = fp32_charge(in, entry, output, scale);
  const double score_spread = entry.scores_in_output > 0 && noise.scores >= 0 ? noise.scores : 0.0;
  // The intermediate roundings: by their exact coefficients where known (the math path), those
  // grown by at most (growth - 1) times the bounds' sum under the scores' roundings, and their
  // products in full; else by the bounds, grown by `growth`.
  const bool exact = noise.inside_exact >= 0;
  const double inside_variance = exact ? 0.0 : u_i * u_i * noise.growth * noise.growth * noise.inside;
  const double inside_spread =
      exact ? u_i * (std::sqrt(noise.inside_exact) + (noise.growth - 1) * std::sqrt(noise.inside)) : 0.0;
  const double cross = exact ? 6 * (1 + u_i) * u_i * u_i * noise.growth * noise.inside_cross : 0.0;
  const double variance = roundings + inside_variance + u_o * u_o * noise.from_d;
  // Each element's own accumulation errs by at most the per-item units' share of what it sums (the
  // kernel's terms within `relative` of the exact ones); the other fp32 sources are the pairs' and
  // the rows' (`pairs`, `rows`).
  double element_spread = relative * std::sqrt(fp32.squares);
  if (!in.accumulated.empty()) {
    const double accumulation =
        std::expm1(entry.per_item * charged_length(static_cast<double>(scale.n), Tier::statistical) *
                   entry.accumulation->unit_roundoff());
    double squares = 0;
    for (std::size_t x = 0; x < in.accumulated.size(); ++x) {
      const double w = in.weights.empty() ? 1.0 : in.weights[x];
      const double summed = in.accumulated[x] + relative * in.magnitudes[x];
      if (w != 0) squares += w * w * summed * summed;
    }
    element_spread = std::min(element_spread, accumulation * std::sqrt(squares));
  }
  double shared = relative * (std::sqrt(noise.pairs) + std::sqrt(noise.rows));
  if (noise.pairs_ds >= 0)
    // Second order (a review's bound): P's error times D's centred, rest and O-rounding parts and
    // the forward P's rounding, (3 relative + rest_relative + u_i) mag; the LSE's times D's likewise.
    shared = std::min(shared,
                      noise.pair_relative * std::sqrt(noise.pairs_ds) +
                          relative * ((3 * relative + noise.rest_relative + u_i) * std::sqrt(noise.pairs) +
                                      u_o * std::sqrt(noise.pairs_from_d) + std::sqrt(noise.rows_centred)) +
                          noise.dot_relative * std::sqrt(noise.pairs_dp) +
                          (noise.rest_relative + relative * (relative + noise.rest_relative + u_o)) *
                              std::sqrt(noise.rows_rest));
  const double fp32_spread = noise.growth * (shared + element_spread) + u_i * std::sqrt(noise.inside_growth);
  stat.noise = (std::sqrt(variance) + fp32_spread + score_spread + inside_spread) * (1 + 0x1p-20);
  stat.in_full =
      (fp32.in_full + noise.absolute + cross + noise.relative_in_full * stat.weight) * (1 + 0x1p-20);
  if (exact || noise.inside_linear < 0) return stat;
  return inside_in_full(stat, std::sqrt(roundings + u_o * u_o * noise.from_d) + fp32_spread + score_spread,
                        u_i * noise.growth * noise.inside_linear);
}

// The entry every gradient is judged by: the backward tolerance's units for this problem, and a
// recipe's roundings of P, dP and dS (each at most its format's u times the gradient's
// magnitude) and of the scores (metrics/recipes.cpp).
Tolerance gradient_entry(const kernels::BackwardTolerance& tolerance, const Magnitudes& m,
                         const kernels::BackwardProblem& p, DotCharge charge) {
  const double d_q = static_cast<double>(p.queries.cols), d_v = static_cast<double>(p.values.cols);
  const double logit_dot = charge == DotCharge::hoeffding_scores_emulated || d_q == 0
                               ? 0.0
                               : m.logit_dot * dot_units_of(d_q, charge) / d_q;
  const double logit = charge == DotCharge::worst_case ? m.logit_rounding : logit_dot + m.logit_rest;
  Tolerance entry;
  entry.accumulation = &fp32;
  entry.constant = tolerance.logit * logit + tolerance.lse * (m.largest_lse + m.largest_gap) +
                   tolerance.dims * (dot_units_of(d_q, charge) + dot_units_of(d_v, charge)) +
                   tolerance.constant;
  entry.per_item = tolerance.length;
  entry.probabilities_in_output = tolerance.intermediates;
  entry.scores_in_output = tolerance.score_roundings;
  entry.probability_format = entry.score_format = tolerance.intermediate_format;
  return entry;
}

Magnitudes::ScaleSums dq_scale_sums(const Magnitudes& m) {
  return {.inside = m.dq_scale_inside,
          .inside_linear = m.dq_scale_inside_linear,
          .from_d = m.dq_scale_from_d,
          .pairs = m.dq_scale_pairs,
          .rows = m.dq_scale_rows,
          .split = m.dq_scale_split,
          .scores = m.dq_scale_scores,
          .exact = m.dq_scale_exact};
}

}  // namespace sharpcheck::metrics

namespace sharpcheck::metrics::backward_blocks {

// dQ's gradient-scale sums (Magnitudes::ScaleSums) taken out of `m` (left 0), or added back.
Magnitudes::ScaleSums take_dq_scale_sums(Magnitudes& m) {
  const Magnitudes::ScaleSums sums = dq_scale_sums(m);
  m.dq_scale_inside = m.dq_scale_inside_linear = m.dq_scale_from_d = m.dq_scale_pairs = m.dq_scale_rows = 0;
  m.dq_scale_split = {}, m.dq_scale_scores = {}, m.dq_scale_exact = {};
  return sums;
}
void add_dq_scale_sums(const Magnitudes::ScaleSums& x, Magnitudes& m) {
  m.dq_scale_inside += x.inside, m.dq_scale_inside_linear += x.inside_linear, m.dq_scale_from_d += x.from_d;
  m.dq_scale_pairs += x.pairs, m.dq_scale_rows += x.rows;
  Magnitudes::SplitPairs& split = m.dq_scale_split;
  split.ds += x.split.ds, split.dp += x.split.dp, split.from_d += x.split.from_d;
  split.rows_centred += x.split.rows_centred, split.rows_rest += x.split.rows_rest;
  m.dq_scale_scores.first += x.scores.first, m.dq_scale_scores.second += x.scores.second;
  m.dq_scale_scores.growth += x.scores.growth;
  m.dq_scale_exact.squares += x.exact.squares, m.dq_scale_exact.cross += x.exact.cross;
}

}  // namespace sharpcheck::metrics::backward_blocks
