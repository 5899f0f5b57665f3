#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "metrics/backward_pair_block.hpp"

namespace sharpcheck::metrics::backward_blocks {

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
//
// Per block: each row's b, c and largest |z|, each pair's coefficients, one product per sum, then
// the row terms through e_i and D_i.

// The scores' roundings in the gradient-scale test's statistic T = sum_x s_x (y_x - e_x) (s_x the
// sign of e_x), per row i; e_ij the rounding of z_ij, |e_ij| <= eps_ij = 2.0001 u_S |z_ij|.
//
// Exactly, P^_ij = P_ij exp(e_ij) / W_i, W_i = sum_k P_ik exp(e_ik) (+ the sink's unmoved share).
// With exp(e) = 1 + e + rho, 0 <= rho <= rho_ij = expm1(eps_ij) - eps_ij, E_i = sum_k P_ik eps_ik,
// R_i = sum_k P_ik rho_ik and e_i = sum_k P_ik e_ik: P^_ij / P_ij = 1 + (e_ij - e_i) + r_ij, where
// r_ij W_i = rho_ij - rho_i - (e_i + rho_i)(e_ij - e_i), so |r_ij| <= (max(rho_ij, R_i) + (E_i +
// R_i)(eps_ij + E_i)) / (1 - E_i) = r^_ij (W_i >= 1 + e_i >= 1 - E_i; E_i < 1/2 is required).
//
// First order, in z units: dS_ij = P_ij (dP_ij - D_i + g_i) (g: the LSE's gradient) moves by
// dS_ij (e_ij - e_i) - P_ij dD_i, dD_i = sum_k e_ik s0_ik, s0_ik = P_ik (dP_ik - D_i). dQ and dK
// are sum_ij dz/dr dS_ij times k_jc (resp. q_ic), so with on_ij the pair's projection on the
// gradient's signs (block_scale_terms), A_i = sum_j dz/dr on_ij dS_ij and B_i = sum_j dz/dr on_ij
// P_ij, e_ik's coefficient in T is dz/dr on_ik dS_ik - P_ik A_i - s0_ik B_i (exact, not a bound);
// dV = sum_i P_ij dO_ic: P_ik (on_ik - C_i), C_i = sum_j P_ij on_ij. Hoeffding's sum is
// sum_ik coefficient^2 z_ik^2; 1e-9 of the terms' absolute sums covers the double arithmetic.
//
// Beyond first order, charged in full: dS^ - dS - (first order) = dS r - P dD2 - P (e - e_i + r)
// dD, with |dD2_i| <= sum_k P_ik r^_ik |dP_ik| = d2_i and |dD_i| <= sum_k eps_ik |s0_ik| + d2_i,
// each pair's bound times |dz/dr on_ij| summed (dV: P_ij r^_ij |on_ij|).
//
// The other roundings' coefficients (P's, dP's, dS's rounding and the fp32 errors, bounded by
// P_ij, mag_ij and |dS_ij|) are those of the perturbed P^, A^, dS^: P^ <= f P and A^ <= f A with
// f = exp(eps_max) / (1 - E), so every P- and mag-based coefficient grows by at most f^2
// (`scale_growth`), and dS's by the first and second order's bound on |dS^ - dS| (`growth`).
namespace {

struct RowScoreBounds {
  double e = 0, r = 0, d1 = 0, d2 = 0, largest = 0;  // E_i, R_i, sum eps |s0|, d2_i, max eps
  std::vector<double> eps, bound;                    // eps_ij, r^_ij per visible key
};

// eps: the row's per visible key (2.0001 u_S |z_ij|, or an emulated score's slack).
RowScoreBounds row_score_bounds(const PairBlock& block, std::size_t r, std::vector<double> eps) {
  RowScoreBounds b;
  b.eps = std::move(eps);
  for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
    const std::size_t e = block.at(r, block.visible[r][a]);
    const double eps_a = b.eps[a], w = block.weight[e];
    b.e += w * eps_a;
    b.r += w * (std::expm1(eps_a) - eps_a);
    b.d1 += eps_a * std::fabs(w * (block.dp_signed[e] - block.exact_d[r]));
    b.largest = std::max(b.largest, w > 0 ? eps_a : 0.0);
  }
  for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
    const std::size_t e = block.at(r, block.visible[r][a]);
    const double rho = std::expm1(b.eps[a]) - b.eps[a];
    b.bound.push_back((std::max(rho, b.r) + (b.e + b.r) * (b.eps[a] + b.e)) / (1 - b.e) * (1 + 1e-9));
    b.d2 += block.weight[e] * b.bound[a] * std::fabs(block.dp_signed[e]);
  }
  return b;
}

