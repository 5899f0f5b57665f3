#include "metrics/judge_backward.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "reference/softmax_backward.hpp"

namespace sharpcheck::metrics {
namespace {

// Entries with z - L below this have P < e^-100: their rounding errors are far below any
// allowance, so they are left out of the units' max |z - L| (which would otherwise grow with a
// mask's size, as tolerance_table.cpp's negligible entries explain for the forward).
constexpr double negligible_gap = 100;

struct Magnitudes {
  Matrix dq, dk, dv;
  Matrix d_sinks;  // group x 1
  // What an error of D_i by u_out sum_c |dO_ic O_ic| (O rounded to the format) moves each
  // gradient by, over u_out: dV does not depend on D.
  Matrix dq_from_d, dk_from_d;
  Matrix d_sinks_from_d;
  Matrix d_rows, d_rows_from_o;  // D_i's own: A_i, and B_i = sum_c |dO_ic O_ic|
  // The statistical spreads of a recipe's intermediate roundings (metrics/recipes.cpp): the sums of
  // squares under each gradient's magnitude, sum_j (bound of dS_ij dz/dr)^2 k_jc^2 for dQ, the same
  // over queries with q_ic for dK, sum_i P_ij^2 dO_ic^2 for dV (square roots taken at the end).
  Matrix dq_spread, dk_spread, dv_spread;
  // The gradient-scale test's sums of squares (judge_gradient_scale): the intermediate roundings
  // projected on each gradient's signs, and D's errors (one per query row) likewise.
  double dq_scale_inside = 0, dk_scale_inside = 0, dv_scale_inside = 0;
  double dq_scale_from_d = 0, dk_scale_from_d = 0;
  // A recipe's score roundings (add_score_terms), per element: the Hoeffding spread (over
  // 2.0001 u_S) and the second-order part; empty when the recipe keeps the scores in fp32. And the
  // largest |z| of a non-negligible pair.
  Matrix dq_scores, dk_scores, dv_scores, dq_scores_second, dk_scores_second, dv_scores_second;
  double largest_z = 0;
  double logit_rounding = 0, largest_lse = 0, largest_gap = 0;
};

// The row's logits z, slopes dz/dr and the roundings of the logits, in double.
struct RowGeometry {
  std::vector<double> z, slope;
  double lse = -INFINITY;
};

RowGeometry row_geometry(const kernels::BackwardProblem& p, const tensor::HeadScores& head, std::size_t i,
                         const std::vector<std::size_t>& visible, Magnitudes& m) {
  const std::size_t d = p.queries.cols;
  const double scale = head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(d));
  RowGeometry g;
  double top = head.sink ? *head.sink / head.theta : -INFINITY;
  for (const std::size_t j : visible) {
    double raw = 0, absolute = 0;
    for (std::size_t t = 0; t < d; ++t) {
      raw += p.queries(i, t) * p.keys(j, t);
      absolute += std::fabs(p.queries(i, t) * p.keys(j, t));
    }
    double s = raw * scale, slope = scale;
    if (head.softcap != 0) {
      const double t = std::tanh(s / head.softcap);
      s = head.softcap * t;
      slope = scale * (1 - t * t);
    }
    // A bias is rounded to the kernel's format and added: errors u |b| and u |s + b|, the second
    // within the 4 |z| below, the first charged as 2 |b / theta|.
    const double bias = head.has_bias() ? head.bias_of(i % p.positions(), j) : 0.0;
    g.z.push_back((s + bias) / head.theta);
    g.slope.push_back(std::fabs(slope / head.theta));
    top = std::max(top, g.z.back());
    m.logit_rounding =
        std::max(m.logit_rounding, static_cast<double>(d) * absolute * std::fabs(scale / head.theta) +
                                       4 * std::fabs(g.z.back()) + 2 * std::fabs(bias / head.theta));
  }
  double sum = head.sink ? std::exp(*head.sink / head.theta - top) : 0.0;
  for (const double z : g.z) sum += std::exp(z - top);
  g.lse = top + std::log(sum);
  m.largest_lse = std::max(m.largest_lse, std::fabs(g.lse));
  for (const double z : g.z) {
    if (z - g.lse > -negligible_gap) m.largest_gap = std::max(m.largest_gap, g.lse - z);
  }
  return g;
}

// The magnitudes kernels/tolerance.hpp defines, in double (relative error below 1e-12 for the
// sizes judged, covered by the 1e-9 they are inflated by).
// One query row's terms, as magnitudes_of computed them.
struct RowTerms {
  std::span<const std::size_t> visible;
  const RowGeometry& g;
  std::span<const double> weight, dp_mag, signed_dq;
  double a_i = 0, lse_gradient = 0;
};

// The scores' roundings e_ij (|e_ij| <= eps_ij = 2.0001 u_S |z_ij|, independent) of a recipe that
// rounds them (PyTorch's math path). To first order P_ij moves by P_ij (e_ij - e_i), e_i =
// sum_k P_ik e_ik, and D_i by sum_j e_ij P_ij (dP_ij - D_i), so each gradient element is a linear
// form in the e's whose coefficient for e_ik is bounded by three terms: for dQ_ic,
// mag_ik |k_kc| (direct), P_ik M_ic (through e_i) and P_ik (|dP_ik| + A_i) |sum_j P_ij dz/dr k_jc|
// (through D_i); for dK_kc, over the rows i, mag_ik |q_ic| (direct, e_ik), mag_ik |q_ic| P_ij
// and P_ik dz/dr |q_ic| P_ij (|dP_ij| + A_i) (every e_ij); for dV_jc, P_ij |dO_ic| (direct) and
// P_ij |dO_ic| P_ik (every e_ik). With (a + b + c)^2 <= 3 (a^2 + b^2 + c^2), Hoeffding's spread
// is the square root of the sums below (times 2.0001 u_S). Beyond first order, each P_ij moves
// by at most sigma_i P_ij, sigma_i = 3 exp(2 eps_i) (expm1(eps_i) - eps_i + eps_i^2), eps_i the
// row's largest: charged in full as 3 sigma_i times each gradient's magnitude terms.
void add_score_terms(const kernels::BackwardProblem& p, std::size_t i, const RowTerms& r, double u_s,
                     Magnitudes& m) {
  const std::size_t d = p.queries.cols, dv = p.values.cols;
  double b = 0, c = 0, largest = 0;
  for (std::size_t a = 0; a < r.visible.size(); ++a) {
    if (r.weight[a] == 0) continue;  // a huge additive mask: nothing moves, and |z| would overflow
    const double zp = r.g.z[a] * r.weight[a];
    b += zp * zp;
    c += zp * zp * (r.dp_mag[a] + r.a_i) * (r.dp_mag[a] + r.a_i);
    if (r.g.z[a] - r.g.lse > -negligible_gap) largest = std::max(largest, std::fabs(r.g.z[a]));
  }
  m.largest_z = std::max(m.largest_z, largest);
  const double eps = 2.0001 * u_s * largest;
  const double sigma = 3 * std::exp(2 * eps) * (std::expm1(eps) - eps + eps * eps);
  for (std::size_t a = 0; a < r.visible.size(); ++a) {
    if (r.weight[a] == 0) continue;
    const std::size_t j = r.visible[a];
    const double mag = r.weight[a] * (r.dp_mag[a] + r.a_i + r.lse_gradient) * r.g.slope[a];
    const double via_d = r.weight[a] * r.g.slope[a];
    const double z2 = r.g.z[a] * r.g.z[a];
    for (std::size_t t = 0; t < d; ++t) {
      const double k = p.keys(j, t), q = p.queries(i, t);
      m.dq_scores(i, t) += 3 * z2 * mag * mag * k * k;
      m.dk_scores(j, t) += 3 * q * q * (z2 * mag * mag + mag * mag * b + via_d * via_d * c);
      m.dk_scores_second(j, t) += 3 * sigma * mag * std::fabs(q);
    }
    for (std::size_t col = 0; col < dv; ++col) {
      const double o = p.d_out(i, col);
      m.dv_scores(j, col) += 2 * r.weight[a] * r.weight[a] * o * o * (z2 + b);
      m.dv_scores_second(j, col) += sigma * r.weight[a] * std::fabs(o);
    }
  }
  for (std::size_t t = 0; t < d; ++t) {  // the terms through e_i and D_i, with the row's M_ic
    m.dq_scores(i, t) += 3 * (m.dq(i, t) * m.dq(i, t) * b + r.signed_dq[t] * r.signed_dq[t] * c);
    m.dq_scores_second(i, t) = 3 * sigma * m.dq(i, t);
  }
}

// Sign of an expected gradient element (0 for 0): the weights of the gradient-scale statistic.
double sign_of(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }

// Row i's pair (i, j)'s share of the gradient-scale sums (judge_gradient_scale): the intermediate
// roundings of dS_ij (bounded by `mag`) and of P_ij, projected on the expected gradients' signs.
// Returns the projection of dK's signs, which D's error in row i moves through.
double add_scale_terms(const kernels::BackwardProblem& p, const reference::AttentionGradients& e,
                       std::size_t i, std::size_t j, double mag, double weight, Magnitudes& m) {
  double on_dq = 0, on_dk = 0, on_dv = 0;
  for (std::size_t t = 0; t < p.queries.cols; ++t) {
    on_dq += sign_of(e.d_queries(i, t)) * p.keys(j, t);
    on_dk += sign_of(e.d_keys(j, t)) * p.queries(i, t);
  }
  for (std::size_t c = 0; c < p.values.cols; ++c) on_dv += sign_of(e.d_values(j, c)) * p.d_out(i, c);
  m.dq_scale_inside += mag * mag * on_dq * on_dq;
  m.dk_scale_inside += mag * mag * on_dk * on_dk;
  m.dv_scale_inside += weight * weight * on_dv * on_dv;
  return on_dk;
}

// The magnitudes' matrices, zero, sized for the problem (the scores' only when a recipe rounds them).
Magnitudes allocated(const kernels::BackwardProblem& p, double u_s) {
  const std::size_t mq = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  Magnitudes m;
  for (Matrix* matrix : {&m.dq, &m.dq_from_d, &m.dq_spread}) *matrix = Matrix(mq, d);
  for (Matrix* matrix : {&m.dk, &m.dk_from_d, &m.dk_spread}) *matrix = Matrix(n, d);
  for (Matrix* matrix : {&m.dv, &m.dv_spread}) *matrix = Matrix(n, dv);
  for (Matrix* matrix : {&m.d_sinks, &m.d_sinks_from_d}) *matrix = Matrix(p.group, 1);
  for (Matrix* matrix : {&m.d_rows, &m.d_rows_from_o}) *matrix = Matrix(mq, 1);
  if (u_s > 0) {
    for (Matrix* matrix : {&m.dq_scores, &m.dq_scores_second}) *matrix = Matrix(mq, d);
    for (Matrix* matrix : {&m.dk_scores, &m.dk_scores_second}) *matrix = Matrix(n, d);
    for (Matrix* matrix : {&m.dv_scores, &m.dv_scores_second}) *matrix = Matrix(n, dv);
  }
  return m;
}

// Inflates the sums by their double rounding (1e-9 covers it) and takes the spreads' square roots.
void finish(Magnitudes& m) {
  for (Matrix* matrix :
       {&m.dq, &m.dk, &m.dv, &m.dq_from_d, &m.dk_from_d, &m.d_rows, &m.d_rows_from_o, &m.d_sinks,
        &m.d_sinks_from_d, &m.dq_scores_second, &m.dk_scores_second, &m.dv_scores_second}) {
    for (double& x : matrix->values) x *= 1 + 1e-9;
  }
  for (Matrix* matrix :
       {&m.dq_spread, &m.dk_spread, &m.dv_spread, &m.dq_scores, &m.dk_scores, &m.dv_scores}) {
    for (double& x : matrix->values) x = std::sqrt(x) * (1 + 1e-9);
  }
}

Magnitudes magnitudes_of(const kernels::BackwardProblem& p, const reference::AttentionGradients& e,
                         double u_s, double u_i) {
  const std::size_t mq = p.queries.rows, d = p.queries.cols, dv = p.values.cols;
  const std::size_t positions = p.positions();
  Magnitudes m = allocated(p, u_s);
  std::vector<std::size_t> visible;
  std::vector<double> weight, dp_mag, out_row, signed_dq(d);
  tensor::HeadScores row_head;  // row i: head i / positions, at position i mod positions
  for (std::size_t i = 0; i < mq; ++i) {
    const std::size_t h = i / positions;
    if (i % positions == 0) row_head = p.head(h);
    row_head.visible_keys(i % positions, visible);
    if (visible.empty() && !row_head.sink) continue;
    const RowGeometry g = row_geometry(p, row_head, i, visible, m);
    const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[i]);
    double a_i = 0, b_i = 0;
    weight.assign(visible.size(), 0);
    dp_mag.assign(visible.size(), 0);
    out_row.assign(dv, 0);
    for (std::size_t a = 0; a < visible.size(); ++a) {
      weight[a] = std::exp(g.z[a] - g.lse);
      for (std::size_t c = 0; c < dv; ++c) {
        dp_mag[a] += std::fabs(p.d_out(i, c) * p.values(visible[a], c));
        out_row[c] += weight[a] * p.values(visible[a], c);
      }
      a_i += weight[a] * dp_mag[a];
    }
    // B_i = sum_c |dO_ic O_ic|, O in double: its error, below 1e-12 A_i, is added.
    for (std::size_t c = 0; c < dv; ++c) b_i += std::fabs(p.d_out(i, c) * out_row[c]);
    b_i += 1e-12 * a_i;
    m.d_rows(i, 0) = a_i;
    m.d_rows_from_o(i, 0) = b_i;
    std::fill(signed_dq.begin(), signed_dq.end(), 0.0);
    double d_on_dk = 0;  // D's error in row i projected on dK's signs, over u_o B_i
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const std::size_t j = visible[a];
      const double mag = weight[a] * (dp_mag[a] + a_i + lse_gradient) * g.slope[a];
      const double from_d = weight[a] * b_i * g.slope[a];
      d_on_dk += weight[a] * g.slope[a] * add_scale_terms(p, e, i, j, mag, weight[a], m);
      for (std::size_t t = 0; t < d; ++t) signed_dq[t] += weight[a] * g.slope[a] * p.keys(j, t);
      for (std::size_t t = 0; t < d; ++t) {
        m.dq(i, t) += mag * std::fabs(p.keys(j, t));
        m.dk(j, t) += mag * std::fabs(p.queries(i, t));
        m.dq_spread(i, t) += mag * mag * p.keys(j, t) * p.keys(j, t);
        m.dk_spread(j, t) += mag * mag * p.queries(i, t) * p.queries(i, t);
        m.dq_from_d(i, t) += from_d * std::fabs(p.keys(j, t));
        m.dk_from_d(j, t) += from_d * std::fabs(p.queries(i, t));
      }
      for (std::size_t c = 0; c < dv; ++c) {
        m.dv(j, c) += weight[a] * std::fabs(p.d_out(i, c));
        m.dv_spread(j, c) += weight[a] * weight[a] * p.d_out(i, c) * p.d_out(i, c);
      }
    }
    // D's error delta_i moves dQ_i by exactly delta_i sum_j P_ij dz/dr k_j (first order; its
    // products with P's own error, below 2^-10, and with dS's rounding to the recipe's
    // intermediate format, u_i, are kept as slack on the unsigned sum).
    double on_dq = 0;
    for (std::size_t t = 0; t < d; ++t) {
      m.dq_from_d(i, t) = b_i * std::fabs(signed_dq[t]) + (u_i + 0x1p-10) * m.dq_from_d(i, t);
      on_dq += sign_of(e.d_queries(i, t)) * signed_dq[t];
    }
    m.dq_scale_from_d += b_i * b_i * on_dq * on_dq;
    if (u_s > 0) add_score_terms(p, i, {visible, g, weight, dp_mag, signed_dq, a_i, lse_gradient}, u_s, m);
    m.dk_scale_from_d += b_i * b_i * d_on_dk * d_on_dk;
    if (row_head.sink) {
      const double sink_weight =
          std::exp(*row_head.sink / row_head.theta - g.lse) / std::fabs(row_head.theta);
      m.d_sinks(h, 0) += sink_weight * (a_i + lse_gradient);
      m.d_sinks_from_d(h, 0) += sink_weight * b_i;
    }
  }
  finish(m);
  return m;
}

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
};

