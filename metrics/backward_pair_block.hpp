// The attention backward's tolerance geometry, block by block (internal to
// metrics/backward_magnitudes.cpp and metrics/backward_score_terms.cpp, which holds the projected
// tests' row and score terms): a block of query rows of
// one head, the keys they see, and the pair matrices whose products with the inputs' images give
// each gradient's magnitude sums (metrics/backward_magnitudes.hpp says what each sum is).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/matrix.hpp"
#include "kernels/attention_backward.hpp"
#include "metrics/backward_magnitudes.hpp"
#include "reference/enclosed_product.hpp"

namespace sharpcheck::metrics::backward_blocks {

// Entries with z - L below this have P < e^-100: their rounding errors are far below any
// allowance, so they are left out of the units' max |z - L| (which would otherwise grow with a
// mask's size, as tolerance_table.cpp's negligible entries explain for the forward).
constexpr double negligible_gap = 100;

// The row's logits z, slopes dz/dr and the roundings of the logits, in double.
struct RowGeometry {
  std::vector<double> z, slope;
  // A soft-capped head's bound on how far the kernel's slope may be from dz/dr (cap_slope_error in
  // backward_emulation.cpp); empty without a cap.
  std::vector<double> slope_error;
  double lse = -INFINITY;
};

// Rows [first, first + count) of a row-major matrix as a product operand.
inline reference::MatrixOperand rows_of(const Matrix& m, std::size_t first, std::size_t count,
                                        bool transposed = false) {
  return {m.values.data() + first * m.cols, count, m.cols, m.cols, transposed};
}
inline reference::MatrixOperand block_of(const std::vector<double>& values, std::size_t rows,
                                         std::size_t cols, bool transposed = false) {
  return {values.data(), rows, cols, cols, transposed};
}

inline void zero(std::vector<double>& v, std::size_t size) { v.assign(size, 0.0); }

// What the whole problem shares: the inputs' images and the expected gradients' signs.
struct Images {
  Matrix q_abs, q_sq, k_abs, k_sq, v_abs, dout_abs, dout_sq, dq_sign, dk_sign, dv_sign;
  std::vector<double> q_smallest, k_smallest;
};

// One block of query rows (rows [first, first + rows) of the stacked queries, all of one head)
// and the keys they see, [key_first, key_first + width), with its rows x width pair matrices.
struct PairBlock {
  std::size_t head = 0, first = 0, rows = 0, key_first = 0, width = 0;
  double roundings = 0;   // the recipe's intermediate roundings per pair (3: the math path's P, dP, dS)
  double score_unit = 0;  // u_S of a recipe that rounds the scores (magnitudes_of's u_s), else 0
  // dS's roundings in the math path: 2 when autograd multiplies it by a scale that is not a power
  // of two (`(q @ k^T) * scale` backward: dS * scale, rounded again), else 1.
  double ds_roundings = 1;
  std::vector<std::vector<std::size_t>> visible;
  // Copies (block_copies): a pair whose row and key repeat others' (the same token: bit-equal q and
  // dO rows of a head whose scores do not depend on the position; bit-equal k and v rows the row
  // sees, with no per-key bias) carries identical values through every step, so their roundings and
  // fp32 errors are one error, not independent ones. A Hoeffding sum of squares then weighs each
  // pair's square by its copies (sum over a group of (m c)^2 = m sum of c^2): key_copies for a
  // test of one row (the D-direction test), copies = key copies times row copies for a test of the
  // whole gradient, and row_copies a row's shared errors; p_copies for what depends on P alone
  // (rows of bit-equal q round P alike whatever their dO: dV's P terms).
  std::vector<double> copies, key_copies, row_copies, p_copies;
  std::vector<double> raw, absolute, weight, dp_mag, dp_signed, out;
  // signed_ds: the exact dS_ij dz/dr (the LSE's gradient included); abs_ds: its size plus 1e-9 mag.
  std::vector<double> mag, from_d, pair, slope, seen, weight_sq, weight_slope, floor_weight, signed_ds,
      abs_ds, signed_dq, slope_error;             // slope_error: Magnitudes::dq_slope's pair terms
  std::vector<double> on_dq, on_dk, on_dv, on_w;  // on_w: the pair's projection on D's direction w_i
  std::vector<double> dq_scores, dk_scores, dk_second, dv_scores, dv_second;
  // The slack's worst-case pair terms, first and second order (add_slack_terms).
  std::vector<double> slack_q, slack_k, slack_v, second_ds, second_v;
  // The math path's exact per-element coefficients (roundings == 3; block_exact_terms): dQ's
  // sums of squares as sum_j (A k^2 - 2 w B k + w^2 C) with B's absolute part, and dK's per pair.
  std::vector<double> exact_a, exact_b, exact_b_abs, exact_c, exact_g;
  std::vector<RowGeometry> geometry;
  // Per row: A_i, B_i, D's noise, the exact D_i and A''_i = sum_j P_ij |dP_ij - D_i| (what the
  // forward's score errors move a D formed from O by, over their unit: row_shared).
  std::vector<double> a, b, b_sq, exact_d, a_centred;
  [[nodiscard]] std::size_t at(std::size_t r, std::size_t j) const { return r * width + (j - key_first); }
};

// A pair matrix (rows x width): block rows of `left` (a query-side matrix) times the block's keys of
// `right` (a key-side matrix), transposed.
inline void pair_product(const Matrix& left, const Matrix& right, const PairBlock& block,
                         std::vector<double>& out) {
  reference::plain_product(rows_of(left, block.first, block.rows),
                           rows_of(right, block.key_first, block.width, true), out.data(), block.width);
}

// Which rows and keys repeat (PairBlock::copies): the group's rows with bit-equal q, dO and dLSE
// (and for P alone, bit-equal q) in heads whose scores do not depend on the position (no causal
// mask, window, mask, bias or ALiBi) and agree on scale, temperature, cap and sink, across the
// group's heads too (autograd sums their per-head dK and dV); keys with bit-equal k and v where no
// head adds a per-key bias or ALiBi. Padding rows are nobody's copies.
struct Copies {
  std::vector<double> rows;            // per problem row: how many rows are its copies, itself included
  std::vector<double> rows_of_p;       // the same for P alone (bit-equal q)
  std::vector<std::size_t> key_class;  // per key: the first key equal to it
};

inline std::string bytes_of(std::span<const double> a, std::span<const double> b, std::span<const double> c) {
  std::string key((a.size() + b.size() + c.size()) * sizeof(double), '\0');
  std::memcpy(key.data(), a.data(), a.size_bytes());
  std::memcpy(key.data() + a.size_bytes(), b.data(), b.size_bytes());
  std::memcpy(key.data() + a.size_bytes() + b.size_bytes(), c.data(), c.size_bytes());
  return key;
}

inline Copies copies_of(const kernels::BackwardProblem& p) {
  const std::size_t positions = p.positions();
  Copies copies{std::vector<double>(p.queries.rows, 1.0), std::vector<double>(p.queries.rows, 1.0),
                std::vector<std::size_t>(p.keys.rows)};
  bool keyed = false;  // a per-key bias: equal keys score differently
  std::unordered_map<std::string, std::vector<std::size_t>> rows, rows_of_p;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = p.head(h);
    keyed = keyed || head.has_bias();
    if (!head.rows_alike()) continue;
    const double traits[] = {head.scale.value_or(-1.0), head.theta, head.softcap, head.sink.value_or(NAN),
                             head.sink ? 1.0 : 0.0};
    const std::size_t computed = head.queries != 0 ? std::min(head.queries, positions) : positions;
    for (std::size_t position = 0; position < computed; ++position) {
      const std::size_t i = h * positions + position;
      const double d_lse[] = {p.d_lse.empty() ? 0.0 : p.d_lse[i]};
      rows_of_p[bytes_of(p.queries.row(i), {}, traits)].push_back(i);
      rows[bytes_of(p.queries.row(i), p.d_out.row(i), traits) + bytes_of(d_lse, {}, {})].push_back(i);
    }
  }
  for (auto [groups, out] : {std::pair{&rows, &copies.rows}, std::pair{&rows_of_p, &copies.rows_of_p}})
    for (const auto& [bytes, same] : *groups)
      for (const std::size_t i : same) (*out)[i] = static_cast<double>(same.size());
  std::unordered_map<std::string, std::size_t> first;
  for (std::size_t j = 0; j < p.keys.rows; ++j)
    copies.key_class[j] =
        keyed ? j : first.emplace(bytes_of(p.keys.row(j), p.values.row(j), {}), j).first->second;
  return copies;
}