// One projection (dQ's or dK's): A_i, B_i and the absolute sum that bounds their rounding.
struct Projection {
  double a = 0, b = 0, slack = 0;
};

void add_row_scale_scores(const kernels::BackwardProblem& p, const PairBlock& block, std::size_t r,
                          const RowScoreBounds& bounds, Magnitudes& m) {
  const RowGeometry& g = block.geometry[r];
  const double lse_gradient = p.d_lse.empty() ? 0.0 : p.d_lse[block.first + r];
  Projection q, k, direction;
  double c_v = 0, slack_v = 0;
  for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
    const std::size_t e = block.at(r, block.visible[r][a]);
    const double w = block.weight[e], ds = w * (block.dp_signed[e] - block.exact_d[r] + lse_gradient);
    for (auto [projection, on] : {std::pair{&q, block.on_dq[e]}, std::pair{&k, block.on_dk[e]},
                                  std::pair{&direction, block.on_w[e]}}) {
      projection->a += g.slope[a] * on * ds;
      projection->b += g.slope[a] * on * w;
      projection->slack += std::fabs(g.slope[a] * on) * (std::fabs(ds) + w);
    }
    c_v += w * block.on_dv[e];
    slack_v += std::fabs(w * block.on_dv[e]);
  }
  const double moved_d = bounds.d1 + bounds.d2;
  for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
    const std::size_t e = block.at(r, block.visible[r][a]);
    const double w = block.weight[e], s0 = w * (block.dp_signed[e] - block.exact_d[r]);
    const double ds = s0 + w * lse_gradient, slope = g.slope[a];
    const double eps = bounds.eps[a], bound = bounds.bound[a], eps2 = eps * eps;
    const double first = std::fabs(ds) * (eps + bounds.e) + w * bounds.d1;
    const double second = std::fabs(ds) * bound + w * bounds.d2 + w * (eps + bounds.e + bound) * moved_d;
    const auto add = [&](Magnitudes::ScaleScoreTerms& terms, double on, const Projection& x, double copies) {
      const double coefficient = std::fabs(slope * on * ds - w * x.a - s0 * x.b) +
                                 1e-9 * (std::fabs(slope * on * ds) + (w + std::fabs(s0)) * x.slack);
      terms.first += copies * coefficient * coefficient * eps2;
      terms.second += std::fabs(slope * on) * second;
      terms.growth += copies * (slope * on * (first + second)) * (slope * on * (first + second));
    };
    add(m.dq_scale_scores, block.on_dq[e], q, block.copies[e]);
    add(m.dk_scale_scores, block.on_dk[e], k, block.copies[e]);
    add(m.d_direction[block.first + r].scores, block.on_w[e], direction, block.key_copies[e]);
    const double on_v = block.on_dv[e];
    const double coefficient_v = w * std::fabs(on_v - c_v) + 1e-9 * w * (std::fabs(on_v) + slack_v);
    m.dv_scale_scores.first += block.copies[e] * coefficient_v * coefficient_v * eps2;
    m.dv_scale_scores.second += std::fabs(on_v) * w * bound;
  }
}

// The projected tests' terms of every row of the block, eps_of(r) giving row r's eps per visible
// key; with a soft-cap, or a row whose P-weighted eps reaches 1/2, they are not known.
template <typename EpsOfRow>
void add_projected_terms(const kernels::BackwardProblem& p, const PairBlock& block, Magnitudes& m,
                         const EpsOfRow& eps_of) {
  m.scale_scores_charged = true;
  const bool capped = p.head(block.head).softcap != 0;
  for (std::size_t r = 0; r < block.rows && m.scale_scores_known; ++r) {
    const RowScoreBounds bounds = row_score_bounds(block, r, eps_of(r));
    if (capped || !(bounds.e < 0.5)) {
      m.scale_scores_known = false;
      break;
    }
    const double f = std::exp(bounds.largest) / (1 - bounds.e);
    m.scale_growth = std::max(m.scale_growth, f * f);
    add_row_scale_scores(p, block, r, bounds, m);
  }
}

}  // namespace

