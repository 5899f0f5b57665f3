#include "metrics/attention_geometry.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>

#include "reference/enclosed_product.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::metrics {
namespace {

// Query i's geometry for the tolerance: the entries it sees (keys and sink), the spread of their
// logits, and the logits' rounding error in units of u (kernels/registry.cpp): the fp32 dot
// product's d u sum_t |q_t k_t| |scale / theta|, and with soft-cap or bias the roundings of the
// cap's division, tanh and product and of the bias and its addition, (4|s| + 2|b| + 2|c|)/|theta|
// + 2|z| (s the scaled dot product, c the capped score). Entries more than negligible_below under
// the largest logit (an additive mask of -1e9 through the bias) are counted as negligible.
// Also each output column's magnitude sum_j p_j |v_jc|, with the weights p_j computed in double:
// their relative error is below (n + 10) 2^-53 (exp, sum, division), and the products' sums add
// gamma_n of themselves, far below the 1e-9 the magnitudes are inflated by for n up to 2^20 keys.

// Logit z of one entry and its rounding bound (above), in `Real` arithmetic.
template <typename Real>
std::pair<double, double> logit_and_rounding(Real dot, Real absolute, std::size_t d,
                                             const tensor::HeadScores& scores, Real scale, double bias) {
  const Real theta = std::fabs(static_cast<Real>(scores.theta));
  const Real scaled = dot * scale;
  const auto cap = static_cast<Real>(scores.softcap);
  const Real capped = scores.softcap != 0.0 ? cap * std::tanh(scaled / cap) : scaled;
  const Real z = (capped + bias) / static_cast<Real>(scores.theta);
  // The score's own errors before the cap (the dot product's, the scale's and 1/cap's roundings)
  // reach z through c tanh(s / c), whose slope 1 - tanh^2 is at most its value at the point of
  // [|s| - delta, |s| + delta] nearest 0; delta, the errors' size at 2^-20 a unit, bounds them for
  // every attention entry (fp32 accumulation, charged at most dot_product = 2 times 2^-24 a unit).
  // A saturated cap damps them: undamped (and taken at the row's largest rather than by weight,
  // judge_lse), at 8 sigma an LSE off by 1e-3 passed under a cap of 5.
  const Real before_cap = static_cast<Real>(d) * absolute * std::fabs(scale) +
                          (scores.softcap != 0.0 ? 4 * std::fabs(scaled) : Real{0});
  Real slope = 1;
  if (scores.softcap != 0.0) {
    const Real delta = before_cap * static_cast<Real>(0x1p-20), nearest = std::fabs(scaled) - delta;
    const Real t = nearest > 0 ? std::tanh(nearest / cap) : Real{0};
    slope = std::min(Real{1}, (1 - t * t) * static_cast<Real>(1 + 0x1p-20));
  }
  Real rounding = before_cap * slope / theta;
  if (scores.softcap != 0.0 || scores.has_bias()) {
    rounding += (2 * std::fabs(static_cast<Real>(bias)) + 2 * std::fabs(capped)) / theta + 2 * std::fabs(z) +
                (scores.softcap != 0.0 ? Real{0} : 4 * std::fabs(scaled) / theta);
  }
  return {static_cast<double>(z), static_cast<double>(rounding)};
}

// The entry's logit from its dot product and sum_t |q_t k_t| in double (any order of summation), or,
// where its products leave double's range (q . k near 1e320 with theta near 1e308, or products below
// 2^-960 with a tiny theta), from the products in long double (a 15-bit exponent on x86-64 and
// AArch64): the logits and their bound stay finite where they are, and an allowance with them.
// Where long double is double (MSVC, Apple's ARM) the fallback overflows and such a case stays
// inconclusive: honest, not wrong.
std::pair<double, double> entry_logit(double dot, double absolute, std::span<const double> q,
                                      std::span<const double> k, const tensor::HeadScores& scores,
                                      double bias) {
  const double scale = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(q.size()));
  // Headroom for the bound's own products (d |q.k| |scale|, 4 |s|) before the division by theta.
  const double headroom = static_cast<double>(q.size() + 8) * std::max(1.0, std::fabs(scale));
  bool in_range = absolute > 0x1p-960 && absolute * headroom < 0x1p1000;
  if (absolute == 0.0) {  // every product exactly 0, or some underflowed
    in_range = true;
    for (std::size_t t = 0; t < q.size(); ++t) in_range = in_range && (q[t] == 0.0 || k[t] == 0.0);
  }
  if (in_range) return logit_and_rounding<double>(dot, absolute, q.size(), scores, scale, bias);
  long double wide_dot = 0, wide_absolute = 0;
  for (std::size_t t = 0; t < q.size(); ++t) {
    const long double product = static_cast<long double>(q[t]) * static_cast<long double>(k[t]);
    wide_dot += product;
    wide_absolute += std::fabs(product);
  }
  const long double wide_scale = scores.scale ? static_cast<long double>(*scores.scale)
                                              : 1.0L / std::sqrt(static_cast<long double>(q.size()));
  // long double's own rounding (64-bit significand) is below double's, which the bound charges.
  return logit_and_rounding<long double>(wide_dot, wide_absolute, q.size(), scores, wide_scale, bias);
}

