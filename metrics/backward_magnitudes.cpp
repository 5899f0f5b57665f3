#include "metrics/backward_magnitudes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "metrics/backward_pair_block.hpp"
#include "metrics/comparison.hpp"
#include "reference/enclosed_product.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::metrics {
namespace {

using namespace backward_blocks;  // the blocks this file works on (metrics/backward_pair_block.hpp)

// q_i . k_j and sum_t |q_it k_jt| by the scalar loop: in long double (a 15-bit exponent) where the
// products leave double's range: q . k near 2^1026 at theta near 2^1021, or products that underflow
// at a tiny theta (as the forward's geometry, metrics/evaluate.cpp); the logits over theta are
// ordinary numbers.
struct DotAndAbsolute {
  long double raw, absolute;
};
DotAndAbsolute dot_and_absolute(const kernels::BackwardProblem& p, std::size_t i, std::size_t j) {
  const std::size_t d = p.queries.cols;
  double narrow_raw = 0, narrow_absolute = 0;
  bool underflow = false;
  for (std::size_t t = 0; t < d; ++t) {
    const double product = p.queries(i, t) * p.keys(j, t);
    narrow_raw += product;
    narrow_absolute += std::fabs(product);
    underflow = underflow || (product == 0 && p.queries(i, t) != 0 && p.keys(j, t) != 0);
  }
  if (!underflow && narrow_absolute * static_cast<double>(d + 8) < 0x1p1000 &&
      !(narrow_absolute != 0 && narrow_absolute < 0x1p-960)) {
    return {narrow_raw, narrow_absolute};
  }
  DotAndAbsolute wide{0, 0};
  for (std::size_t t = 0; t < d; ++t) {
    const long double product = static_cast<long double>(p.queries(i, t)) * p.keys(j, t);
    wide.raw += product;
    wide.absolute += std::fabs(product);
  }
  return wide;
}

template <typename Dot>
RowGeometry row_geometry(const kernels::BackwardProblem& p, const tensor::HeadScores& head, std::size_t i,
                         const std::vector<std::size_t>& visible, const Dot& dot, double u_s, Magnitudes& m) {
  const std::size_t d = p.queries.cols;
  const double scale = head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(d));
  RowGeometry g;
  double top = head.sink ? *head.sink / head.theta : -INFINITY;
  for (const std::size_t j : visible) {
    const auto [raw, absolute] = dot(j);
    long double s = raw * scale, slope = scale;
    if (head.softcap != 0) {
      const double dot_error =
          static_cast<double>(d + 2) * 0x1p-24 * static_cast<double>(absolute) * std::fabs(scale);
      g.slope_error.push_back(cap_slope_error(static_cast<double>(s), head.softcap, dot_error, u_s) *
                              std::fabs(scale / head.theta));
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
    const double dot_part = static_cast<double>(d * absolute * std::fabs(scale / theta));
    const double rest = 4 * std::fabs(g.z.back()) + 2 * std::fabs(bias / head.theta);
    m.logit_rounding = std::max(m.logit_rounding, dot_part + rest);
    m.logit_dot = std::max(m.logit_dot, dot_part), m.logit_rest = std::max(m.logit_rest, rest);
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

// The sums below run over the (query, key) pairs of blocks of query rows as BLAS products
// (reference/enclosed_product.hpp's plain_product): per pair, the coefficients (mag_ij, the D term,
// the pair bound, dz/dr, P_ij, ...) are written into block x keys matrices, and each gradient's
// magnitude is one product with |K|, |Q|, |dO| or their squares. A sum of non-negative terms in
// any order errs by at most gamma_n of itself (n below 2^20: under 1.2e-10), within the 1e-9 the
// sums are inflated by; the signed sums (signed_dq, the projections on the gradients' signs) feed
// the statistical spreads as before.

// Element-wise images of a matrix that the products read.
Matrix mapped(const Matrix& m, double (*f)(double)) {
  Matrix out(m.rows, m.cols);
  std::transform(m.values.begin(), m.values.end(), out.values.begin(), f);
  return out;
}
double absolute_of(double x) { return std::fabs(x); }
double square_of(double x) { return x * x; }
double sign_of(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }

// The smallest non-zero |x| of each row (+inf for a zero row): where two such meet, a product of
// a query's and a key's entries may underflow.
std::vector<double> smallest_nonzero(const Matrix& m) {
  std::vector<double> out(m.rows, INFINITY);
  for (std::size_t r = 0; r < m.rows; ++r) {
    for (const double x : m.row(r))
      if (x != 0) out[r] = std::min(out[r], std::fabs(x));
  }
  return out;
}

Images images_of(const kernels::BackwardProblem& p, const reference::AttentionGradients& e) {
  return Images{.q_abs = mapped(p.queries, absolute_of),
                .q_sq = mapped(p.queries, square_of),
                .k_abs = mapped(p.keys, absolute_of),
                .k_sq = mapped(p.keys, square_of),
                .v_abs = mapped(p.values, absolute_of),
                .dout_abs = mapped(p.d_out, absolute_of),
                .dout_sq = mapped(p.d_out, square_of),
                .dq_sign = mapped(e.d_queries, sign_of),
                .dk_sign = mapped(e.d_keys, sign_of),
                .dv_sign = mapped(e.d_values, sign_of),
                .q_smallest = smallest_nonzero(p.queries),
                .k_smallest = smallest_nonzero(p.keys)};
}

// q_i . k_j and sum_t |q_it k_jt| from the block's products, or, where a product may leave
// double's range, by the scalar loop (in long double where it does).
DotAndAbsolute pair_dot(const kernels::BackwardProblem& p, const Images& images, const PairBlock& block,
                        std::size_t i, std::size_t j) {
  const std::size_t r = i - block.first, d = p.queries.cols;
  const double absolute = block.absolute[block.at(r, j)];
  const bool ordinary = static_cast<long double>(images.q_smallest[i]) * images.k_smallest[j] >= 0x1p-1074L &&
                        absolute * static_cast<double>(d + 8) < 0x1p1000 &&
                        !(absolute != 0 && absolute < 0x1p-960);
  if (ordinary) return {block.raw[block.at(r, j)], absolute};
  return dot_and_absolute(p, i, j);
}

// The block's keys, its scores' products and each row's geometry and weights P_ij.
void block_geometry(const kernels::BackwardProblem& p, const tensor::HeadScores& head, const Images& images,
                    PairBlock& block, Magnitudes& m) {
  const tensor::KeyRange keys =
      tensor::visible_keys_of_rows(head, block.first % p.positions(), block.rows, block.visible);
  block.key_first = keys.first;
  block.width = keys.last - keys.first;
  const std::size_t size = block.rows * block.width;
  block.raw.resize(size);
  block.absolute.resize(size);
  zero(block.weight, size);
  if (block.width > 0) {
    pair_product(p.queries, p.keys, block, block.raw);
    pair_product(images.q_abs, images.k_abs, block, block.absolute);
  }
  block.geometry.assign(block.rows, RowGeometry{});
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    if (block.visible[r].empty() && !head.sink) continue;
    const auto dot = [&](std::size_t j) { return pair_dot(p, images, block, i, j); };
    block.geometry[r] = row_geometry(p, head, i, block.visible[r], dot, block.score_unit, m);
    for (std::size_t a = 0; a < block.visible[r].size(); ++a)
      block.weight[block.at(r, block.visible[r][a])] =
          std::exp(block.geometry[r].z[a] - block.geometry[r].lse);
  }
}

// dP_ij, sum_c |dO_ic v_jc| and O = P V by products, then each row's A_i, exact D_i and
// B_i = sum_c |dO_ic O_ic| (O in double: its error, below 1e-12 A_i, is added). And what the
// statistical tests charge D's error by (`b_sq`, a variance over u_o^2): with a recipe that rounds
// P (u_i > 0), the kernel's D_i = sum_c dO_ic O^_ic errs through O's rounding (delta_c O_c) and the
// forward's rounding of P (sum_j d_j P_ij v_jc), independent roundings of variance proxy
// u_o^2 (sum_c (dO_ic O_ic)^2 + sum_j (P_ij dP_ij)^2), plus the forward's fp32 arithmetic, at most
// (n + dv + 8) 2^-24 A_i (A_i = sum_c |dO_ic| sum_j P_ij |v_jc|), added to the root as if it were
// u_i units (u_o >= u_i). The fp32 recipe's is O's rounding alone (its fp32 errors: the rows'
// charge; by the worst case B_i^2 a D 10% off passed at d = 256). Equal O_c round alike.
void block_row_sums(const kernels::BackwardProblem& p, const Images& images, double u_i, PairBlock& block,
                    Magnitudes& m) {
  const std::size_t dv = p.values.cols, size = block.rows * block.width;
  zero(block.dp_mag, size);
  zero(block.dp_signed, size);
  zero(block.out, block.rows * dv);
  if (block.width > 0) {
    pair_product(p.d_out, p.values, block, block.dp_signed);
    pair_product(images.dout_abs, images.v_abs, block, block.dp_mag);
    reference::plain_product(block_of(block.weight, block.rows, block.width),
                             rows_of(p.values, block.key_first, block.width), block.out.data(), dv);
  }
  block.a.assign(block.rows, 0);
  block.b.assign(block.rows, 0);
  block.b_sq.assign(block.rows, 0);
  block.exact_d.assign(block.rows, 0);
  block.a_centred.assign(block.rows, 0);
  const double forward_fp32 = static_cast<double>(p.keys.rows + dv + 8) * 0x1p-24;
  std::vector<ValueAndBound> outputs(dv);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    for (const std::size_t j : block.visible[r]) {
      block.a[r] += block.weight[block.at(r, j)] * block.dp_mag[block.at(r, j)];
      block.exact_d[r] += block.weight[block.at(r, j)] * block.dp_signed[block.at(r, j)];
    }
    for (const std::size_t j : block.visible[r])
      block.a_centred[r] +=
          block.weight[block.at(r, j)] * std::fabs(block.dp_signed[block.at(r, j)] - block.exact_d[r]);
    block.a_centred[r] = block.a_centred[r] * (1 + 1e-9) + 1e-12 * block.a[r];
    for (std::size_t c = 0; c < dv; ++c) block.b[r] += std::fabs(p.d_out(i, c) * block.out[r * dv + c]);
    block.b[r] += 1e-12 * block.a[r];
    for (std::size_t c = 0; c < dv; ++c)
      outputs[c] = {block.out[r * dv + c], std::fabs(p.d_out(i, c) * block.out[r * dv + c])};
    double squares = alike_roundings_noise(outputs);
    if (u_i > 0)  // the forward's rounded P
      for (const std::size_t j : block.visible[r])
        squares += std::pow(block.weight[block.at(r, j)] * block.dp_signed[block.at(r, j)], 2);
    const double root = std::sqrt(squares) + ((u_i > 0 ? forward_fp32 / u_i : 0.0) + 1e-12) * block.a[r];
    block.b_sq[r] = root * root * (1 + 1e-9);
    m.d_rows(i, 0) = block.a[r];
    m.d_rows_from_o(i, 0) = block.b[r];
  }
}

// Each pair's coefficients: mag_ij, the D term, the squared pair bound (dS's rounding by the exact
// |dS|, in double: 1e-9 of mag covers its own error, and the other k - 1 intermediates' by mag),
// dz/dr, whether it is seen, P_ij^2 and P_ij dz/dr.
void block_pair_terms(const kernels::BackwardProblem& p, double roundings, PairBlock& block) {
  const std::size_t size = block.rows * block.width;
  block.roundings = roundings;
  for (auto* v :
       {&block.mag, &block.from_d, &block.pair, &block.slope, &block.seen, &block.weight_sq,
        &block.weight_slope, &block.floor_weight, &block.abs_ds, &block.signed_ds, &block.slope_error})
    zero(*v, size);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[i]);
    const double signed_lse_gradient = p.d_lse.empty() ? 0.0 : p.d_lse[i];
    double row_dp = 0;  // sum_k |dP_ik|: what P's subnormal roundings move D_i by, per unit f
    for (const std::size_t j : block.visible[r]) row_dp += block.dp_mag[block.at(r, j)];
    for (std::size_t a = 0; a < block.visible[r].size(); ++a) {
      const std::size_t e = block.at(r, block.visible[r][a]);
      const double w = block.weight[e], slope = block.geometry[r].slope[a];
      const double mag = w * (block.dp_mag[e] + block.a[r] + lse_gradient) * slope;
      block.signed_ds[e] = w * (block.dp_signed[e] - block.exact_d[r] + signed_lse_gradient) * slope;
      const double ds = std::fabs(block.signed_ds[e]) + 1e-9 * mag;
      block.mag[e] = mag;
      block.abs_ds[e] = ds;
      block.from_d[e] = w * block.b[r] * slope;
      block.pair[e] = roundings >= 1 ? block.ds_roundings * ds * ds + (roundings - 1) * mag * mag : 0.0;
      block.slope[e] = slope;
      // The subnormal floors (Magnitudes::dq_floor): dS's rounding errs by f; with P rounded
      // before dS (the math path: k >= 3), P's error f moves dS_ij by f |dP_ij - D_i + g_i| and,
      // through D_i = sum_k P^_ik dP_ik, by P_ij f sum_k |dP_ik|: charged as (k f) (that / k).
      const double p_floor = block.dp_mag[e] + block.a[r] + lse_gradient + w * row_dp;
      block.floor_weight[e] = slope * (1 + (roundings >= 3 ? p_floor / roundings : 0.0));
      const std::vector<double>& slope_error = block.geometry[r].slope_error;
      block.slope_error[e] = (slope_error.empty() ? 0.0 : slope_error[a]) * w *
                             (std::fabs(block.dp_signed[e] - block.exact_d[r] + signed_lse_gradient) +
                              0x1p-8 * (block.dp_mag[e] + block.a[r] + lse_gradient));
      block.seen[e] = 1;
      block.weight_sq[e] = w * w * block.p_copies[e];  // dV's spread: P's rounding, alike in its copies
      block.weight_slope[e] = w * slope;
    }
  }
}

