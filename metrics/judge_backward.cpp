#include "metrics/judge_backward.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "metrics/backward_emulation.hpp"
#include "metrics/backward_magnitudes.hpp"
#include "metrics/inside_rounding.hpp"
#include "metrics/projected_noise.hpp"
#include "metrics/score_emulation.hpp"
#include "reference/attention_backward_double.hpp"
#include "reference/softmax_backward.hpp"

namespace sharpcheck::metrics {
namespace {

// allowed = (exp(units u) - 1) magnitude + from_d_scale from_d + 2 u_out |expected| + floor, with
// from_d_scale = output_units u_o,
// u_o the unit roundoff of the format O was kept in (the kernel's), u_out that of `output` (the
// compared values': fp32 for D); the from_d part is an absolute allowance (compare's `additional`).
// What a gradient's allowance is relative to: its magnitude, what D's error moves it by, and (for a
// recipe that rounds intermediates) the spread the statistical tier charges them by.
struct GradientBound {
  const Matrix& magnitudes;
  const Matrix& from_d;
  const Matrix* spread = nullptr;
  const Matrix* scores = nullptr;  // the scores' rounding: Hoeffding spread and second order
  const Matrix* scores_second = nullptr;
  const Matrix* floor = nullptr;  // the subnormal roundings' sums (Magnitudes::dq_floor), times floor_scale
  double floor_scale = 0;
  // Around a math path's emulated scores (judge_projected_emulated): the statistical tier judged
  // around this gradient of the emulated logits, with its magnitudes, spreads and slack sums, and
  // how far the centre may be from the kernel's (its certified radius and more) added to that tier's
  // allowances.
  struct Centred {
    const Matrix& centre;
    const Matrix& magnitudes;
    const Matrix& spread;
    const Matrix& slack;
    const Matrix& slack_second;
    const Matrix& radius;
    // The centred tier's fp32 entry: the scores' dot products are the emulation's (its slack).
    const Tolerance* entry = nullptr;
  };
  const Centred* centred = nullptr;
  const Matrix* absolute = nullptr;  // an absolute allowance more (Magnitudes::dq_slope)
};

Comparison compare_gradient(const Matrix& expected, const Matrix& actual, const GradientBound& bound,
                            double from_d_scale, const Tolerance& tolerance, const FloatFormat& output,
                            std::size_t length, double largest_score) {
  const Matrix& magnitudes = bound.magnitudes;
  const Matrix& from_d = bound.from_d;
  const Matrix zeros(expected.rows, expected.cols);
  Matrix additional(expected.rows, expected.cols);
  for (std::size_t e = 0; e < additional.values.size(); ++e)
    additional.values[e] = (from_d_scale * from_d.values[e] +
                            (bound.floor != nullptr ? bound.floor_scale * bound.floor->values[e] : 0.0) +
                            (bound.absolute != nullptr ? bound.absolute->values[e] : 0.0)) *
                           (1 + 0x1p-20);
  // Every row's sums have at most `length` terms: the per_item term's n, which the statistical tier
  // charges as min(n, 8 sqrt(n)) (tolerance_table.cpp).
  RowScale scale;
  scale.n = length;
  scale.largest_score =
      largest_score;  // max |s / theta| <= max |L| + max |z - L|: the recipe's score roundings
  ComparisonInput input{&expected, &actual, &magnitudes, &zeros, std::vector<RowScale>(expected.rows, scale),
                        false};
  input.output_rounding_of_expected = true;
  input.additional = &additional;
  InsideSpreads inside;  // P's, dP's and dS's roundings, and the scores'
  if (bound.spread != nullptr && tolerance.probabilities_in_output > 0) {
    inside.p = *bound.spread;  // every intermediate rounding's share (magnitudes_of)
    input.inside = &inside;
  }
  if (bound.scores != nullptr && bound.scores->cols > 0 && tolerance.scores_in_output > 0) {
    inside.s = *bound.scores;
    inside.s_second = *bound.scores_second;
    input.inside = &inside;
  }
  if (const auto* c = bound.centred; c != nullptr) {
    inside.p = c->spread;
    inside.s = c->slack;
    inside.s_second = c->slack_second;
    inside.centre = c->centre;
    inside.centre_magnitude = c->magnitudes;
    inside.centre_slack = c->radius;  // the statistical tier's alone: the proven tier stands
    inside.centre_tolerance = c->entry;
    input.inside = &inside;
  }
  return compare(input, tolerance, output);
}

// What the projected tests (gradient scale, D direction) compare with: the reference, or the
// gradients of a math path's emulated scores with their certified radii (charged in full) and how
// far the kernel's scale factor may be from the centre's (relative, in full).
struct Centre {
  const reference::AttentionGradients& gradients;
  const reference::AttentionGradients* radii = nullptr;
  double relative_in_full = 0;
  double extra_dq = 0, extra_dk = 0;  // ScaleNoise::element_roundings of dQ and dK
};

struct ScaleSettings {
  const Tolerance& entry;      // the element tier's
  const Tolerance& projected;  // the projected tests' (DotCharge::hoeffding)
  double units;
  SplitUnits split;
  const FloatFormat& output;
  const RowScale& scale;
  Centre centre;
};

// The D-direction test (statistical tier). An error delta_i of D_i moves dQ_i by exactly -delta_i
// w_i (Magnitudes::dq_direction), which an element's allowance may hide: under PyTorch's math path
// a D computed from half of dO fits every element at a few hundred keys (metrics/recipes.cpp). Row
// i's T_i = w_i . (y_i - e_i) is honest noise (project_errors: |T_i| <= lambda noise_i + in_full_i
// but with probability 2 exp(-lambda^2 / 2)), D's own honest error among it (backward_magnitudes.cpp's
// b_sq: O's and the forward P's roundings by Hoeffding); and the rows
// together by HeadScale's spread test: sum_i max(|T_i| - in_full_i, 0)^2 / noise_i^2 against
// spread_threshold, which sees a D off a little in every row.
void judge_d_direction(const kernels::KernelGradients& actual, const Magnitudes& m, double floor_scale,
                       const ScaleSettings& x, BackwardJudgement& judgement) {
  const Matrix& expected = x.centre.gradients.d_queries;
  const Matrix* radii = x.centre.radii != nullptr ? &x.centre.radii->d_queries : nullptr;
  DirectionFinding finding;
  double spread = 0, noisy = 0;  // a row with copies is one row of evidence (PairBlock::copies)
  for (std::size_t i = 0; i < expected.rows; ++i) {
    const std::span<const double> w = m.dq_direction.row(i);
    const Magnitudes::ProjectedSums& sums = m.d_direction[i];
    ScaleNoise noise = with_exact_terms(
        {.inside = sums.inside, .from_d = sums.from_d, .pairs = sums.pairs, .rows = sums.rows}, x.projected,
        sums.exact);
    noise = with_split_pairs(noise, m, sums.split, x.split);
    for (std::size_t t = 0; t < w.size(); ++t)
      noise.absolute += std::fabs(w[t]) *
                        (m.dq_floor(i, t) * floor_scale + m.dq_slope(i, t) + (radii ? (*radii)(i, t) : 0.0));
    noise.relative_in_full = x.centre.relative_in_full;
    noise.element_roundings = x.centre.extra_dq;
    const ProjectedInput in{.expected = expected.row(i),
                            .actual = actual.d_queries.row(i),
                            .magnitudes = m.dq.row(i),
                            .weights = w,
                            .noise = with_score_terms(noise, m, sums.scores),
                            .accumulated = m.dq_accumulated.row(i)};
    const ProjectedStat stat = project_errors(in, x.projected, x.units, x.output, x.scale);
    if (!(stat.noise > 0) && !(stat.in_full > 0)) continue;  // no key seen, or no direction
    // An allowance past double's range (values near 1e300, whose products overflow) cannot judge
    // the row: its elements' own verdicts stand, as the row-scale test's do (record_scale).
    const double allowed = statistical_lambda * stat.noise + stat.in_full;
    if (!std::isfinite(allowed)) continue;
    ++finding.rows;
    double ratio = std::fabs(stat.deviation) / allowed;
    if (std::isnan(ratio)) ratio = INFINITY;
    if (ratio > 1) ++finding.failing;
    if (!(ratio <= finding.worst_ratio)) {
      finding.worst_ratio = ratio;
      finding.worst_row = i;
    }
    if (!(stat.noise > 0)) continue;
    const double copies = m.row_copies.empty() ? 1.0 : m.row_copies[i];
    noisy += 1 / copies;
    const double beyond = std::max(std::fabs(stat.deviation) - stat.in_full, 0.0);
    spread += beyond * beyond / (stat.noise * stat.noise) / copies;
  }
  const auto distinct = static_cast<std::size_t>(std::llround(noisy));
  if (distinct >= 2) {
    finding.spread_ratio =
        spread / (static_cast<double>(distinct) * spread_threshold(distinct) * (1 + 0x1p-20));
    if (std::isnan(finding.spread_ratio)) finding.spread_ratio = INFINITY;
  }
  if (finding.rows > 0) record_d_direction(judgement.d_queries, finding);
}

// The gradient-scale test (inside_rounding.hpp) of dQ, dK and dV.
void judge_gradient_scales(const kernels::KernelGradients& actual, const Magnitudes& m, double floor_scale,
                           const ScaleSettings& x, BackwardJudgement& judgement) {
  const auto total = [](const Matrix* matrix, std::size_t first = 0, std::size_t count = SIZE_MAX) {
    double sum = 0;
    if (matrix == nullptr) return sum;
    count = std::min(count, matrix->values.size() - first);
    for (std::size_t k = first; k < first + count; ++k) sum += matrix->values[k];
    return sum;
  };
  const auto& e = x.centre.gradients;
  const auto* radii = x.centre.radii;
  // The absolute parts (the subnormal floors, a cap's slope error, the centre's radii) in full.
  const auto noise = [&](double inside, double from_d, double absolute, double pairs, double rows,
                         double extra, double inside_linear) {
    return ScaleNoise{.inside = inside,
                      .inside_linear = inside_linear * (1 + 1e-9),
                      .from_d = from_d,
                      .absolute = absolute,
                      .pairs = pairs,
                      .rows = rows,
                      .relative_in_full = x.centre.relative_in_full,
                      .element_roundings = extra};
  };
  // Each gradient's bounds' sums with the scores' roundings and the math path's exact coefficients.
  const auto charged = [&](ScaleNoise n, const Magnitudes::ScaleScoreTerms& scores,
                           const Magnitudes::ExactSums* exact) {
    n = with_score_terms(n, m, scores);
    return exact != nullptr ? with_exact_terms(n, x.projected, *exact) : n;
  };
  // dQ's elements [first, first + count) with their sums: the whole, or one query head of a group.
  const auto dq_input = [&](const char* name, const Magnitudes::ScaleSums& sums, std::size_t first,
                            std::size_t count) {
    const std::size_t span = count > 0 ? count : SIZE_MAX;  // count 0: every element
    const double absolute = floor_scale * total(&m.dq_floor, first, span) + total(&m.dq_slope, first, span) +
                            total(radii ? &radii->d_queries : nullptr, first, span);
    const ScaleNoise n = noise(sums.inside, sums.from_d, absolute, sums.pairs, sums.rows, x.centre.extra_dq,
                               sums.inside_linear);
    return GradientScaleInput{name,
                              e.d_queries,
                              actual.d_queries,
                              m.dq,
                              charged(with_split_pairs(n, m, sums.split, x.split), sums.scores, &sums.exact),
                              &m.dq_accumulated,
                              first,
                              count};
  };
  const GradientScaleInput gradients[] = {
      dq_input("dQ", dq_scale_sums(m), 0, 0),
      {"dK", e.d_keys, actual.d_keys, m.dk,
       charged(with_split_pairs(
                   noise(m.dk_scale_inside, m.dk_scale_from_d,
                         floor_scale * total(&m.dk_floor) + total(&m.dk_slope) +
                             total(radii ? &radii->d_keys : nullptr),
                         m.dk_scale_pairs, m.dk_scale_rows, x.centre.extra_dk, m.dk_scale_inside_linear),
                   m, m.dk_scale_split, x.split),
               m.dk_scale_scores, &m.dk_scale_exact),
       &m.dk_accumulated},
      {"dV", e.d_values, actual.d_values, m.dv,
       charged(noise(m.dv_scale_inside, 0.0,
                     floor_scale * total(&m.dv_floor) + total(radii ? &radii->d_values : nullptr),
                     m.dv_scale_pairs, m.dv_scale_rows, 0.0, m.dv_scale_inside_linear),
               m.dv_scale_scores, nullptr),
       &m.dv}};
  Comparison* comparisons[] = {&judgement.d_queries, &judgement.d_keys, &judgement.d_values};
  for (std::size_t g = 0; g < 3; ++g)
    judge_gradient_scale(gradients[g], x.projected, x.units, x.output, x.scale, *comparisons[g]);
  const std::size_t per_head = e.d_queries.values.size() / std::max<std::size_t>(m.dq_scale_heads.size(), 1);
  for (std::size_t h = 0; h < m.dq_scale_heads.size() && m.dq_scale_heads.size() > 1; ++h) {
    const std::string name = "dQ of query head " + std::to_string(h) + " of the group";
    judge_gradient_scale(dq_input(name.c_str(), m.dq_scale_heads[h], h * per_head, per_head), x.projected,
                         x.units, x.output, x.scale, judgement.d_queries);
  }
}

// The element-wise verdicts of dQ, dK and dV against the reference (`x.centre.gradients`), their
// statistical tier around a math path's emulated gradients when `centred` is given (dQ, dK, dV).
void judge_elements(const kernels::KernelGradients& actual, const Magnitudes& m, double floor_scale,
                    const ScaleSettings& x, const GradientBound::Centred* centred,
                    BackwardJudgement& judgement) {
  const auto& e = x.centre.gradients;
  const auto compared = [&](const Matrix& expected, const Matrix& got, const GradientBound& bound) {
    return compare_gradient(expected, got, bound, x.units, x.entry, x.output, x.scale.n,
                            x.scale.largest_score);
  };
  const auto at = [&](std::size_t g) { return centred != nullptr ? &centred[g] : nullptr; };
  // A GQA group's per-head roundings to the output format (Magnitudes::dk_heads), in full: u_out of
  // the kernel's |dK_h|, which exceeds the centre's by at most its own error (a few u_i of the
  // magnitude: 2^-5 of it, over all the heads, covers eight roundings of bf16), the partial sums
  // carrying the earlier heads' roundings (1 + G u_out); 1e-6 over the double products.
  const double u_out = x.output.unit_roundoff(), groups = static_cast<double>(m.dq_scale_heads.size());
  const double head_unit = u_out * (1 + 2 * u_out) * (1 + groups * u_out) * (1 + 1e-6);
  // The math path's second order past comparison.cpp's 10 u_i^2 M (two roundings of dS; a soft-cap's
  // backward rounds it up to five times: second_order_of_ds), for dQ and dK.
  const double u_i = x.entry.probabilities_in_output >= 3 && x.entry.probability_format != nullptr
                         ? x.entry.probability_format->unit_roundoff()
                         : 0.0;
  const double second = std::max(0.0, second_order_of_ds(m.ds_roundings) * (1 + u_i) - 10) * u_i * u_i;
  const auto absolute = [&](const Matrix* heads, const Matrix& magnitude, const Matrix* base, bool via_ds) {
    Matrix sum = base != nullptr && !base->values.empty() ? *base : Matrix(magnitude.rows, magnitude.cols);
    for (std::size_t k = 0; k < sum.values.size(); ++k) {
      if (via_ds) sum.values[k] += second * magnitude.values[k] * (1 + 1e-6);
      if (heads != nullptr && !heads->values.empty())
        sum.values[k] += head_unit * heads->values[k] + u_out * 0x1p-5 * magnitude.values[k];
    }
    return sum;
  };
  const Matrix dq_absolute = absolute(nullptr, m.dq, &m.dq_slope, true);
  const Matrix dk_absolute = absolute(&m.dk_heads, m.dk, &m.dk_slope, true);
  const Matrix dv_absolute = absolute(&m.dv_heads, m.dv, nullptr, false);
  judgement.d_queries = compared(e.d_queries, actual.d_queries,
                                 {m.dq, m.dq_from_d, &m.dq_spread, &m.dq_scores, &m.dq_scores_second,
                                  &m.dq_floor, floor_scale, at(0), &dq_absolute});
  judgement.d_keys = compared(e.d_keys, actual.d_keys,
                              {m.dk, m.dk_from_d, &m.dk_spread, &m.dk_scores, &m.dk_scores_second,
                               &m.dk_floor, floor_scale, at(1), &dk_absolute});
  const Matrix no_d(e.d_values.rows, e.d_values.cols);
  judgement.d_values = compared(e.d_values, actual.d_values,
                                {m.dv, no_d, &m.dv_spread, &m.dv_scores, &m.dv_scores_second, &m.dv_floor,
                                 floor_scale, at(2), &dv_absolute});
}

// How far a judgement is from passing its statistical tier: the largest of the gradients' element
// and projected tests' ratios.
double statistical_closeness(const BackwardJudgement& j) {
  double closeness = 0;
  for (const Comparison* c : {&j.d_queries, &j.d_keys, &j.d_values})
    closeness = std::max({closeness, c->max_statistical_ratio, c->max_row_scale_ratio});
  return closeness;
}

// The judgement around the exact gradients: their magnitudes, the subnormal floors' scale, settings.
struct AroundReference {
  const Magnitudes& m;
  double floor_scale;
  const ScaleSettings& x;
};

// One emulated variant's judgement: `base` (its proven tier) with the statistical tier around the
// gradients of the emulated scores; nothing when the double stage stands aside.
std::optional<BackwardJudgement> judged_around(const kernels::BackwardTolerance& tolerance,
                                               const kernels::BackwardProblem& p,
                                               const kernels::KernelGradients& actual,
                                               const AroundReference& exact, const EmulatedBackward& e,
                                               const BackwardJudgement& base) {
  const tensor::AttentionBackwardProblem problem = e.problem(p);
  std::optional<reference::BackwardEnclosures> enclosures =
      reference::enclose_backward_in_double(problem, e.heads);
  if (!enclosures) return std::nullopt;
  apply_cap_slopes(p, e, enclosures->values, enclosures->radii);
  const auto& centre = enclosures->values;
  add_deviation_radii(p, e, centre, enclosures->radii);
  const auto& radii = enclosures->radii;
  const double u_i = tolerance.intermediate_format->unit_roundoff();
  const Magnitudes m = magnitudes_of(problem, centre, 0.0, u_i, tolerance.intermediates, &e.slack, &p);
  // The element tier charges the extra roundings in full (one each, of the kernel's value, within
  // 2 u_i of the centre's) and the factor's relative error, with the radii (the second order past
  // two roundings of dS is judge_elements').
  const auto with_extra = [&](const Matrix& radius, const Matrix& gradient, double extra) {
    Matrix sum = radius;
    const double relative = extra * u_i * (1 + 2 * u_i) + e.relative_in_full;
    for (std::size_t x = 0; x < sum.values.size(); ++x)
      sum.values[x] += relative * std::fabs(gradient.values[x]) * (1 + 0x1p-20);
    return sum;
  };
  const Matrix dq_radius = with_extra(radii.d_queries, centre.d_queries, e.extra_dq);
  const Matrix dk_radius = with_extra(radii.d_keys, centre.d_keys, e.extra_dk);
  const Matrix dq_slack = first_order_slack(m.dq_scores, worst_dq_slack(m, centre, radii));
  const Matrix dk_slack = first_order_slack(m.dk_scores, m.dk_slack_worst);
  const Matrix dv_slack = first_order_slack(m.dv_scores, m.dv_slack_worst);
  // Around the centre the scores' dot products are the emulation's, their fp32 worst case in its
  // slack: the fp32 entry leaves them out (as the projected tests do), and a sharp head's dQ, which
  // cancels to 1e-6 of its magnitude, is no longer allowed the logits' worst case times that
  // magnitude (it let a D 10% off pass at 0.7 on a head of seven keys at 3 sigma).
  const Tolerance projected = gradient_entry(tolerance, exact.m, p, DotCharge::hoeffding_scores_emulated);
  const Matrix dq_second = smaller(m.dq_scores_second, m.dq_slack_second);
  const Matrix dk_second = smaller(m.dk_scores_second, m.dk_slack_second);
  const Matrix dv_second = smaller(m.dv_scores_second, m.dv_slack_second);
  const GradientBound::Centred centred[] = {
      {centre.d_queries, m.dq, m.dq_spread, dq_slack, dq_second, dq_radius, &projected},
      {centre.d_keys, m.dk, m.dk_spread, dk_slack, dk_second, dk_radius, &projected},
      {centre.d_values, m.dv, m.dv_spread, dv_slack, dv_second, radii.d_values, &projected}};
  BackwardJudgement judged = base;
  const ScaleSettings& x = exact.x;
  judge_elements(actual, exact.m, exact.floor_scale, x, centred, judged);
  const ScaleSettings around{.entry = x.entry,
                             .projected = projected,
                             .units = x.units,
                             .split = x.split,
                             .output = x.output,
                             .scale = x.scale,
                             .centre = Centre{.gradients = centre,
                                              .radii = &radii,
                                              .relative_in_full = e.relative_in_full,
                                              .extra_dq = e.extra_dq * u_i * u_i,
                                              .extra_dk = e.extra_dk * u_i * u_i}};
  judge_gradient_scales(actual, m, exact.floor_scale, around, judged);
  judge_d_direction(actual, m, exact.floor_scale, around, judged);
  judged.score_chain = e.description;
  return judged;
}

// The statistical tier around the emulated scores of every variant (score_variants, the most common
// first; a cap of each step in F with its slope from F's tanh or, cast from fp32, the fp32 one), on
// copies of `base` (its proven tier stands): the first that fits clearly, else the closest to passing;
// nothing when the problem cannot be emulated. A kernel forms its scores one way; an honest one fits.
std::optional<BackwardJudgement> judge_projected_emulated(const kernels::BackwardTolerance& tolerance,
                                                          const kernels::BackwardProblem& p,
                                                          const kernels::KernelGradients& actual,
                                                          const AroundReference& exact,
                                                          const BackwardJudgement& base) {
  if (!tolerance.scores_emulated || tolerance.intermediate_format == nullptr || !backward_emulable(p))
    return std::nullopt;
  std::optional<BackwardJudgement> best;
  for (const ScoreVariant& variant : score_variants(p.head(0))) {
    for (const bool fp32_slope : {false, true}) {
      if (fp32_slope && variant.cap != CapChain::each_step_in_format) continue;
      EmulatedBackward e;
      if (!emulate_backward(p, variant, *tolerance.intermediate_format, fp32_slope, e)) continue;
      std::optional<BackwardJudgement> judged = judged_around(tolerance, p, actual, exact, e, base);
      if (!judged) continue;
      if (!best || statistical_closeness(*judged) < statistical_closeness(*best)) best = std::move(judged);
      // A clear fit ends the search; else the closest is kept (a near one may be another's centre).
      if (statistical_closeness(*best) <= 0.5) return best;
    }
  }
  return best;
}

}  // namespace

bool BackwardJudgement::passed() const {
  return d_queries.passed() && d_keys.passed() && d_values.passed() && (!d_sink || d_sink->passed()) &&
         (!d_rows || d_rows->passed());
}

std::string BackwardJudgement::describe_worst() const {
  std::pair<const Comparison*, const char*> worst{&d_queries, "dQ"};
  for (const auto& [candidate, label] :
       {std::pair{&d_keys, "dK"}, std::pair{&d_values, "dV"}, std::pair{d_sink ? &*d_sink : nullptr, "dsink"},
        std::pair{d_rows ? &*d_rows : nullptr, "D"}})
    if (candidate != nullptr && !(candidate->max_bound_ratio <= worst.first->max_bound_ratio))
      worst = {candidate, label};
  return std::string(worst.second) + " " + worst.first->worst.describe();
}

BackwardJudgement judge_attention_backward(const kernels::BackwardTolerance& tolerance,
                                           const FloatFormat& output, const kernels::BackwardProblem& p,
                                           const kernels::KernelGradients& actual,
                                           const reference::AttentionGradients* expected) {
  BackwardJudgement judgement;
  judgement.expected = expected != nullptr ? *expected : reference::attention_backward(p, output);
  const double u_s =
      tolerance.score_roundings > 0
          ? (tolerance.intermediate_format != nullptr ? *tolerance.intermediate_format : output)
                .unit_roundoff()
          : 0.0;
  const double u_i = tolerance.intermediates > 0 && tolerance.intermediate_format != nullptr
                         ? tolerance.intermediate_format->unit_roundoff()
                         : 0.0;
  const Magnitudes m = magnitudes_of(p, judgement.expected, u_s, u_i, tolerance.intermediates);
  const double floor_scale =
      u_i > 0 ? tolerance.intermediates *
                    std::ldexp(1.0, tolerance.intermediate_format->min_subnormal_exponent() - 1)
              : 0.0;
  const Tolerance entry = gradient_entry(tolerance, m, p);
  // max |s / theta|: measured where the recipe rounds the scores, else bounded by |L| + |z - L|.
  const double score = u_s > 0 ? m.largest_z : m.largest_lse + m.largest_gap;
  const std::size_t length = std::max(p.queries.rows, p.keys.rows);
  // O kept in the kernel's format: the output's, or a recipe's coarser intermediate format (bf16
  // inputs with fp32 gradients keep O in bf16).
  const double o_unit = tolerance.intermediate_format != nullptr
                            ? std::max(tolerance.intermediate_format->unit_roundoff(), output.unit_roundoff())
                            : output.unit_roundoff();
  const double units = tolerance.d_from_probabilities ? 0.0 : tolerance.output_units * o_unit;
  const auto& e = judgement.expected;
  RowScale scale;
  scale.n = length;
  scale.largest_score = score;
  const Tolerance projected = gradient_entry(tolerance, m, p, DotCharge::hoeffding);
  const ScaleSettings settings{.entry = entry,
                               .projected = projected,
                               .units = units,
                               .split = split_units(tolerance, m, p, length),
                               .output = output,
                               .scale = scale,
                               .centre = Centre{judgement.expected}};
  judge_elements(actual, m, floor_scale, settings, nullptr, judgement);
  if (auto emulated = judge_projected_emulated(tolerance, p, actual, {m, floor_scale, settings}, judgement)) {
    judgement = std::move(*emulated);
  } else {
    judge_gradient_scales(actual, m, floor_scale, settings, judgement);
    judge_d_direction(actual, m, floor_scale, settings, judgement);
  }
  if (!actual.d_rows.empty()) {  // the kernel exposes D: judged in fp32 (or the wider output format)
    if (actual.d_rows.size() != p.queries.rows)
      throw InputError(InputProblem::shape_mismatch, "D has " + std::to_string(actual.d_rows.size()) +
                                                         " entries, the queries " +
                                                         std::to_string(p.queries.rows));
    Matrix expected_d(p.queries.rows, 1), actual_d(p.queries.rows, 1);
    std::copy(e.d_rows.begin(), e.d_rows.end(), expected_d.values.begin());
    std::copy(actual.d_rows.begin(), actual.d_rows.end(), actual_d.values.begin());
    judgement.d_rows = compare_gradient(expected_d, actual_d, {m.d_rows, m.d_rows_from_o}, units, entry,
                                        reference::d_format(output), length, score);
  }
  if (!e.d_sinks.empty() && !actual.d_sinks.empty()) {  // sink gradients judged when the kernel gives them
    if (actual.d_sinks.size() != e.d_sinks.size())
      throw InputError(InputProblem::shape_mismatch,
                       "the kernel gives " + std::to_string(actual.d_sinks.size()) + " sink gradients for " +
                           std::to_string(e.d_sinks.size()) + " heads");
    Matrix sink(e.d_sinks.size(), 1), got(e.d_sinks.size(), 1);
    std::copy(e.d_sinks.begin(), e.d_sinks.end(), sink.values.begin());
    std::copy(actual.d_sinks.begin(), actual.d_sinks.end(), got.values.begin());
    judgement.d_sink =
        compare_gradient(sink, got, {m.d_sinks, m.d_sinks_from_d}, units, entry, output, length, score);
  }
  return judgement;
}

}  // namespace sharpcheck::metrics