// The block's copies: per pair, the keys its row sees that equal its key (key_copies) and those
// times its row's copies (copies); per row, its copies.
inline void block_copies(const Copies& all, PairBlock& block) {
  const std::size_t size = block.rows * block.width;
  block.copies.assign(size, 1.0);
  block.key_copies.assign(size, 1.0);
  block.p_copies.assign(size, 1.0);
  block.row_copies.assign(block.rows, 1.0);
  std::vector<double> seen(all.key_class.size(), 0.0);
  for (std::size_t r = 0; r < block.rows; ++r) {
    block.row_copies[r] = all.rows[block.first + r];
    for (const std::size_t j : block.visible[r]) seen[all.key_class[j]] += 1;
    for (const std::size_t j : block.visible[r]) {
      const std::size_t e = block.at(r, j);
      block.key_copies[e] = seen[all.key_class[j]];
      block.copies[e] = block.key_copies[e] * block.row_copies[r];
      block.p_copies[e] = block.key_copies[e] * all.rows_of_p[block.first + r];
    }
    for (const std::size_t j : block.visible[r]) seen[all.key_class[j]] = 0;
  }
}

// A pair's share of Magnitudes::SplitPairs, its projection on the statistic `on`. The dS part
// adds P |g| dz/dr (mag's share of the LSE's gradient): a kernel rounds dP - D before adding g.
inline void add_split_pairs(const PairBlock& block, std::size_t e, double on, double copies,
                            Magnitudes::SplitPairs& split) {
  const std::size_t r = e / block.width;
  const double w = block.weight[e],
               lse_share = block.mag[e] - w * (block.dp_mag[e] + block.a[r]) * block.slope[e];
  const double ds = (block.abs_ds[e] + std::max(lse_share, 0.0)) * on,
               dp = w * block.dp_mag[e] * block.slope[e] * on;
  const double from_d = block.from_d[e] * on;
  split.ds += copies * ds * ds;
  split.dp += copies * dp * dp;
  split.from_d += copies * from_d * from_d;
}