// A query row's shared fp32 errors (the LSE's, delta_L relative in every P_ij, and D's, at most
// relative A_i in the model of ScaleNoise) projected on `on` exactly: delta_L scales the row's dS
// (and D, where it is formed from P: the math path), moving T by delta_L (A_on - B_on D_i), and D's
// error moves it by delta_D B_on, A_on = sum_j on_ij dS_ij dz/dr and B_on = sum_j dz/dr on_ij P_ij:
// at most relative (|A_on| + 2 |B_on| (A_i + |g_i|)), in place of relative sum_j mag_ij |on_ij| where
// that is smaller; 1e-9 of the terms' absolute sums covers the double arithmetic. (For the
// D-direction test B_on is |w_i|^2: charged as the worst case, a D off by 1 to 10% passed there.)
// Split (SplitPairs), for a D formed from O: the forward divides by its own sum, so its score
// errors e'_j move O_c by sum_j P_ij e'_j (v_jc - O_c) to first order and D by at most relative
// A''_i = sum_j P_ij |dP_ij - D_i| (PairBlock::a_centred); its sums' and the dot product's errors
// stay relative A_i, at the rest's units (`rows_rest`, judge_backward.cpp); the LSE's moves T by
// delta_L A_on. So `rows_centred` is |A_on| + |B_on| (|D_i| + A''_i + 2 |g_i|), and `rows_rest` |B_on| A_i.
double row_shared(const kernels::BackwardProblem& p, const PairBlock& block, std::size_t r,
                  const std::vector<double>& on, double copies, Magnitudes::SplitPairs& split) {
  const double lse_gradient = p.d_lse.empty() ? 0.0 : p.d_lse[block.first + r];
  double a_on = 0, b_on = 0, absolute = 0, bound = 0;
  for (const std::size_t j : block.visible[r]) {
    const std::size_t e = block.at(r, j);
    const double w = block.weight[e], slope = block.slope[e], ds = block.signed_ds[e];
    a_on += on[e] * ds;
    b_on += slope * on[e] * w;
    absolute += std::fabs(on[e]) * (std::fabs(ds) + slope * w);
    bound += block.mag[e] * std::fabs(on[e]);
  }
  const double slack = 1e-9 * absolute * (1 + block.a[r] + std::fabs(lse_gradient));
  const double exact = std::fabs(a_on) + 2 * std::fabs(b_on) * (block.a[r] + std::fabs(lse_gradient)) + slack;
  const double centred =
      std::fabs(a_on) + slack +
      std::fabs(b_on) * (std::fabs(block.exact_d[r]) + block.a_centred[r] + 2 * std::fabs(lse_gradient));
  split.rows_centred += copies * centred * centred;
  split.rows_rest += copies * b_on * b_on * block.a[r] * block.a[r];
  return std::min(exact, bound);
}

// The D-direction test's sums (Magnitudes::d_direction), after the products: w_i is the block's
// signed_dq row, on_ij = w_i . k_j one product; per row, the gradient-scale test's sums for the
// one row with on_ij in place of the pair's projection on the signs, and D's own error, which moves
// T_i = w_i . (y_i - e_i) by B_i |w_i|^2 per unit.
void block_direction_terms(const kernels::BackwardProblem& p, PairBlock& block, Magnitudes& m) {
  const std::size_t d = p.queries.cols;
  zero(block.on_w, block.rows * block.width);
  if (block.width > 0) {
    reference::plain_product(block_of(block.signed_dq, block.rows, d),
                             rows_of(p.keys, block.key_first, block.width, true), block.on_w.data(),
                             block.width);
  }
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    Magnitudes::ProjectedSums& sums = m.d_direction[i];
    double length_sq = 0;
    for (const std::size_t j : block.visible[r]) {
      const std::size_t e = block.at(r, j);
      const double on = block.on_w[e], mag = block.mag[e];
      const double copies = block.key_copies[e];  // one row's test: its key copies
      sums.inside += copies * block.pair[e] * on * on;
      sums.pairs += copies * mag * mag * on * on;
      add_split_pairs(block, e, on, copies, sums.split);
    }
    const double row = row_shared(p, block, r, block.on_w, 1.0, sums.split);
    for (std::size_t t = 0; t < d; ++t) {
      m.dq_direction(i, t) = block.signed_dq[r * d + t];
      length_sq += block.signed_dq[r * d + t] * block.signed_dq[r * d + t];
    }
    sums.rows = row * row;
    sums.from_d = block.b_sq[r] * length_sq * length_sq;
    if (block.roundings == 3) sums.exact = exact_inside(block, r, block.on_w, block.key_copies);
  }
}