// The gradient-scale sums (judge_gradient_scale): each pair's roundings through dS_ij (`pair`) and
// of P_ij, and the fp32 arithmetic's errors (relative to mag and to P_ij), projected on the
// expected gradients' signs (on_ij, by products); each row's shares squared and summed; and D's
// errors projected on dK's signs through the row.
void block_scale_terms(const kernels::BackwardProblem& p, const Images& images, PairBlock& block,
                       Magnitudes& m) {
  const std::size_t size = block.rows * block.width;
  zero(block.on_dq, size);
  zero(block.on_dk, size);
  zero(block.on_dv, size);
  if (block.width > 0) {
    pair_product(images.dq_sign, p.keys, block, block.on_dq);
    pair_product(p.queries, images.dk_sign, block, block.on_dk);
    pair_product(p.d_out, images.dv_sign, block, block.on_dv);
  }
  for (std::size_t r = 0; r < block.rows; ++r) {
    double row_dv = 0, d_on_dk = 0;
    for (const std::size_t j : block.visible[r]) {
      const std::size_t e = block.at(r, j);
      const double on_dq = block.on_dq[e], on_dk = block.on_dk[e], on_dv = block.on_dv[e];
      const double pair = block.pair[e], mag = block.mag[e], w = block.weight[e], copies = block.copies[e];
      m.dq_scale_inside += copies * pair * on_dq * on_dq;
      m.dk_scale_inside += copies * pair * on_dk * on_dk;
      m.dv_scale_inside += block.p_copies[e] * w * w * on_dv * on_dv;
      const double worst =
          block.roundings >= 1 ? block.abs_ds[e] + (block.roundings - 1) * mag : 0.0;  // |dS| u, mag u
      m.dq_scale_inside_linear += worst * std::fabs(on_dq);
      m.dk_scale_inside_linear += worst * std::fabs(on_dk);
      m.dv_scale_inside_linear += w * std::fabs(on_dv);
      m.dq_scale_pairs += copies * mag * mag * on_dq * on_dq;
      m.dk_scale_pairs += copies * mag * mag * on_dk * on_dk;
      add_split_pairs(block, e, on_dq, copies, m.dq_scale_split);
      add_split_pairs(block, e, on_dk, copies, m.dk_scale_split);
      m.dv_scale_pairs += block.p_copies[e] * w * w * on_dv * on_dv;
      row_dv += w * std::fabs(on_dv);
      d_on_dk += block.weight_slope[e] * on_dk;
    }
    const double row_copies = block.row_copies[r];
    m.dk_scale_from_d += row_copies * block.b_sq[r] * d_on_dk * d_on_dk;
    if (block.roundings == 3) {  // the math path: exact coefficients (exact_inside)
      for (auto [sums, on] :
           {std::pair{&m.dq_scale_exact, &block.on_dq}, std::pair{&m.dk_scale_exact, &block.on_dk}}) {
        const ExactInside x = exact_inside(block, r, *on, block.copies);
        sums->squares += x.squares;
        sums->cross += x.cross;
      }
    }
    const double row_dq = row_shared(p, block, r, block.on_dq, row_copies, m.dq_scale_split);
    const double row_dk = row_shared(p, block, r, block.on_dk, row_copies, m.dk_scale_split);
    double row_dv_exact = 0;  // dV: the LSE's error scales the row's P alone
    for (const std::size_t j : block.visible[r])
      row_dv_exact += block.weight[block.at(r, j)] * block.on_dv[block.at(r, j)];
    row_dv = std::min(row_dv, std::fabs(row_dv_exact) * (1 + 1e-9) + 1e-12 * row_dv);
    m.dq_scale_rows += row_copies * row_dq * row_dq;
    m.dk_scale_rows += row_copies * row_dk * row_dk;
    m.dv_scale_rows += row_copies * row_dv * row_dv;
  }
}