// sum_c |v_jc| per key: what the row-scale statistic's second order charges per key. (The products
// form the other images of K and V a tile of keys at a time: reference/enclosed_product.hpp.)
std::vector<double> key_absolutes(const Matrix& values) {
  std::vector<double> sums(values.rows, 0.0);
  for (std::size_t j = 0; j < values.rows; ++j) {
    for (const double x : values.row(j)) sums[j] += std::fabs(x);
  }
  return sums;
}

reference::MatrixOperand rows_of(const Matrix& m, std::size_t first, std::size_t count,
                                 bool transposed = false) {
  return {m.values.data() + first * m.cols, count, m.cols, m.cols, transposed};
}
reference::MatrixOperand block_of(const std::vector<double>& values, std::size_t rows, std::size_t cols,
                                  bool transposed = false) {
  return {values.data(), rows, cols, cols, transposed};
}

// Query rows [first, first + rows) and the keys they see, [key_first, key_first + width).
// The left factors hold one row per query row, stacked: `by_abs` = [P; visible; rho] times |V|,
// `by_value` = [P; P^2; z^2 P^2] times V, `by_square` = [P^2; z^2 P^2] times V^2, the squares over
// the rows whose sums the products give (`by_products`), 0 elsewhere.
struct Block {
  std::size_t first = 0, rows = 0, key_first = 0, width = 0;
  std::vector<std::vector<std::size_t>> visible;
  std::vector<double> dot, absolute, by_abs, by_value, by_square, signs, projection;
  std::vector<double> out_abs, out_value, out_square;
  std::vector<VisibleWeights> weights;
  std::vector<double> sum;  // the row's sum of exp(z_j - max z), sink included
  std::vector<char> by_products;
  [[nodiscard]] std::size_t at(std::size_t r, std::size_t j) const { return r * width + (j - key_first); }
};

// True when two of the positive weights are equal bit for bit (equal logits: q = 0, repeated keys,
// quantised inputs). Their roundings are then one variable (inside_rounding.cpp's groups), which
// the products do not see; such a row takes the row-by-row sums.
bool has_tied_weights(std::span<const double> p, std::vector<std::uint64_t>& table) {
  unsigned bits_of_size = 4;
  while ((std::size_t{1} << bits_of_size) < 2 * p.size()) ++bits_of_size;
  const std::size_t size = std::size_t{1} << bits_of_size;
  table.assign(size, 0);  // 0 is empty: a positive double's bits are never 0
  for (const double x : p) {
    if (!(x > 0)) continue;
    const auto bits = std::bit_cast<std::uint64_t>(x);
    std::size_t slot = (bits * 0x9E3779B97F4A7C15ULL) >> (64 - bits_of_size);
    for (; table[slot] != 0; slot = (slot + 1) & (size - 1)) {
      if (table[slot] == bits) return true;
    }
    table[slot] = bits;
  }
  return false;
}