// The math path rounds P to P^ = P (1 + a), dP to dP (1 + b) and dS to dS (1 + c), |a|, |b|, |c| <= u_i,
// and autograd's softmax backward forms D_i = sum_j P^_ij dP^_ij from the rounded values. To first
// order a_ij moves dS_ij by a_ij dS_ij and D_i by a_ij P_ij dP_ij (so every dS_ik by -P_ik a_ij
// P_ij dP_ij); b_ij moves dS_ij by b_ij P_ij dP_ij and D_i alike; c_ij moves dS_ij by c_ij dS_ij
// (dS with the LSE's gradient g: P's rounding scales it whole). Projected, T = sum_ik dz/dr on_ik dS_ik
// and B_i = sum_k dz/dr on_ik P_ik, the coefficients are exact: a: dz/dr on_ij dS_ij - P_ij dP_ij
// B_i; b: P_ij dP_ij (dz/dr on_ij - B_i); c: dz/dr on_ij dS_ij. Beyond first order, with
// |dD1_i| <= 2 u A_i, |dD2_i| <= u^2 A_i, the products move dS^_ij before its rounding by at most
// u^2 P_ij (|dP_ij| + 3 A_i) <= 3 u^2 mag_ij / (dz/dr), and c times the first order (3 u mag) adds
// 3 u^2 mag: 6 u^2 (1 + u) mag_ij |on_ij| in all, charged in full from `cross`. Where autograd
// rounds dS again (PairBlock::ds_roundings n: after an inexact scale, a soft-cap's steps), each
// rounding's coefficient is c's, and second_order_of_ds(n) counts the products: cross times it / 6.
ExactInside exact_inside(const PairBlock& block, std::size_t r, const std::vector<double>& on,
                         const std::vector<double>& copies) {
  double b = 0, b_abs = 0;
  for (const std::size_t j : block.visible[r]) {
    const std::size_t e = block.at(r, j);
    b += block.slope[e] * on[e] * block.weight[e];
    b_abs += std::fabs(block.slope[e] * on[e] * block.weight[e]);
  }
  ExactInside x;
  for (const std::size_t j : block.visible[r]) {
    const std::size_t e = block.at(r, j);
    const double w = block.weight[e], slope = block.slope[e], dp = block.dp_signed[e],
                 ds = block.signed_ds[e];
    const double slack =
        1e-9 * (std::fabs(on[e] * ds) + std::fabs(w * dp) * (b_abs + std::fabs(slope * on[e])));
    const double from_p = std::fabs(on[e] * ds - w * dp * b) + slack;
    const double from_dp = std::fabs(w * dp * (slope * on[e] - b)) + slack;
    const double from_ds = std::fabs(on[e] * ds) + slack;
    x.squares += copies[e] * (from_p * from_p + from_dp * from_dp + block.ds_roundings * from_ds * from_ds);
    x.cross += second_order_of_ds(block.ds_roundings) / 6 * block.mag[e] * std::fabs(on[e]);
  }
  return x;
}

