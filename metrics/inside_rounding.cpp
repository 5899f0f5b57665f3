#include "metrics/inside_rounding.hpp"

#include <algorithm>
#include <cmath>

namespace sharpcheck::metrics {

double second_order(double z, double u_s) {
  const double eps = 2.0001 * u_s * z;
  return std::expm1(eps) - eps;
}

namespace {

// Keys whose weights are equal (equal scores: q = 0, repeated keys, quantised inputs) round alike,
// so their roundings are one variable, not several: the keys in order of weight, a group of equal
// ones at a time (as comparison.cpp's rounding_noise groups equal values).
std::vector<std::size_t> by_weight(const VisibleWeights& w) {
  std::vector<std::size_t> order(w.p.size());
  for (std::size_t a = 0; a < order.size(); ++a) order[a] = a;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return w.p[x] < w.p[y]; });
  return order;
}

// o, and per column the groups' sums of squares: (sum_G p v)^2 and (sum_G p (v - o))^2 for P,
// z_G^2 (sum_G p (v - o))^2 for the scores; the second order per key. Keys of weight 0 (masked by
// a huge additive bias) are skipped: their rounding moves nothing, and their |z| would overflow.
void column_sums(const Matrix& values, std::span<const std::size_t> visible, const VisibleWeights& w,
                 double u_s, RowRounding& r) {
  const std::size_t columns = values.cols;
  std::vector<double> plain(columns, 0.0), centred(columns, 0.0), scores(columns, 0.0), second(columns, 0.0),
      group(columns, 0.0);
  double p_weight = 0, s_weight = 0, rho_weight = 0;
  for (std::size_t a = 0; a < visible.size(); ++a) {
    const double* v = values.row(visible[a]).data();
    for (std::size_t c = 0; c < columns; ++c) r.exact[c] += w.p[a] * v[c];
  }
  const std::vector<std::size_t> order = by_weight(w);
  for (std::size_t start = 0; start < order.size();) {
    std::size_t end = start;
    double group_weight = 0;
    std::fill(group.begin(), group.end(), 0.0);
    // (end == start: a NaN weight, from scores that overflow double, is a group of its own, so the
    // loop always moves on instead of spinning.)
    for (; end < order.size() && (end == start || w.p[order[end]] == w.p[order[start]]); ++end) {
      const std::size_t a = order[end];
      if (w.p[a] == 0) continue;
      const double* v = values.row(visible[a]).data();
      const double rho = w.p[a] * second_order(w.z[a], u_s);
      group_weight += w.p[a];
      rho_weight += rho;
      for (std::size_t c = 0; c < columns; ++c) {
        group[c] += w.p[a] * v[c];
        second[c] += rho * std::fabs(v[c]);
      }
    }
    const double z2 = w.z[order[start]] * w.z[order[start]];
    p_weight += group_weight * group_weight;
    s_weight += z2 * group_weight * group_weight;
    for (std::size_t c = 0; c < columns; ++c) {
      const double moved = group[c] - r.exact[c] * group_weight;
      plain[c] += group[c] * group[c];
      centred[c] += moved * moved;
      scores[c] += z2 * moved * moved;
    }
    start = end;
  }
  for (std::size_t c = 0; c < columns; ++c) {
    r.p_spread[c] = std::sqrt(std::max(plain[c], centred[c])) * (1 + 0x1p-30);
    r.s_spread[c] = std::sqrt(scores[c]) * (1 + 0x1p-30);
    r.s_second[c] = (second[c] + rho_weight * std::fabs(r.exact[c])) * (1 + 0x1p-30);
  }
  r.lse_p_spread = std::sqrt(p_weight) * (1 + 0x1p-30);
  r.lse_s_spread = std::sqrt(s_weight) * (1 + 0x1p-30);
  r.lse_s_second = rho_weight * (1 + 0x1p-30);
}