// The gradients' magnitude, D-term, spread and floor sums: one product each.
void block_products(const kernels::BackwardProblem& p, const Images& images, PairBlock& block,
                    Magnitudes& m) {
  const std::size_t rows = block.rows, width = block.width, d = p.queries.cols;
  zero(block.signed_dq, rows * d);  // read by every row's terms, a block that sees no key included
  if (width == 0) return;
  const auto pairs = [&](const std::vector<double>& v, bool transposed) {
    return block_of(v, rows, width, transposed);
  };
  const auto keys = [&](const Matrix& image) { return rows_of(image, block.key_first, width); };
  const auto queries = [&](const Matrix& image) { return rows_of(image, block.first, rows); };
  const auto add = [](const reference::MatrixOperand& a, const reference::MatrixOperand& b, Matrix& c,
                      std::size_t first_row) {
    reference::plain_product(a, b, c.values.data() + first_row * c.cols, c.cols, true);
  };
  add(pairs(block.mag, false), keys(images.k_abs), m.dq, block.first);
  add(pairs(block.abs_ds, false), keys(images.k_abs), m.dq_accumulated, block.first);
  add(pairs(block.pair, false), keys(images.k_sq), m.dq_spread, block.first);
  add(pairs(block.from_d, false), keys(images.k_abs), m.dq_from_d, block.first);
  add(pairs(block.floor_weight, false), keys(images.k_abs), m.dq_floor, block.first);
  add(pairs(block.slope_error, false), keys(images.k_abs), m.dq_slope, block.first);
  add(pairs(block.slope_error, true), queries(images.q_abs), m.dk_slope, block.key_first);
  add(pairs(block.mag, true), queries(images.q_abs), m.dk, block.key_first);
  add(pairs(block.abs_ds, true), queries(images.q_abs), m.dk_accumulated, block.key_first);
  add(pairs(block.pair, true), queries(images.q_sq), m.dk_spread, block.key_first);
  add(pairs(block.from_d, true), queries(images.q_abs), m.dk_from_d, block.key_first);
  add(pairs(block.floor_weight, true), queries(images.q_abs), m.dk_floor, block.key_first);
  add(pairs(block.seen, true), queries(images.dout_abs), m.dv_floor, block.key_first);
  add(pairs(block.weight, true), queries(images.dout_abs), m.dv, block.key_first);
  add(pairs(block.weight_sq, true), queries(images.dout_sq), m.dv_spread, block.key_first);
  reference::plain_product(pairs(block.weight_slope, false), rows_of(p.keys, block.key_first, width),
                           block.signed_dq.data(), d);
}