// Row r's logits from the block's dot products, its RowScale but for the value masses, its weights
// (Block::weights, sum) and its share of the left factors.
RowScale row_weights(const Matrix& queries, const Matrix& keys, const tensor::HeadScores& scores, double u_s,
                     Block& block, std::size_t r) {
  thread_local std::vector<double> logits, roundings, weights;
  thread_local std::vector<std::uint64_t> table;
  const std::size_t query = block.first + r;
  const std::vector<std::size_t>& visible = block.visible[r];
  logits.clear();
  roundings.clear();
  for (const std::size_t j : visible) {
    const double bias = scores.has_bias() ? scores.bias_of(query, j) : 0.0;
    const auto [z, rounding] = entry_logit(block.dot[block.at(r, j)], block.absolute[block.at(r, j)],
                                           queries.row(query), keys.row(j), scores, bias);
    logits.push_back(z);
    roundings.push_back(rounding);
  }
  if (scores.sink) {
    logits.push_back(*scores.sink / scores.theta);
    roundings.push_back(2 * std::fabs(logits.back()));
  }
  RowScale row_scale;
  VisibleWeights& out = block.weights[r];
  out.p.clear();
  out.z.clear();
  out.dot.clear();
  block.by_products[r] = 0;
  if (logits.empty()) return row_scale;
  const double largest = *std::max_element(logits.begin(), logits.end());
  double smallest = largest, sum = 0;
  weights.resize(logits.size());
  for (std::size_t e = 0; e < logits.size(); ++e) {
    sum += weights[e] = std::exp(logits[e] - largest);
    if (largest - logits[e] > negligible_below) {  // its rounding matters only through its own size
      ++row_scale.negligible;
      continue;
    }
    ++row_scale.n;
    smallest = std::min(smallest, logits[e]);
    row_scale.logit_rounding = std::max(row_scale.logit_rounding, roundings[e]);
    row_scale.largest_score = std::max(row_scale.largest_score, std::fabs(logits[e]));
  }
  row_scale.largest_magnitude = largest - smallest;
  row_scale.weighted_logit_rounding = 0;
  for (std::size_t e = 0; e < logits.size(); ++e)
    row_scale.weighted_logit_rounding += weights[e] / sum * roundings[e];
  block.sum[r] = sum;
  bool finite = std::isfinite(sum);
  for (std::size_t a = 0; a < visible.size(); ++a) {
    const double p = weights[a] / sum, z = std::fabs(logits[a]);
    out.p.push_back(p);
    out.z.push_back(z);
    // A sink's score error moves every weight alike: its rounding stays charged in full (no dot).
    if (!scores.sink) out.dot.push_back(roundings[a]);
    const std::size_t e = block.at(r, visible[a]), stride = block.rows * block.width;
    block.by_abs[e] = p;
    block.by_abs[stride + e] = 1;
    block.by_value[e] = p;
    if (p == 0) continue;  // its rounding moves nothing, and its |z| may overflow
    block.by_abs[2 * stride + e] = p * second_order(z, u_s);
    block.by_value[stride + e] = block.by_square[e] = p * p;
    block.by_value[2 * stride + e] = block.by_square[stride + e] = z * z * p * p;
    finite = finite && std::isfinite(block.by_abs[2 * stride + e] + z * z * p * p);
  }
  block.by_products[r] = static_cast<char>(finite && !has_tied_weights(out.p, table));
  return row_scale;
}

// One column's sum_j p_j^2 (v_jc - o_c)^2 (times the factor folded into p) from its expanded terms
// sum p^2 v^2, sum p^2 v and sum p^2, rounded outward: each term errs by at most gamma_{n+3} of
// sum p^2 (|v| + |o|)^2 <= (sqrt(sum p^2 v^2) + |o| sqrt(sum p^2))^2 (Cauchy-Schwarz), and the
// combination by four roundings more; (n + 10) 2^-52 covers both.
double centred_square(double squares, double firsts, double weights, double o, double slack) {
  const double expanded = squares - 2 * o * firsts + o * o * weights;
  const double root = std::sqrt(squares) + std::fabs(o) * std::sqrt(weights);
  return std::max(expanded, 0.0) + slack * root * root;
}