// The statistical tier charges a recipe's k intermediate roundings (each an independent rounding
// of a term bounded by the magnitude's terms) as lambda u_i sqrt(k) spread (Hoeffding; each
// rounding's own spread is at most `spread`, and k of them at most sqrt(k) times it).
Matrix scaled_spread(const Matrix& spread, double roundings) {
  Matrix scaled = spread;
  for (double& x : scaled.values) x *= std::sqrt(roundings);
  return scaled;
}

Comparison compare_gradient(const Matrix& expected, const Matrix& actual, const GradientBound& bound,
                            double from_d_scale, const Tolerance& tolerance, const FloatFormat& output,
                            std::size_t length, double largest_score) {
  const Matrix& magnitudes = bound.magnitudes;
  const Matrix& from_d = bound.from_d;
  const Matrix zeros(expected.rows, expected.cols);
  Matrix additional(expected.rows, expected.cols);
  for (std::size_t e = 0; e < additional.values.size(); ++e)
    additional.values[e] = from_d_scale * from_d.values[e] * (1 + 0x1p-20);
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
    inside.p = scaled_spread(*bound.spread, tolerance.probabilities_in_output);
    input.inside = &inside;
  }
  if (bound.scores != nullptr && bound.scores->cols > 0 && tolerance.scores_in_output > 0) {
    inside.s = *bound.scores;
    inside.s_second = *bound.scores_second;
    input.inside = &inside;
  }
  return compare(input, tolerance, output);
}