// Per row, after the products: D's error delta_i moves dQ_i by exactly delta_i sum_j P_ij dz/dr k_j
// (first order; its products with P's own error, below 2^-10, and with dS's rounding to the
// recipe's intermediate format, u_i, are kept as slack on the unsigned sum); and the sink's terms.
void block_row_terms(const kernels::BackwardProblem& p, const tensor::HeadScores& head, const Images& images,
                     double u_i, const PairBlock& block, Magnitudes& m) {
  const std::size_t d = p.queries.cols;
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    if (block.visible[r].empty() && !head.sink) continue;
    double on_dq = 0;
    for (std::size_t t = 0; t < d; ++t) {
      const double signed_dq = block.signed_dq[r * d + t];
      m.dq_from_d(i, t) = block.b[r] * std::fabs(signed_dq) + (u_i + 0x1p-10) * m.dq_from_d(i, t);
      on_dq += images.dq_sign(i, t) * signed_dq;
    }
    m.dq_scale_from_d += block.row_copies[r] * block.b_sq[r] * on_dq * on_dq;
    if (head.sink) {
      const double lse_gradient = p.d_lse.empty() ? 0.0 : std::fabs(p.d_lse[i]);
      const double sink_weight =
          std::exp(*head.sink / head.theta - block.geometry[r].lse) / std::fabs(head.theta);
      m.d_sinks(block.head, 0) += sink_weight * (block.a[r] + lse_gradient);
      m.d_sinks_from_d(block.head, 0) += sink_weight * block.b[r];
    }
  }
}