// Row r's RowRounding from the block's products (inside_rounding.cpp's column_sums and scale_sums
// for weights of distinct values: every group a single key).
RowRounding rounding_by_products(const Block& block, std::span<const double> key_absolute, std::size_t r,
                                 std::size_t columns, double u_s) {
  const VisibleWeights& w = block.weights[r];
  const std::vector<std::size_t>& visible = block.visible[r];
  const std::size_t stride = block.rows * columns;
  const double* o = &block.out_value[r * columns];
  const double* p2v = &block.out_value[stride + r * columns];
  const double* z2p2v = &block.out_value[2 * stride + r * columns];
  const double* p2v2 = &block.out_square[r * columns];
  const double* z2p2v2 = &block.out_square[stride + r * columns];
  const double* second = &block.out_abs[2 * stride + r * columns];
  double p_weight = 0, s_weight = 0, rho_weight = 0, weight = 0;
  for (std::size_t a = 0; a < visible.size(); ++a) {
    if (w.p[a] == 0) continue;
    p_weight += w.p[a] * w.p[a];
    s_weight += w.z[a] * w.z[a] * w.p[a] * w.p[a];
    rho_weight += w.p[a] * second_order(w.z[a], u_s);
  }
  const double slack = static_cast<double>(block.width + 10) * 0x1p-52;
  RowRounding rounding{std::vector<double>(o, o + columns), std::vector<double>(columns),
                       std::vector<double>(columns), std::vector<double>(columns)};
  for (std::size_t c = 0; c < columns; ++c) {
    const double centred = centred_square(p2v2[c], p2v[c], p_weight, o[c], slack);
    rounding.p_spread[c] = std::sqrt(std::max(p2v2[c], centred)) * (1 + 0x1p-30);
    rounding.s_spread[c] =
        std::sqrt(centred_square(z2p2v2[c], z2p2v[c], s_weight, o[c], slack)) * (1 + 0x1p-30);
    rounding.s_second[c] = (second[c] + rho_weight * std::fabs(o[c])) * (1 + 0x1p-30);
    weight += std::fabs(o[c]);
  }
  rounding.lse_p_spread = std::sqrt(p_weight) * (1 + 0x1p-30);
  rounding.lse_s_spread = std::sqrt(s_weight) * (1 + 0x1p-30);
  rounding.lse_s_second = rho_weight * (1 + 0x1p-30);
  // The row-scale statistic: each key's projection sum_c sign(o_c) v_jc (a product), centred by
  // weight = sum_c |o_c|.
  double plain = 0, centred = 0, scores = 0, second_sum = 0, dots = 0;
  const bool dot_known = w.dot.size() == w.p.size();
  for (std::size_t a = 0; a < visible.size(); ++a) {
    if (w.p[a] == 0) continue;
    const double projection = block.projection[block.at(r, visible[a])];
    const double moved = w.p[a] * (projection - weight);
    plain += w.p[a] * projection * w.p[a] * projection;
    centred += moved * moved;
    scores += w.z[a] * w.z[a] * moved * moved;
    if (dot_known) dots += w.dot[a] * moved * w.dot[a] * moved;
    second_sum += w.p[a] * second_order(w.z[a], u_s) * (key_absolute[visible[a]] + weight);
  }
  if (dot_known) rounding.scale_dot_spread = std::sqrt(dots) * (1 + 0x1p-30);
  rounding.scale_p_spread = std::sqrt(std::max(plain, centred)) * (1 + 0x1p-30);
  rounding.scale_s_spread = std::sqrt(scores) * (1 + 0x1p-30);
  rounding.scale_s_second = second_sum * (1 + 0x1p-30);
  return rounding;
}

// The block's rows, the keys they see and its zeroed factors.
void prepare_block(const tensor::HeadScores& head, std::size_t first, std::size_t count, Block& block) {
  block.first = first;
  block.rows = count;
  const tensor::KeyRange range = tensor::visible_keys_of_rows(head, first, count, block.visible);
  block.key_first = range.first;
  block.width = range.last - range.first;
  const std::size_t pairs = count * block.width;
  block.dot.assign(pairs, 0.0);
  block.absolute.assign(pairs, 0.0);
  block.by_abs.assign(3 * pairs, 0.0);
  block.by_value.assign(3 * pairs, 0.0);
  block.by_square.assign(2 * pairs, 0.0);
  block.weights.resize(count);
  block.sum.assign(count, 0.0);
  block.by_products.assign(count, 0);
}