// The gradient-scale test (statistical tier), the backward's row-scale test: over one gradient of
// a group, T = sum s_e (y_e - e_e) / sum |e_e| (s_e the sign of the correctly rounded e_e). Honest
// kernels' T is a weighted sum of independent roundings: the kernel's and the reference's output
// roundings (u_out |y|, u_out |e|), the recipe's k intermediate roundings of each (i, j) pair and
// D's error in each row (projected on the signs in magnitudes_of), bounded together by
// Hoeffding's inequality at lambda; plus every element's other terms (its statistical allowance
// without the intermediates' and D's charges) in full. A kernel that scales a gradient (dQ scaled
// at batch >= 2, a softmax scale applied twice) moves T by the scale, over sqrt(elements) more
// than any one element shows it.
struct ScaleNoise {
  double inside = 0;  // sum of squares of the intermediate roundings' projections (over u_i^2)
  double from_d = 0;  // the same for D's errors (over u_o^2)
};

void judge_gradient_scale(const char* name, const Matrix& expected, const Matrix& actual,
                          const Matrix& magnitudes, const ScaleNoise& noise, const Tolerance& entry,
                          double u_o, const FloatFormat& output, const RowScale& scale,
                          Comparison& comparison) {
  Tolerance rest = entry;
  const double u_i =
      entry.probabilities_in_output > 0
          ? (entry.probability_format != nullptr ? *entry.probability_format : output).unit_roundoff()
          : 0.0;
  rest.probabilities_in_output = 0;
  const double u_out = output.unit_roundoff();
  double weight = 0, deviation = 0, roundings = 0, charged = 0;
  for (std::size_t x = 0; x < expected.values.size(); ++x) {
    const double e = expected.values[x], y = actual.values[x];
    if (!std::isfinite(y)) return;  // the element check has failed it already
    weight += std::fabs(e);
    deviation += e > 0 ? y - e : (e < 0 ? e - y : 0.0);
    roundings += u_out * u_out * (y * y + e * e);
    charged += allowed_error(rest, magnitudes.values[x], 0.0, scale, output, Tier::statistical, 0.0);
  }
  if (weight == 0) return;
  const double variance =
      roundings + u_i * u_i * entry.probabilities_in_output * noise.inside + u_o * u_o * noise.from_d;
  const double allowed = (statistical_lambda * std::sqrt(variance) + charged) * (1 + 0x1p-20) / weight;
  record_scale(comparison, std::string(name) + " as a whole", std::fabs(deviation) / weight, allowed);
}

}  // namespace

