#include "metrics/backward_magnitudes.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace sharpcheck::metrics {
namespace {

// Entries with z - L below this have P < e^-100: their rounding errors are far below any
// allowance, so they are left out of the units' max |z - L| (which would otherwise grow with a
// mask's size, as tolerance_table.cpp's negligible entries explain for the forward).
constexpr double negligible_gap = 100;

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
    // In long double (a 15-bit exponent) where the products leave double's range: q . k near
    // 2^1026 at theta near 2^1021, or products that underflow at a tiny theta (as the forward's
    // geometry, metrics/evaluate.cpp); the logits over theta are ordinary numbers.
    long double raw = 0, absolute = 0;
    {
      double narrow_raw = 0, narrow_absolute = 0;
      bool underflow = false;
      for (std::size_t t = 0; t < d; ++t) {
        const double product = p.queries(i, t) * p.keys(j, t);
        narrow_raw += product;
        narrow_absolute += std::fabs(product);
        underflow = underflow || (product == 0 && p.queries(i, t) != 0 && p.keys(j, t) != 0);
      }
      raw = narrow_raw;
      absolute = narrow_absolute;
      if (underflow || !(narrow_absolute * static_cast<double>(d + 8) < 0x1p1000) ||
          (narrow_absolute != 0 && narrow_absolute < 0x1p-960)) {
        raw = absolute = 0;
        for (std::size_t t = 0; t < d; ++t) {
          const long double product = static_cast<long double>(p.queries(i, t)) * p.keys(j, t);
          raw += product;
          absolute += std::fabs(product);
        }
      }
    }
    long double s = raw * scale, slope = scale;
    if (head.softcap != 0) {
      const long double t = std::tanh(s / head.softcap);
      s = head.softcap * t;
      slope = scale * (1 - t * t);
    }
    // A bias is rounded to the kernel's format and added: errors u |b| and u |s + b|, the second
    // within the 4 |z| below, the first charged as 2 |b / theta|.
    const double bias = head.has_bias() ? head.bias_of(i % p.positions(), j) : 0.0;
    const long double theta = head.theta;
    g.z.push_back(static_cast<double>((s + bias) / theta));
    g.slope.push_back(static_cast<double>(std::fabs(slope / theta)));
    top = std::max(top, g.z.back());
    m.logit_rounding =
        std::max(m.logit_rounding,
                 static_cast<double>(static_cast<long double>(d) * absolute * std::fabs(scale / theta)) +
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
// roundings through dS_ij (their squared bound `pair`, as in magnitudes_of) and of P_ij, and the
// fp32 arithmetic's errors (relative to mag and to P_ij), projected on the expected gradients'
// signs; the row's shares (`row`, squared and summed when the row ends) accumulate their
// absolute projections. Returns the projection of dK's signs, which D's error in row i moves through.
struct ScaleRow {
  double dq = 0, dk = 0, dv = 0;
};
// One (i, j) pair's charges: its squared pair bound, its magnitude and its weight P_ij.
struct PairCharges {
  std::size_t i = 0, j = 0;
  double pair = 0, mag = 0, weight = 0;
};
double add_scale_terms(const kernels::BackwardProblem& p, const reference::AttentionGradients& e,
                       const PairCharges& charges, Magnitudes& m, ScaleRow& row) {
  const auto& [i, j, pair, mag, weight] = charges;
  double on_dq = 0, on_dk = 0, on_dv = 0;
  for (std::size_t t = 0; t < p.queries.cols; ++t) {
    on_dq += sign_of(e.d_queries(i, t)) * p.keys(j, t);
    on_dk += sign_of(e.d_keys(j, t)) * p.queries(i, t);
  }
  for (std::size_t c = 0; c < p.values.cols; ++c) on_dv += sign_of(e.d_values(j, c)) * p.d_out(i, c);
  m.dq_scale_inside += pair * on_dq * on_dq;
  m.dk_scale_inside += pair * on_dk * on_dk;
  m.dv_scale_inside += weight * weight * on_dv * on_dv;
  m.dq_scale_pairs += mag * mag * on_dq * on_dq;
  m.dk_scale_pairs += mag * mag * on_dk * on_dk;
  m.dv_scale_pairs += weight * weight * on_dv * on_dv;
  row.dq += mag * std::fabs(on_dq);
  row.dk += mag * std::fabs(on_dk);
  row.dv += weight * std::fabs(on_dv);
  return on_dk;
}

// The magnitudes' matrices, zero, sized for the problem (the scores' only when a recipe rounds them).
Magnitudes allocated(const kernels::BackwardProblem& p, double u_s) {
  const std::size_t mq = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  Magnitudes m;
  for (Matrix* matrix : {&m.dq, &m.dq_from_d, &m.dq_spread, &m.dq_floor}) *matrix = Matrix(mq, d);
  for (Matrix* matrix : {&m.dk, &m.dk_from_d, &m.dk_spread, &m.dk_floor}) *matrix = Matrix(n, d);
  for (Matrix* matrix : {&m.dv, &m.dv_spread, &m.dv_floor}) *matrix = Matrix(n, dv);
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
  for (Matrix* matrix : {&m.dq, &m.dk, &m.dv, &m.dq_from_d, &m.dk_from_d, &m.d_rows, &m.d_rows_from_o,
                         &m.d_sinks, &m.dq_floor, &m.dk_floor, &m.dv_floor, &m.d_sinks_from_d,
                         &m.dq_scores_second, &m.dk_scores_second, &m.dv_scores_second}) {
    for (double& x : matrix->values) x *= 1 + 1e-9;
  }
  for (Matrix* matrix :
       {&m.dq_spread, &m.dk_spread, &m.dv_spread, &m.dq_scores, &m.dk_scores, &m.dv_scores}) {
    for (double& x : matrix->values) x = std::sqrt(x) * (1 + 1e-9);
  }
}

// Row i's sums over its visible keys: P_ij (weight), sum_c |dO_ic v_jc| and dP_ij, A_i, the
// exact D_i and B_i = sum_c |dO_ic O_ic| (O in double: its error, below 1e-12 A_i, is added).
struct RowBuffers {
  std::vector<double> weight, dp_mag, dp_signed, out_row;
};
struct RowSums {
  double a_i = 0, b_i = 0, exact_d = 0;
};

RowSums row_sums(const kernels::BackwardProblem& p, std::size_t i, const std::vector<std::size_t>& visible,
                 const RowGeometry& g, RowBuffers& r) {
  const std::size_t dv = p.values.cols;
  RowSums sums;
  r.weight.assign(visible.size(), 0);
  r.dp_mag.assign(visible.size(), 0);
  r.dp_signed.assign(visible.size(), 0);
  r.out_row.assign(dv, 0);
  for (std::size_t a = 0; a < visible.size(); ++a) {
    r.weight[a] = std::exp(g.z[a] - g.lse);
    for (std::size_t c = 0; c < dv; ++c) {
      r.dp_mag[a] += std::fabs(p.d_out(i, c) * p.values(visible[a], c));
      r.dp_signed[a] += p.d_out(i, c) * p.values(visible[a], c);
      r.out_row[c] += r.weight[a] * p.values(visible[a], c);
    }
    sums.a_i += r.weight[a] * r.dp_mag[a];
    sums.exact_d += r.weight[a] * r.dp_signed[a];
  }
  for (std::size_t c = 0; c < dv; ++c) sums.b_i += std::fabs(p.d_out(i, c) * r.out_row[c]);
  sums.b_i += 1e-12 * sums.a_i;
  return sums;
}

// One (i, j) pair's share of every gradient element's magnitude, D term, spread and floor.
struct PairTerms {
  double mag, from_d, pair, slope, weight;
};

void add_pair(const kernels::BackwardProblem& p, std::size_t i, std::size_t j, const PairTerms& x,
              Magnitudes& m) {
  for (std::size_t t = 0; t < p.queries.cols; ++t) {
    const double k = p.keys(j, t), q = p.queries(i, t);
    m.dq(i, t) += x.mag * std::fabs(k);
    m.dk(j, t) += x.mag * std::fabs(q);
    m.dq_spread(i, t) += x.pair * k * k;
    m.dk_spread(j, t) += x.pair * q * q;
    m.dq_from_d(i, t) += x.from_d * std::fabs(k);
    m.dk_from_d(j, t) += x.from_d * std::fabs(q);
    m.dq_floor(i, t) += x.slope * std::fabs(k);
    m.dk_floor(j, t) += x.slope * std::fabs(q);
  }
  for (std::size_t c = 0; c < p.values.cols; ++c) {
    const double o = p.d_out(i, c);
    m.dv_floor(j, c) += std::fabs(o);
    m.dv(j, c) += x.weight * std::fabs(o);
    m.dv_spread(j, c) += x.weight * x.weight * o * o;
  }
}

}  // namespace

Magnitudes magnitudes_of(const kernels::BackwardProblem& p, const reference::AttentionGradients& e,
                         double u_s, double u_i, double roundings) {
  const std::size_t mq = p.queries.rows, d = p.queries.cols;
  const std::size_t positions = p.positions();
  Magnitudes m = allocated(p, u_s);
  std::vector<std::size_t> visible;
  RowBuffers sums_buffer;
  std::vector<double> signed_dq(d);
  tensor::HeadScores row_head;  // row i: head i / positions, at position i mod positions
  for (std::size_t i = 0; i < mq; ++i) {
    const std::size_t h = i / positions;
    if (i % positions == 0) row_head = p.head(h);
    row_head.visible_keys(i % positions, visible);
    if (visible.empty() && !row_head.sink) continue;
    const RowGeometry g = row_geometry(p, row_head, i, visible, m);
    const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[i]);
    const RowSums sums = row_sums(p, i, visible, g, sums_buffer);
    const double a_i = sums.a_i, b_i = sums.b_i, exact_d = sums.exact_d;
    const std::vector<double>& weight = sums_buffer.weight;
    const std::vector<double>& dp_mag = sums_buffer.dp_mag;
    const std::vector<double>& dp_signed = sums_buffer.dp_signed;
    const double signed_lse_gradient = p.d_lse.empty() ? 0.0 : p.d_lse[i];
    m.d_rows(i, 0) = a_i;
    m.d_rows_from_o(i, 0) = b_i;
    std::fill(signed_dq.begin(), signed_dq.end(), 0.0);
    double d_on_dk = 0;  // D's error in row i projected on dK's signs, over u_o B_i
    ScaleRow scale_row;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const std::size_t j = visible[a];
      const double mag = weight[a] * (dp_mag[a] + a_i + lse_gradient) * g.slope[a];
      const double from_d = weight[a] * b_i * g.slope[a];
      // dS's rounding (by the exact |dS|, in double: 1e-9 of mag covers its own error) and the
      // other k - 1 intermediates' (by mag): the squared bound of one (i, j) pair's roundings.
      const double ds =
          weight[a] * std::fabs(dp_signed[a] - exact_d + signed_lse_gradient) * g.slope[a] + 1e-9 * mag;
      const double pair = roundings >= 1 ? ds * ds + (roundings - 1) * mag * mag : 0.0;
      d_on_dk += weight[a] * g.slope[a] *
                 add_scale_terms(p, e, {.i = i, .j = j, .pair = pair, .mag = mag, .weight = weight[a]}, m,
                                 scale_row);
      for (std::size_t t = 0; t < d; ++t) signed_dq[t] += weight[a] * g.slope[a] * p.keys(j, t);
      add_pair(p, i, j, {mag, from_d, pair, g.slope[a], weight[a]}, m);
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
    m.dq_scale_rows += scale_row.dq * scale_row.dq;
    m.dk_scale_rows += scale_row.dk * scale_row.dk;
    m.dv_scale_rows += scale_row.dv * scale_row.dv;
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

}  // namespace sharpcheck::metrics