// The products over the block's keys: the left factors times the values' images, then each key's
// projection on the signs of its rows' outputs o = P V.
void block_products(const Matrix& values, Block& block) {
  const std::size_t d = values.cols, rows = block.rows, width = block.width;
  block.out_abs.assign(3 * rows * d, 0.0);
  block.out_value.assign(3 * rows * d, 0.0);
  block.out_square.assign(2 * rows * d, 0.0);
  block.projection.assign(rows * width, 0.0);
  if (width == 0 || d == 0) return;
  const std::size_t first = block.key_first;
  using reference::KeyImage;
  reference::key_sum_by_tiles(block_of(block.by_abs, 3 * rows, width), values, first, width,
                              KeyImage::magnitudes, block.out_abs.data());
  reference::key_sum_by_tiles(block_of(block.by_value, 3 * rows, width), values, first, width,
                              KeyImage::values, block.out_value.data());
  reference::key_sum_by_tiles(block_of(block.by_square, 2 * rows, width), values, first, width,
                              KeyImage::squares, block.out_square.data());
  block.signs.assign(rows * d, 0.0);
  for (std::size_t e = 0; e < rows * d; ++e) {
    const double o = block.out_value[e];
    block.signs[e] = o < 0 ? -1.0 : (o > 0 ? 1.0 : 0.0);
  }
  reference::pair_product_by_tiles(block_of(block.signs, rows, d), values, first, width, KeyImage::values,
                                   block.projection.data());
}

// Row r's magnitudes, value masses and RowRounding into the head's geometry.
void finish_row(const Matrix& values, std::span<const double> key_absolute, const Block& block, std::size_t r,
                double u_s, HeadGeometry& geometry) {
  const std::size_t i = block.first + r, d = values.cols;
  RowScale& scale = geometry.scales[i];
  // Over Z = sum (>= 1) too: the row sum an unnormalised weight's absolute error is relative to. A
  // kernel's max may exceed the exact one by its fp32 logits' rounding (2^-24 per unit), which
  // shrinks its weights by at most exp(2^-23 logit_rounding): charged outward.
  const double shift = std::exp(scale.logit_rounding * 0x1p-23);
  for (std::size_t c = 0; c < d && block.width > 0; ++c) {
    geometry.magnitudes(i, c) = block.out_abs[r * d + c] * (1 + 1e-9);
    const double mass = block.out_abs[(block.rows + r) * d + c];
    scale.value_mass = std::max(scale.value_mass, mass * (1 + 1e-9));
    scale.value_mass_over_z = std::max(scale.value_mass_over_z, mass / block.sum[r] * shift * (1 + 1e-9));
  }
  geometry.roundings[i] = block.by_products[r] != 0 && block.width > 0
                              ? rounding_by_products(block, key_absolute, r, d, u_s)
                              : row_rounding(values, block.visible[r], block.weights[r], u_s);
}

}  // namespace

HeadGeometry attention_head_geometry(const Matrix& queries, const Matrix& keys, const Matrix& values,
                                     const tensor::HeadScores& head, double u_s, RowSums sums) {
  // A block's pair matrices (eleven of them) within the products' budget.
  const std::size_t block_rows = reference::rows_per_block(keys.rows, 64);
  const reference::SingleThreadedBlas single_threaded;  // heads run in parallel already
  HeadGeometry geometry{std::vector<RowScale>(queries.rows), Matrix(queries.rows, values.cols),
                        std::vector<RowRounding>(queries.rows)};
  const std::vector<double> key_absolute = key_absolutes(values);
  thread_local Block block;
  thread_local std::vector<double> q_abs;
  for (std::size_t first = 0; first < queries.rows; first += block_rows) {
    prepare_block(head, first, std::min(block_rows, queries.rows - first), block);
    if (block.width > 0 && queries.cols > 0) {
      reference::pair_product_by_tiles(rows_of(queries, first, block.rows), keys, block.key_first,
                                       block.width, reference::KeyImage::values, block.dot.data());
      q_abs.resize(block.rows * queries.cols);
      for (std::size_t e = 0; e < q_abs.size(); ++e)
        q_abs[e] = std::fabs(queries.values[first * queries.cols + e]);
      reference::pair_product_by_tiles(block_of(q_abs, block.rows, queries.cols), keys, block.key_first,
                                       block.width, reference::KeyImage::magnitudes, block.absolute.data());
    }
    for (std::size_t r = 0; r < block.rows; ++r) {
      geometry.scales[first + r] = row_weights(queries, keys, head, u_s, block, r);
      if (sums == RowSums::by_rows) block.by_products[r] = 0;
    }
    block_products(values, block);
    for (std::size_t r = 0; r < block.rows; ++r) finish_row(values, key_absolute, block, r, u_s, geometry);
  }
  return geometry;
}

}  // namespace sharpcheck::metrics
