#include <algorithm>
#include <cmath>
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
void add_score_terms(const kernels::BackwardProblem& p, const Images& images, double u_s, PairBlock& block,
                     Magnitudes& m) {
  const std::size_t size = block.rows * block.width, d = p.queries.cols;
  for (auto* v : {&block.dq_scores, &block.dk_scores, &block.dk_second, &block.dv_scores, &block.dv_second})
    zero(*v, size);
  std::vector<double> row_b(block.rows), row_c(block.rows), row_sigma(block.rows);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const RowGeometry& g = block.geometry[r];
    const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[block.first + r]);
    double b = 0, c = 0, largest = 0;
    for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
      const std::size_t e = block.at(r, block.visible[r][a]);
      if (block.weight[e] == 0) continue;  // a huge additive mask: nothing moves, and |z| would overflow
      const double zp = g.z[a] * block.weight[e];
      b += zp * zp;
      c += zp * zp * (block.dp_mag[e] + block.a[r]) * (block.dp_mag[e] + block.a[r]);
      if (g.z[a] - g.lse > -negligible_gap) largest = std::max(largest, std::fabs(g.z[a]));
    }
    m.largest_z = std::max(m.largest_z, largest);
    const double eps = 2.0001 * u_s * largest;
    const double sigma = 3 * std::exp(2 * eps) * (std::expm1(eps) - eps + eps * eps);
    row_b[r] = b;
    row_c[r] = c;
    row_sigma[r] = sigma;
    for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
      const std::size_t e = block.at(r, block.visible[r][a]);
      const double w = block.weight[e];
      if (w == 0) continue;
      const double mag = w * (block.dp_mag[e] + block.a[r] + lse_gradient) * g.slope[a];
      const double via_d = w * g.slope[a], z2 = g.z[a] * g.z[a];
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
  for (std::size_t r = 0; r < block.rows; ++r) {  // the terms through e_i and D_i, with the row's M_ic
    const std::size_t i = block.first + r;
    for (std::size_t t = 0; t < d; ++t) {
      const double signed_dq = block.signed_dq[r * d + t];
      m.dq_scores(i, t) += 3 * (m.dq(i, t) * m.dq(i, t) * row_b[r] + signed_dq * signed_dq * row_c[r]);
      m.dq_scores_second(i, t) = 3 * row_sigma[r] * m.dq(i, t);
    }
  }
}

}  // namespace sharpcheck::metrics::backward_blocks