namespace {

// The scores' perturbations e_ij, |e_ij| <= unit zeta_ij: their roundings (unit 2.0001 u_S, zeta
// |z_ij|; the element sums are then over the unit, and the largest |z| is kept), or an emulated
// score's slack (unit 1, zeta the slack). zeta_of(r): row r's zeta per visible key.
template <typename ZetaOfRow>
void add_perturbation_terms(const kernels::BackwardProblem& p, const Images& images, double unit,
                            const ZetaOfRow& zeta_of, PairBlock& block, Magnitudes& m) {
  const std::size_t size = block.rows * block.width, d = p.queries.cols;
  const bool rounding = unit != 1.0;
  for (auto* v : {&block.dq_scores, &block.dk_scores, &block.dk_second, &block.dv_scores, &block.dv_second})
    zero(*v, size);
  std::vector<double> row_b(block.rows), row_c(block.rows), row_sigma(block.rows);
  std::vector<std::vector<double>> zeta(block.rows);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const RowGeometry& g = block.geometry[r];
    zeta[r] = zeta_of(r);
    const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[block.first + r]);
    double b = 0, c = 0, largest = 0;
    for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
      const std::size_t e = block.at(r, block.visible[r][a]);
      if (block.weight[e] == 0) continue;  // a huge additive mask: nothing moves, and |z| would overflow
      const double zp = zeta[r][a] * block.weight[e];
      b += zp * zp;
      c += zp * zp * (block.dp_mag[e] + block.a[r]) * (block.dp_mag[e] + block.a[r]);
      if (g.z[a] - g.lse > -negligible_gap) largest = std::max(largest, zeta[r][a]);
    }
    if (rounding) m.largest_z = std::max(m.largest_z, largest);
    const double eps = unit * largest;
    const double sigma = 3 * std::exp(2 * eps) * (std::expm1(eps) - eps + eps * eps);
    row_b[r] = b;
    row_c[r] = c;
    row_sigma[r] = sigma;
    for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
      const std::size_t e = block.at(r, block.visible[r][a]);
      const double w = block.weight[e];
      if (w == 0) continue;
      const double mag = w * (block.dp_mag[e] + block.a[r] + lse_gradient) * g.slope[a];
      const double via_d = w * g.slope[a], z2 = zeta[r][a] * zeta[r][a];
      block.dq_scores[e] = 3 * z2 * mag * mag;
      block.dk_scores[e] = 3 * (z2 * mag * mag + mag * mag * b + via_d * via_d * c);
      block.dk_second[e] = 3 * sigma * mag;
      block.dv_scores[e] = 2 * w * w * (z2 + b);
      block.dv_second[e] = sigma * w;
    }
  }
  if (block.width > 0) {
    const auto pairs = [&](const std::vector<double>& v, bool transposed) {
      return block_of(v, block.rows, block.width, transposed);
    };
    const auto add = [](const reference::MatrixOperand& a, const reference::MatrixOperand& b, Matrix& c,
                        std::size_t first_row) {
      reference::plain_product(a, b, c.values.data() + first_row * c.cols, c.cols, true);
    };
    add(pairs(block.dq_scores, false), rows_of(images.k_sq, block.key_first, block.width), m.dq_scores,
        block.first);
    add(pairs(block.dk_scores, true), rows_of(images.q_sq, block.first, block.rows), m.dk_scores,
        block.key_first);
    add(pairs(block.dk_second, true), rows_of(images.q_abs, block.first, block.rows), m.dk_scores_second,
        block.key_first);
    add(pairs(block.dv_scores, true), rows_of(images.dout_sq, block.first, block.rows), m.dv_scores,
        block.key_first);
    add(pairs(block.dv_second, true), rows_of(images.dout_abs, block.first, block.rows), m.dv_scores_second,
        block.key_first);
  }
  add_projected_terms(p, block, m, [&](std::size_t r) {
    std::vector<double> eps;
    for (const double z : zeta[r]) eps.push_back(unit * z);
    return eps;
  });
  for (std::size_t r = 0; r < block.rows; ++r) {  // the terms through e_i and D_i, with the row's M_ic
    const std::size_t i = block.first + r;
    for (std::size_t t = 0; t < d; ++t) {
      const double signed_dq = block.signed_dq[r * d + t];
      m.dq_scores(i, t) += 3 * (m.dq(i, t) * m.dq(i, t) * row_b[r] + signed_dq * signed_dq * row_c[r]);
      m.dq_scores_second(i, t) = 3 * row_sigma[r] * m.dq(i, t);
    }
  }
}

}  // namespace

void add_score_terms(const kernels::BackwardProblem& p, const Images& images, double u_s, PairBlock& block,
                     Magnitudes& m) {
  add_perturbation_terms(
      p, images, 2.0001 * u_s,
      [&](std::size_t r) {
        std::vector<double> zeta;
        for (const double z : block.geometry[r].z) zeta.push_back(std::fabs(z));
        return zeta;
      },
      block, m);
}

namespace {}  // namespace