// The row-scale statistic's spreads: each key's projection sum_c sign(o_c) v_jc, centred by
// sum_c |o_c|, summed over each group of equal weights, then squared.
void scale_sums(const Matrix& values, std::span<const std::size_t> visible, const VisibleWeights& w,
                double u_s, RowRounding& r) {
  double weight = 0;
  for (const double o : r.exact) weight += std::fabs(o);
  double plain = 0, centred = 0, scores = 0, second = 0, dots = 0;
  const bool dot_known = w.dot.size() == w.p.size();
  const std::vector<std::size_t> order = by_weight(w);
  for (std::size_t start = 0; start < order.size();) {
    std::size_t end = start;
    double group_projection = 0, group_weight = 0, dot_moved = 0;
    for (; end < order.size() && (end == start || w.p[order[end]] == w.p[order[start]]); ++end) {
      const std::size_t a = order[end];
      if (w.p[a] == 0) continue;
      const double* v = values.row(visible[a]).data();
      double projection = 0, absolute = 0;
      for (std::size_t c = 0; c < values.cols; ++c) {
        projection += r.exact[c] < 0 ? -v[c] : (r.exact[c] > 0 ? v[c] : 0.0);
        absolute += std::fabs(v[c]);
      }
      group_projection += w.p[a] * projection;
      group_weight += w.p[a];
      if (dot_known) dot_moved += w.p[a] * w.dot[a] * (projection - weight);
      second += w.p[a] * second_order(w.z[a], u_s) * (absolute + weight);
    }
    const double moved = group_projection - weight * group_weight;
    plain += group_projection * group_projection;
    centred += moved * moved;
    scores += w.z[order[start]] * w.z[order[start]] * moved * moved;
    dots += dot_moved * dot_moved;
    start = end;
  }
  if (dot_known) r.scale_dot_spread = std::sqrt(dots) * (1 + 0x1p-30);
  r.scale_p_spread = std::sqrt(std::max(plain, centred)) * (1 + 0x1p-30);
  r.scale_s_spread = std::sqrt(scores) * (1 + 0x1p-30);
  r.scale_s_second = second * (1 + 0x1p-30);
}

}  // namespace

RowRounding row_rounding(const Matrix& values, std::span<const std::size_t> visible, const VisibleWeights& w,
                         double u_s) {
  const std::size_t columns = values.cols;
  RowRounding r{std::vector<double>(columns, 0.0), std::vector<double>(columns, 0.0),
                std::vector<double>(columns, 0.0), std::vector<double>(columns, 0.0)};
  column_sums(values, visible, w, u_s, r);
  scale_sums(values, visible, w, u_s, r);
  return r;
}

namespace {

// One group of the emulated row's ambiguous keys: its first-order sums per column and for the
// row-scale statistic.
struct AmbiguityGroup {
  std::vector<double> columns;
  double scale = 0;
};

bool same_group(const VisibleWeights& w, std::span<const double> a, std::size_t x, std::size_t y) {
  return w.p[x] == w.p[y] && a[x] == a[y];
}

}  // namespace

RowRounding emulated_rounding(const Matrix& values, std::span<const std::size_t> visible,
                              const VisibleWeights& w, std::span<const double> ambiguity, EmulatedSink sink,
                              std::span<const double> magnitudes) {
  RowRounding r = row_rounding(values, visible, w, 0.0);
  const std::size_t columns = values.cols;
  double widest = sink.ambiguity, weight = 0;
  for (const double a : ambiguity) widest = std::max(widest, a);
  for (const double o : r.exact) weight += std::fabs(o);
  // first: the groups' Hoeffding sums; worst: the same first order with every sign against the
  // kernel, sum_e p_e a_e |v_ec - o_c|, smaller where few keys are ambiguous (the element tier adds
  // the charge, so either bounds it; the row-scale test adds it in quadrature, and keeps the root).
  std::vector<double> first(columns, 0.0), second(columns, 0.0), worst(columns, 0.0);
  double scale_first = 0, scale_second = 0;
  const auto add_group = [&](const AmbiguityGroup& g) {
    for (std::size_t c = 0; c < columns; ++c) first[c] += g.columns[c] * g.columns[c];
    scale_first += g.scale * g.scale;
  };
  std::vector<std::size_t> order;
  for (std::size_t e = 0; e < visible.size(); ++e)
    if (ambiguity[e] > 0 && w.p[e] > 0) order.push_back(e);
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return w.p[x] != w.p[y] ? w.p[x] < w.p[y] : ambiguity[x] < ambiguity[y];
  });
  AmbiguityGroup group{std::vector<double>(columns, 0.0)};
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t e = order[k];
    const double p = w.p[e], a = ambiguity[e], rho = p * (std::expm1(a) - a);
    const double* v = values.row(visible[e]).data();
    double projection = 0, absolute = 0;
    for (std::size_t c = 0; c < columns; ++c) {
      group.columns[c] += p * a * (v[c] - r.exact[c]);
      worst[c] += p * a * std::fabs(v[c] - r.exact[c]);
      second[c] += rho * (std::fabs(v[c]) + std::fabs(r.exact[c]));
      projection += r.exact[c] < 0 ? -v[c] : (r.exact[c] > 0 ? v[c] : 0.0);
      absolute += std::fabs(v[c]);
    }
    group.scale += p * a * (projection - weight);
    scale_second += rho * (absolute + weight);
    if (k + 1 == order.size() || !same_group(w, ambiguity, e, order[k + 1])) {
      add_group(group);
      group = AmbiguityGroup{std::vector<double>(columns, 0.0)};
    }
  }
  if (sink.ambiguity > 0 && sink.weight > 0) {
    const double a = sink.ambiguity, rho = sink.weight * (std::expm1(a) - a);
    for (std::size_t c = 0; c < columns; ++c) {
      group.columns[c] = -sink.weight * a * r.exact[c];
      worst[c] += sink.weight * a * std::fabs(r.exact[c]);
      second[c] += rho * std::fabs(r.exact[c]);
    }
    group.scale = -sink.weight * a * weight;
    scale_second += rho * weight;
    add_group(group);
  }
  const double over_w = std::exp(widest) * (1 + 0x1p-30);
  const double arithmetic = static_cast<double>(visible.size() + 11) * 0x1p-50;
  double arithmetic_total = 0;
  for (std::size_t c = 0; c < columns; ++c) {
    const double own = arithmetic * (magnitudes[c] + std::fabs(r.exact[c]));
    arithmetic_total += own;
    r.s_spread[c] = std::min(std::sqrt(first[c]), worst[c] * (1 + 1e-12) / statistical_lambda) * over_w;
    r.s_second[c] = second[c] * over_w + own;
  }
  r.scale_s_spread = std::sqrt(scale_first) * over_w;
  r.scale_s_second = scale_second * over_w + arithmetic_total;
  r.emulated = true;
  return r;
}