// The magnitudes' matrices, zero, sized for the problem (the scores' only when a recipe rounds them).
Magnitudes allocated(const kernels::BackwardProblem& p, double u_s) {
  const std::size_t mq = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  Magnitudes m;
  for (Matrix* matrix : {&m.dq, &m.dq_from_d, &m.dq_spread, &m.dq_floor, &m.dq_accumulated, &m.dq_slope})
    *matrix = Matrix(mq, d);
  for (Matrix* matrix : {&m.dk, &m.dk_from_d, &m.dk_spread, &m.dk_floor, &m.dk_accumulated, &m.dk_slope})
    *matrix = Matrix(n, d);
  for (Matrix* matrix : {&m.dv, &m.dv_spread, &m.dv_floor}) *matrix = Matrix(n, dv);
  for (Matrix* matrix : {&m.d_sinks, &m.d_sinks_from_d}) *matrix = Matrix(p.group, 1);
  for (Matrix* matrix : {&m.d_rows, &m.d_rows_from_o}) *matrix = Matrix(mq, 1);
  m.dq_direction = Matrix(mq, d);
  m.d_direction.assign(mq, {});
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
       {&m.dq, &m.dk, &m.dv, &m.dq_from_d, &m.dk_from_d, &m.d_rows, &m.d_rows_from_o, &m.d_sinks, &m.dq_floor,
        &m.dk_floor, &m.dv_floor, &m.d_sinks_from_d, &m.dq_accumulated, &m.dk_accumulated, &m.dq_slope,
        &m.dk_slope, &m.dq_scores_second, &m.dk_scores_second, &m.dv_scores_second}) {
    for (double& x : matrix->values) x *= 1 + 1e-9;
  }
  for (Matrix* matrix : {&m.dq_slack_worst, &m.dk_slack_worst, &m.dv_slack_worst, &m.dq_slack_second,
                         &m.dk_slack_second, &m.dv_slack_second}) {
    for (double& x : matrix->values) x *= 1 + 1e-9;
  }
  for (double& x : m.slack_mean) x *= 1 + 1e-9;
  for (Matrix* matrix : {&m.dq_spread, &m.dk_spread, &m.dv_spread, &m.dq_scores, &m.dk_scores, &m.dv_scores,
                         &m.dq_spread_exact, &m.dk_spread_exact}) {
    for (double& x : matrix->values) x = std::sqrt(x) * (1 + 1e-9);
  }
}

}  // namespace