bool BackwardJudgement::passed() const {
  return d_queries.passed() && d_keys.passed() && d_values.passed() && (!d_sink || d_sink->passed()) &&
         (!d_rows || d_rows->passed());
}

std::string BackwardJudgement::describe_worst() const {
  const Comparison* worst = &d_queries;
  const char* name = "dQ";
  for (const auto& [candidate, label] : {std::pair{&d_keys, "dK"}, std::pair{&d_values, "dV"}}) {
    if (!(candidate->max_bound_ratio <= worst->max_bound_ratio)) {
      worst = candidate;
      name = label;
    }
  }
  if (d_sink && !(d_sink->max_bound_ratio <= worst->max_bound_ratio)) {
    worst = &*d_sink;
    name = "dsink";
  }
  if (d_rows && !(d_rows->max_bound_ratio <= worst->max_bound_ratio)) {
    worst = &*d_rows;
    name = "D";
  }
  return std::string(name) + " " + worst->worst.describe();
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
  const Magnitudes m = magnitudes_of(p, judgement.expected, u_s, u_i);
  Tolerance entry;
  entry.accumulation = &fp32;
  entry.constant = tolerance.logit * m.logit_rounding + tolerance.lse * (m.largest_lse + m.largest_gap) +
                   tolerance.dims * static_cast<double>(p.queries.cols + p.values.cols) + tolerance.constant;
  entry.per_item = tolerance.length;
  // A recipe's roundings of P, dP and dS (each at most its format's u times the gradient's
  // magnitude) and of the scores (metrics/recipes.cpp).
  entry.probabilities_in_output = tolerance.intermediates;
  entry.scores_in_output = tolerance.score_roundings;
  entry.probability_format = entry.score_format = tolerance.intermediate_format;
  // max |s / theta|: measured where the recipe rounds the scores, else bounded by |L| + |z - L|.
  const double score = u_s > 0 ? m.largest_z : m.largest_lse + m.largest_gap;
  const std::size_t length = std::max(p.queries.rows, p.keys.rows);
  // O kept in the kernel's format: the output's, or a recipe's coarser intermediate format (bf16
  // inputs with fp32 gradients keep O in bf16).
  const double o_unit = tolerance.intermediate_format != nullptr
                            ? std::max(tolerance.intermediate_format->unit_roundoff(), output.unit_roundoff())
                            : output.unit_roundoff();
  const double units = tolerance.output_units * o_unit;
  const auto& e = judgement.expected;
  judgement.d_queries = compare_gradient(e.d_queries, actual.d_queries,
                                         {m.dq, m.dq_from_d, &m.dq_spread, &m.dq_scores, &m.dq_scores_second},
                                         units, entry, output, length, score);
  judgement.d_keys = compare_gradient(e.d_keys, actual.d_keys,
                                      {m.dk, m.dk_from_d, &m.dk_spread, &m.dk_scores, &m.dk_scores_second},
                                      units, entry, output, length, score);
  const Matrix no_d(e.d_values.rows, e.d_values.cols);
  judgement.d_values = compare_gradient(e.d_values, actual.d_values,
                                        {m.dv, no_d, &m.dv_spread, &m.dv_scores, &m.dv_scores_second}, units,
                                        entry, output, length, score);
  RowScale scale;
  scale.n = length;
  scale.largest_score = score;
  judge_gradient_scale("dQ", e.d_queries, actual.d_queries, m.dq, {m.dq_scale_inside, m.dq_scale_from_d},
                       entry, units, output, scale, judgement.d_queries);
  judge_gradient_scale("dK", e.d_keys, actual.d_keys, m.dk, {m.dk_scale_inside, m.dk_scale_from_d}, entry,
                       units, output, scale, judgement.d_keys);
  judge_gradient_scale("dV", e.d_values, actual.d_values, m.dv, {m.dv_scale_inside, 0.0}, entry, units,
                       output, scale, judgement.d_values);
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