void add_slack_terms(const kernels::BackwardProblem& p, const Images& images, const EmulatedScoreSlack& slack,
                     PairBlock& block, Magnitudes& m) {
  const std::vector<double>& head = slack.per_head[block.head];
  const std::size_t positions = p.positions(), keys = p.keys.rows;
  std::vector<std::vector<double>> zeta(block.rows);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t position = (block.first + r) % positions;
    for (const std::size_t j : block.visible[r]) zeta[r].push_back(head[position * keys + j]);
  }
  add_perturbation_terms(
      p, images, 1.0, [&](std::size_t r) { return zeta[r]; }, block, m);
  add_slack_worst_case(p, images, zeta, block, m);
}

// The math path's roundings of P (a), dP (b) and dS (c, ds_roundings times) per element with their
// exact first-order coefficients (exact_inside derives them for the projected tests). With
// Y_ij = P_ij dP_ij, s_ij = dz/dr, Ds_ij = dS_ij s_ij and w_i = sum_k P_ik s_ik k_k (D's
// direction): a_ij moves dQ_ic by Ds_ij k_jc - Y_ij w_ic, b_ij by Y_ij s_ij k_jc - Y_ij w_ic, c_ij
// by Ds_ij k_jc, so dQ_ic's sum of squares is sum_j A_ij k_jc^2 - 2 w_ic B_ij k_jc + w_ic^2 C_ij with
// A = (1 + c) Ds^2 + (Y s)^2, B = (Ds + Y s) Y, C = 2 Y^2. dK_kc = sum_i Ds_ik q_ic: a_ij moves it by
// ([j = k] Ds_ij - P_ik s_ik Y_ij) q_ic, b_ij by ([j = k] Y_ij s_ij - P_ik s_ik Y_ij) q_ic, so its
// sum is sum_i G_ik q_ic^2, G = (1 + c) Ds^2 + (Y s)^2 - 2 (Ds + Y s) P s Y + 2 (P s)^2 sum_j Y_ij^2.
// Both are sums of squares (non-negative); 1e-9 of their terms' absolute sums covers the double
// arithmetic.
void block_exact_terms(PairBlock& block) {
  const std::size_t size = block.rows * block.width;
  for (auto* v : {&block.exact_a, &block.exact_b, &block.exact_b_abs, &block.exact_c, &block.exact_g})
    zero(*v, size);
  if (block.roundings != 3) return;
  const double c = block.ds_roundings;
  for (std::size_t r = 0; r < block.rows; ++r) {
    double y_squares = 0;
    for (const std::size_t j : block.visible[r]) {
      const std::size_t e = block.at(r, j);
      y_squares += block.weight[e] * block.dp_signed[e] * block.weight[e] * block.dp_signed[e];
    }
    for (const std::size_t j : block.visible[r]) {
      const std::size_t e = block.at(r, j);
      const double s = block.slope[e], y = block.weight[e] * block.dp_signed[e], ds = block.signed_ds[e];
      const double ys = y * s, ps = block.weight[e] * s;
      block.exact_a[e] = (1 + c) * ds * ds + ys * ys;
      block.exact_b[e] = (ds + ys) * y;
      block.exact_b_abs[e] = (std::fabs(ds) + std::fabs(ys)) * std::fabs(y);
      block.exact_c[e] = 2 * y * y;
      const double g = (1 + c) * ds * ds + ys * ys - 2 * (ds + ys) * ps * y + 2 * ps * ps * y_squares;
      const double g_abs =
          (1 + c) * ds * ds + ys * ys + 2 * std::fabs((ds + ys) * ps * y) + 2 * ps * ps * y_squares;
      block.exact_g[e] = std::max(g, 0.0) + 1e-9 * g_abs;
    }
  }
}

// dQ's and dK's exact sums (block_exact_terms) into Magnitudes::dq_spread_exact and
// dk_spread_exact, once the block's w_i (signed_dq) is known.
void block_exact_products(const kernels::BackwardProblem& p, const Images& images, const PairBlock& block,
                          Magnitudes& m) {
  if (block.roundings != 3 || block.width == 0) return;
  const std::size_t rows = block.rows, width = block.width, d = p.queries.cols;
  std::vector<double> a(rows * d), b(rows * d), b_abs(rows * d);
  const auto product = [&](const std::vector<double>& pairs, const Matrix& keys, std::vector<double>& out) {
    reference::plain_product(block_of(pairs, rows, width), rows_of(keys, block.key_first, width), out.data(),
                             d);
  };
  product(block.exact_a, images.k_sq, a);
  product(block.exact_b, p.keys, b);
  product(block.exact_b_abs, images.k_abs, b_abs);
  for (std::size_t r = 0; r < rows; ++r) {
    double c = 0;
    for (const std::size_t j : block.visible[r]) c += block.exact_c[block.at(r, j)];
    for (std::size_t t = 0; t < d; ++t) {
      const std::size_t x = r * d + t;
      const double w = block.signed_dq[x];
      const double sum = a[x] - 2 * w * b[x] + w * w * c;
      m.dq_spread_exact(block.first + r, t) =
          std::max(sum, 0.0) + 1e-9 * (a[x] + 2 * std::fabs(w) * b_abs[x] + w * w * c);
    }
  }
  reference::plain_product(block_of(block.exact_g, rows, width, true),
                           rows_of(images.q_sq, block.first, rows),
                           m.dk_spread_exact.values.data() + block.key_first * d, d, true);
}