Magnitudes magnitudes_of(const kernels::BackwardProblem& p, const reference::AttentionGradients& e,
                         double u_s, double u_i, double roundings, const EmulatedScoreSlack* emulated,
                         const kernels::BackwardProblem* copies_from) {
  const reference::SingleThreadedBlas single_threaded;  // the groups run in parallel already
  Magnitudes m = allocated(p, emulated != nullptr ? 1.0 : u_s);
  if (emulated != nullptr) {  // the slack's worst case (add_slack_worst_case)
    for (Matrix* x : {&m.dq_slack_worst, &m.dq_slack_second}) *x = Matrix(p.queries.rows, p.queries.cols);
    for (Matrix* x : {&m.dk_slack_worst, &m.dk_slack_second}) *x = Matrix(p.keys.rows, p.queries.cols);
    for (Matrix* x : {&m.dv_slack_worst, &m.dv_slack_second}) *x = Matrix(p.keys.rows, p.values.cols);
    m.slack_mean.assign(p.queries.rows, 0.0);
  }
  if (roundings == 3) {
    m.dq_spread_exact = Matrix(p.queries.rows, p.queries.cols);
    m.dk_spread_exact = Matrix(p.keys.rows, p.queries.cols);
  }
  const Images images = images_of(p, e);
  const Copies copies = copies_of(copies_from != nullptr ? *copies_from : p);
  m.row_copies = copies.rows;
  const std::size_t positions = p.positions();
  // Blocks of about 2^18 pairs: the products' shapes, and memory near the inputs' size.
  const std::size_t block_rows =
      std::clamp<std::size_t>((std::size_t{1} << 18) / std::max<std::size_t>(p.keys.rows, 1), 8, 256);
  PairBlock block;
  Matrix head_dk, head_dv, partial_dk, partial_dv;  // a head's gradients; the group's partial sums
  if (p.group > 1) {
    m.dk_heads = head_dk = partial_dk = Matrix(p.keys.rows, p.queries.cols);
    m.dv_heads = head_dv = partial_dv = Matrix(p.keys.rows, p.values.cols);
  }
  for (std::size_t h = 0; h < p.group; ++h) {
    const Magnitudes::ScaleSums before = take_dq_scale_sums(m);  // the head's own sums, then all
    for (Matrix* x : {&head_dk, &head_dv}) std::fill(x->values.begin(), x->values.end(), 0.0);
    const tensor::HeadScores head = p.head(h);
    block.ds_roundings = ds_roundings_of(head, p.queries.cols, roundings, emulated);
    m.ds_roundings = std::max(m.ds_roundings, block.ds_roundings);
    for (std::size_t position = 0; position < positions; position += block_rows) {
      block.head = h;
      block.score_unit = u_s;
      block.first = h * positions + position;
      block.rows = std::min(block_rows, positions - position);
      block_geometry(p, head, images, block, m);
      if (emulated != nullptr && !emulated->slopes.empty()) apply_slopes(p, emulated->slopes[h], block);
      block_copies(copies, block);
      block_row_sums(p, images, u_i, block, m);
      block_pair_terms(p, roundings, block);
      block_exact_terms(block);
      block_scale_terms(p, images, block, m);
      block_products(p, images, block, m);
      block_exact_products(p, images, block, m);
      block_row_terms(p, head, images, u_i, block, m);
      block_direction_terms(p, block, m);
      if (u_s > 0) add_score_terms(p, images, u_s, block, m);
      if (emulated != nullptr) add_slack_terms(p, images, *emulated, block, m);
      if (p.group > 1) block_head_products(p, block, head_dk, head_dv);
    }
    add_head_roundings(roundings == 3 && h > 0, head_dk, partial_dk, m.dk_heads);
    add_head_roundings(roundings == 3 && h > 0, head_dv, partial_dv, m.dv_heads);
    const Magnitudes::ScaleSums own = take_dq_scale_sums(m);
    add_dq_scale_sums(before, m), add_dq_scale_sums(own, m);
    if (p.group > 1) m.dq_scale_heads.push_back(own);
  }
  finish(m);
  if (roundings == 3) use_exact_spreads(m);
  return m;
}

}  // namespace sharpcheck::metrics