// A query row's shared fp32 errors (the LSE's and D's) projected on `on` (one of the block's pair
// projections), for row r, and their split into `split`'s rows (metrics/backward_score_terms.cpp
// derives both).
[[nodiscard]] double row_shared(const kernels::BackwardProblem& p, const PairBlock& block, std::size_t r,
                                const std::vector<double>& on, double copies, Magnitudes::SplitPairs& split);

// The D-direction test's sums (Magnitudes::d_direction) of one block, after its products
// (metrics/backward_score_terms.cpp).
void block_direction_terms(const kernels::BackwardProblem& p, PairBlock& block, Magnitudes& m);

// The math path's intermediate roundings (P, dP and dS; roundings == 3) projected on `on` (one of
// the block's pair projections) with their exact first-order coefficients, for row r: Hoeffding's
// sum of squares (over u_i^2) and the pairs' sum of mag_ij |on_ij|, which bounds what their products
// move the projection by (backward_score_terms.cpp derives both).
using ExactInside = Magnitudes::ExactSums;
[[nodiscard]] ExactInside exact_inside(const PairBlock& block, std::size_t r, const std::vector<double>& on,
                                       const std::vector<double>& copies);

// The math path's per-element exact coefficients (roundings == 3), for one block: the pair terms
// after block_pair_terms, and their products into Magnitudes::dq_spread_exact and dk_spread_exact
// after block_products (metrics/backward_score_terms.cpp derives them).
void block_exact_terms(PairBlock& block);
void block_exact_products(const kernels::BackwardProblem& p, const Images& images, const PairBlock& block,
                          Magnitudes& m);