// The math path's dQ and dK spreads: the exact coefficients' root plus (growth - 1) times the
// bounds' root, growth the factor the scores' perturbation (their roundings, or an emulated
// score's slack) grows the coefficients by (Magnitudes::scale_growth); the bounds alone where that
// is not known (a soft-cap).
void use_exact_spreads(Magnitudes& m) {
  const double growth = !m.scale_scores_charged ? 1.0 : (m.scale_scores_known ? m.scale_growth : INFINITY);
  if (!std::isfinite(growth)) return;
  for (auto [spread, exact] :
       {std::pair{&m.dq_spread, &m.dq_spread_exact}, std::pair{&m.dk_spread, &m.dk_spread_exact}}) {
    for (std::size_t x = 0; x < spread->values.size(); ++x)
      spread->values[x] = (exact->values[x] + (growth - 1) * spread->values[x]) * (1 + 1e-9);
  }
}

// A GQA group's per-head gradients (Magnitudes::dk_heads): this block's share of its head's signed
// dK_h = sum_i dS_ij dz/dr q_i and dV_h = sum_i P_ij dO_i.
void block_head_products(const kernels::BackwardProblem& p, const PairBlock& block, Matrix& head_dk,
                         Matrix& head_dv) {
  if (block.width == 0) return;
  const auto pairs = [&](const std::vector<double>& v) { return block_of(v, block.rows, block.width, true); };
  reference::plain_product(pairs(block.signed_ds), rows_of(p.queries, block.first, block.rows),
                           head_dk.values.data() + block.key_first * head_dk.cols, head_dk.cols, true);
  reference::plain_product(pairs(block.weight), rows_of(p.d_out, block.first, block.rows),
                           head_dv.values.data() + block.key_first * head_dv.cols, head_dv.cols, true);
}

// After a head of a GQA group: its |gradient| into `heads` (Magnitudes::dk_heads), and where the
// group is summed in the output format one head after another (`summed`: the math path, whose
// autograd adds repeat_interleave's copies back in the tensors' dtype: 3% off on 32 alike heads in
// bf16), the partial sum's |S_h| too, each addition's rounding; S_1 is the first head's own.
void add_head_roundings(bool summed, const Matrix& head, Matrix& partial, Matrix& heads) {
  for (std::size_t x = 0; x < head.values.size(); ++x) {
    partial.values[x] += head.values[x];
    heads.values[x] += std::fabs(head.values[x]) + (summed ? std::fabs(partial.values[x]) : 0.0);
  }
}

double cap_ds_roundings(double cap) {
  int exponent = 0;
  return std::frexp(cap, &exponent) == 0.5 ? 1 : 3;
}

// PairBlock::ds_roundings for a head: 1 unless the recipe rounds P, dP and dS (roundings 3); then
// the emulation's count, or 2 where autograd multiplies dS by a scale that is not a power of two
// (else 1), plus a soft-cap's backward (cap_ds_roundings).
double ds_roundings_of(const tensor::HeadScores& head, std::size_t d, double roundings,
                       const EmulatedScoreSlack* emulated) {
  if (roundings != 3) return 1;
  if (emulated != nullptr) return emulated->ds_roundings;
  const double scale = head.scale ? *head.scale : 1 / std::sqrt(static_cast<double>(d));
  int exponent = 0;
  double count = std::frexp(scale, &exponent) != 0.5 ? 2 : 1;
  if (head.softcap != 0) count += cap_ds_roundings(head.softcap);
  return count;
}

}  // namespace sharpcheck::metrics::backward_blocks