double emulated_weights(std::span<const double> z, std::size_t keys, VisibleWeights& weights) {
  weights.p.assign(keys, 0.0);
  weights.z.assign(keys, 0.0);
  const double top = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (const double score : z) sum += std::exp(score - top);
  for (std::size_t a = 0; a < keys; ++a) {
    weights.p[a] = std::exp(z[a] - top) / sum;
    weights.z[a] = std::fabs(z[a] - top);
  }
  return z.size() > keys ? std::exp(z.back() - top) / sum : 0.0;
}

InsideUnits inside_units(const Tolerance& tolerance, const FloatFormat& output) {
  InsideUnits units;
  if (tolerance.probabilities_in_output > 0)
    units.p =
        (tolerance.probability_format != nullptr ? *tolerance.probability_format : output).unit_roundoff();
  if (tolerance.scores_in_output > 0)
    units.s = (tolerance.score_format != nullptr ? *tolerance.score_format : output).unit_roundoff();
  return units;
}

// The row-scale test (statistical tier). T = sum_c s_c (y_c - o_c) / sum_c |o_c|, s_c = sign(o_c),
// is the row's output scale error seen through its own exact output o. An honest kernel's T is
// its roundings' weighted sum: the output's own rounding (|delta_c| <= u_out |y_c|, one per
// distinct exact value: alike_roundings_noise), P's and the scores' roundings as in RowRounding,
// bounded together by Hoeffding's inequality at lambda (false alarm below 2 exp(-lambda^2 / 2) per
// row, as the bias test of comparison.cpp), plus the second-order parts and the recipe's other
// terms charged in full (each element's statistical allowance without the inside roundings and
// the output rounding, summed with the weights s_c) and the double o_c's own error. A denominator
// off by a factor (summed in bf16, a skipped rescale) moves T by it, sqrt(d) times any element.
RowScaleStat judge_row_scale(const Matrix& actual, std::size_t row, const RowRounding& rounding,
                             std::span<const double> magnitudes, const Tolerance& tolerance,
                             const RowScale& scale, const FloatFormat& output, Comparison& comparison) {
  double weight = 0, deviation = 0, charged = 0, charged_by_keys = 0;
  std::vector<ValueAndBound> outputs;  // exact values, output rounding bounds
  const double u_out = output.unit_roundoff();
  const InsideUnits u = inside_units(tolerance, output);
  Tolerance rest = tolerance;
  rest.probabilities_in_output = rest.scores_in_output = 0;
  // An emulated row's scores are the kernel's own to within their ambiguity (score_emulation.hpp's
  // contract covers every fp32 order of q . k), which `s_spread` and `s_second` charge: the fp32
  // dot products' errors are not charged again. (They were, in full in every column: a row sum kept
  // in bf16 with no LSE passed the default as math_bf16.)
  if (rounding.emulated) rest.dot_product = 0;
  // The scores' fp32 errors may also be charged by Hoeffding over the keys, where their bounds are
  // known (first order; the second order expm1(e) - e <= e_max^2 (1 + e_max) / 2 in full, on
  // sum_c (M_c + |o_c|)); the smaller of the two charges is the row's.
  const bool dot_by_keys = !rounding.emulated && rounding.scale_dot_spread >= 0;
  const double dot_unit = tolerance.dot_product * tolerance.accumulation->unit_roundoff();
  const double dot_max = dot_unit * scale.logit_rounding;
  const double dot_second = dot_max * dot_max * (1 + dot_max) / 2;
  Tolerance rest_by_keys = rest;
  rest_by_keys.dot_product = 0;
  for (std::size_t c = 0; c < actual.cols; ++c) {
    const double o = rounding.exact[c], y = actual(row, c);
    // A non-finite output is judged by the element check (a correct overflow passes there, a wrong
    // one fails): it is left out here, and the rest of the scale test still runs.
    if (!std::isfinite(y)) continue;
    if (o == 0) continue;
    weight += std::fabs(o);
    deviation += o > 0 ? y - o : o - y;
    outputs.push_back({o, u_out * std::fabs(y)});
    const double own = (0x1p-40 + 4 * u.p * u.p) * magnitudes[c];
    charged +=
        allowed_error(rest, magnitudes[c], scale.largest_magnitude, scale, output, Tier::statistical, 0.0) +
        own;
    if (dot_by_keys)
      charged_by_keys += allowed_error(rest_by_keys, magnitudes[c], scale.largest_magnitude, scale, output,
                                       Tier::statistical, 0.0) +
                         own + dot_second * (magnitudes[c] + std::fabs(o));
  }
  if (weight == 0) return {};
  const double growth = std::exp(2.0001 * u.s * scale.largest_score);  // 1 / W and p's own growth
  // Emulated weights are the kernel's own: P's spread needs no growth; the fp32 terms (at the
  // exact row's |z|) get it, as comparison.cpp's inside_charge does.
  const double p_growth = rounding.emulated ? 1.0 : growth;
  if (rounding.emulated) charged *= growth;
  const double p_noise = u.p * rounding.scale_p_spread * p_growth * p_growth;
  // Emulated: the scores' spreads are the ambiguity's, already in their units and over W.
  const double s_noise =
      rounding.emulated ? rounding.scale_s_spread : 2.0001 * u.s * rounding.scale_s_spread * growth;
  const double s_second = rounding.emulated ? rounding.scale_s_second : growth * rounding.scale_s_second;
  const double noise_sq = alike_roundings_noise(outputs) + p_noise * p_noise + s_noise * s_noise;
  RowScaleStat stat{.deviation = deviation,
                    .weight = weight,
                    .noise_sq = noise_sq * (1 + 0x1p-20),
                    .in_full = (s_second + charged) * (1 + 0x1p-20)};
  const auto allowance = [](const RowScaleStat& s) {
    return statistical_lambda * std::sqrt(s.noise_sq) + s.in_full;
  };
  if (dot_by_keys) {
    const double dot_noise = dot_unit * rounding.scale_dot_spread * growth;
    const RowScaleStat by_keys{.deviation = deviation,
                               .weight = weight,
                               .noise_sq = (noise_sq + dot_noise * dot_noise) * (1 + 0x1p-20),
                               .in_full = (s_second + charged_by_keys) * (1 + 0x1p-20)};
    if (allowance(by_keys) < allowance(stat)) stat = by_keys;
  }
  record_row_scale(comparison, row, std::fabs(deviation) / weight, allowance(stat) * (1 + 0x1p-20) / weight);
  return stat;
}