// After the sums' roots: dQ's and dK's spreads from the exact coefficients (Magnitudes::dq_spread).
void use_exact_spreads(Magnitudes& m);

// How far a soft-cap's slope as a kernel forms it may be from dz/dr's, over |scale / theta|, for a
// pre-cap score s, cap c, the fp32 dot product's error bound and the recipe's u_S (0: scores in
// fp32) (metrics/backward_emulation.cpp derives it).
[[nodiscard]] double cap_slope_error(double s, double cap, double dot_error, double u_s);

// A soft-capped emulation's slopes (EmulatedScoreSlack::slopes, the head's positions x keys) into
// the block's geometry, after block_geometry: dz/dr is s' times the kernel's slope 1 - t^2, not s'
// (metrics/backward_emulation.cpp).
void apply_slopes(const kernels::BackwardProblem& p, const std::vector<double>& slopes, PairBlock& block);

// A GQA group's per-head gradients (Magnitudes::dk_heads), after block_pair_terms: the block's share
// of its head's signed dK_h and dV_h; and after the head, its |dK_h| (and, where the group is summed
// in the output format, `summed`, the partial sums') into `heads` (metrics/backward_score_terms.cpp).
void block_head_products(const kernels::BackwardProblem& p, const PairBlock& block, Matrix& head_dk,
                         Matrix& head_dv);
void add_head_roundings(bool summed, const Matrix& head, Matrix& partial, Matrix& heads);

// The roundings a soft-cap's backward adds to dS where each step rounds to F: the products by c
// and by the slope, the quotient by c (3), or the slope's alone where c is a power of two (1).
[[nodiscard]] double cap_ds_roundings(double cap);

// PairBlock::ds_roundings for a head of a recipe with `roundings` intermediate roundings, `d` its
// head dimension (metrics/backward_score_terms.cpp).
[[nodiscard]] double ds_roundings_of(const tensor::HeadScores& head, std::size_t d, double roundings,
                                     const EmulatedScoreSlack* emulated);

// dQ's gradient-scale sums (Magnitudes::ScaleSums) taken out of `m` (left 0), or added back: a GQA
// group's per-head sums (Magnitudes::dq_scale_heads) (metrics/backward_score_terms.cpp).
[[nodiscard]] Magnitudes::ScaleSums take_dq_scale_sums(Magnitudes& m);
void add_dq_scale_sums(const Magnitudes::ScaleSums& x, Magnitudes& m);

// The scores' roundings' terms of a recipe that rounds them (u_s > 0), for one block, after its
// products (metrics/backward_score_terms.cpp).
void add_score_terms(const kernels::BackwardProblem& p, const Images& images, double u_s, PairBlock& block,
                     Magnitudes& m);

// The emulated scores' slack in the worst case (Magnitudes::dq_slack_worst, dq_slack_second), for
// one block after its products, zeta per row and visible key (metrics/backward_emulation.cpp).
void add_slack_worst_case(const kernels::BackwardProblem& p, const Images& images,
                          const std::vector<std::vector<double>>& zeta, PairBlock& block, Magnitudes& m);

// The same terms for emulated scores (Magnitudes: EmulatedScoreSlack), for one block: each pair's
// eps is its slack, and the element sums are absolute (not over a unit).
void add_slack_terms(const kernels::BackwardProblem& p, const Images& images, const EmulatedScoreSlack& slack,
                     PairBlock& block, Magnitudes& m);

}  // namespace sharpcheck::metrics::backward_blocks