void judge_head_scales(const Matrix& actual, std::span<const RowRounding> roundings, const Matrix& magnitudes,
                       const Tolerance& tolerance, std::span<const RowScale> scales,
                       const FloatFormat& output, bool emulated_only, Comparison& comparison) {
  HeadScale head;
  for (std::size_t i = 0; i < roundings.size(); ++i) {
    if (emulated_only && !roundings[i].emulated) continue;
    head.add(
        judge_row_scale(actual, i, roundings[i], magnitudes.row(i), tolerance, scales[i], output, comparison),
        roundings[i].copies);
  }
  head.judge(comparison);
}

void HeadScale::add(const RowScaleStat& row, double copies) {
  if (row.weight == 0) return;
  ++rows_;
  deviation_ += row.deviation;
  weight_ += row.weight;
  noise_sq_ += copies * row.noise_sq;
  in_full_ += row.in_full;
  if (!(row.noise_sq > 0)) return;  // a row with no noise is judged by its own test alone
  noisy_rows_ += 1 / copies;
  const double beyond = std::max(std::fabs(row.deviation) - row.in_full, 0.0);
  spread_ += beyond * beyond / row.noise_sq / copies;
  relative_sq_ += beyond * beyond / (row.weight * row.weight) / copies;
  allowed_sq_ += row.noise_sq / (row.weight * row.weight) / copies;
}

// The spread test's threshold a for m rows: m/2 (a - 1 - ln a) = lambda^2 / 2, a > 1 (bisection;
// the left side grows with a).
double spread_threshold(std::size_t m) {
  const double target = statistical_lambda * statistical_lambda / static_cast<double>(m);
  double low = 1, high = 2;
  while (high - 1 - std::log(high) < target) high *= 2;
  for (int step = 0; step < 100; ++step) {
    const double middle = (low + high) / 2;
    (middle - 1 - std::log(middle) < target ? low : high) = middle;
  }
  return high;
}

// The pooled scale: every row's deviation is its noise N_r (independent across rows, each
// sub-Gaussian with proxy noise_sq_r, as the row test assumes) plus at most in_full_r, so
// |sum_r deviation_r| > lambda sqrt(sum_r noise_sq_r) + sum_r in_full_r has probability below
// 2 exp(-lambda^2 / 2), the row test's own. The spread: Y_r = max(|deviation_r| - in_full_r, 0) <=
// |N_r|, and for N sub-Gaussian with proxy s^2, E exp(t N^2 / (2 s^2)) <= (1 - t)^(-1/2) for
// 0 <= t < 1 (write exp(t N^2 / (2 s^2)) = E_G exp(sqrt(t) G N / s), G standard normal). By
// Chernoff over the m independent rows, P(sum_r Y_r^2 / noise_sq_r >= m a) <= exp(-m/2 (a - 1 -
// ln a)), which spread_threshold sets to exp(-lambda^2 / 2). The reported ratio is the sum over
// m a; the message gives the rows' relative errors' root mean square beside the noise's.
void HeadScale::judge(Comparison& comparison) const {
  if (rows_ < 2 || weight_ == 0) return;
  const double allowed = (statistical_lambda * std::sqrt(noise_sq_) + in_full_) * (1 + 0x1p-20) / weight_;
  record_scale(comparison, "the " + std::to_string(rows_) + " rows together", std::fabs(deviation_) / weight_,
               allowed);
  const auto distinct = static_cast<std::size_t>(std::llround(noisy_rows_));
  if (distinct < 2) return;
  const auto m = static_cast<double>(distinct);
  const double threshold = spread_threshold(distinct) * (1 + 0x1p-20);
  record_scale_spread(comparison, distinct, std::sqrt(relative_sq_ / m),
                      std::sqrt(threshold * allowed_sq_ / m), spread_ / (m * threshold));
}

// Each element's inside-rounding spreads, in the matrices compare() reads (ComparisonInput).
void store_spreads(const RowRounding& rounding, std::size_t row, InsideSpreads& spreads) {
  for (std::size_t c = 0; c < spreads.p.cols; ++c) {
    spreads.p(row, c) = rounding.p_spread[c];
    spreads.s(row, c) = rounding.s_spread[c];
    spreads.s_second(row, c) = rounding.s_second[c];
  }
}

void judge_gradient_scale(const GradientScaleInput& gradient, const Tolerance& entry, double u_o,
                          const FloatFormat& output, const RowScale& scale, Comparison& comparison) {
  const bool part = gradient.count > 0;
  const auto elements = [&](const Matrix& m) {
    const std::span<const double> all(m.values);
    return part ? all.subspan(gradient.first, gradient.count) : all;
  };
  const ProjectedInput in{.expected = elements(gradient.expected),
                          .actual = elements(gradient.actual),
                          .magnitudes = elements(gradient.magnitudes),
                          .weights = {},
                          .noise = gradient.noise,
                          .accumulated = gradient.accumulated != nullptr ? elements(*gradient.accumulated)
                                                                         : std::span<const double>()};
  const ProjectedStat stat = project_errors(in, entry, u_o, output, scale);
  // An allowance past double's range cannot judge the gradient's scale (the elements' verdicts stand).
  if (stat.weight == 0 || !std::isfinite(statistical_lambda * stat.noise + stat.in_full)) return;
  record_scale(comparison, std::string(gradient.name) + (part ? "" : " as a whole"),
               std::fabs(stat.deviation) / stat.weight,
               (statistical_lambda * stat.noise + stat.in_full) / stat.weight);
}

}  // namespace sharpcheck::metrics
