#include "reference/attention_backward_double.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>

#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "core/parallel.hpp"
#include "reference/double_stage_row.hpp"
#include "reference/enclosed_product.hpp"
#include "tensor/head_view.hpp"

// Error bounds of one query row i (u = 2^-53, round to nearest; every bound below is computed in
// double and then multiplied by 1 + 2^-40, which covers the rounding of its own few operations while
// they stay normal; below 2^-1022 a rounding errs by up to 2^-1075 absolute instead, so each bound
// also adds 2^-1074 for every product, quotient or rounded result in it that may underflow, counted
// where the bound is formed. The stage runs only with subnormals kept: no flush-to-zero.)
//
// Scores: r~_ij = fl(q_i . k_j) from a GEMM errs by gamma_d sum_t |q_it k_jt| + d 2^-1074
// (enclosed_product.hpp), the magnitude sum itself a GEMM of |Q| and |K|, rounded up (dot_error). The logit
// and its error follow logit_in_double, the exponentials, their sum and p~_j = fl(w~_j / S~) within p_j (1 +-
// e_j) follow the forward's proof (double_stage.cpp; coefficient_error), and p_j in [0, 2^-1008] where w~_j =
// 0. Write rp_j = p~_j e_j. dP~_ij = fl(dO_i . v_j) errs by rdp_j = gamma_dv sum_c |dO_ic v_jc| + dv 2^-1074
// likewise.
//
// D_i = sum_j p_j dP_ij: the recursive sum of p~_j dP~_j errs by gamma_{count+1} sum |p~ dP~| (its
// products' rounding included) plus 3 count 2^-1074 for underflow (its products and the propagated
// ones); the inputs' errors add sum_j (p~_j rdp_j + rp_j (|dP~_j| + rdp_j)). Those sums of non-negative terms
// are themselves computed in double: the true ones are below the computed ones times 1 + 2 gamma_{count+2}.
// g - D: one subtraction, rD + u |g - D~|.
// t_j = dP_j + (g - D): rt_j = rdp_j + r(g - D) + u |t~_j|.
// dz_j = p_j t_j: rdz_j = p~_j rt_j + rp_j (|t~_j| + rt_j) + u |dz~_j| + 3 2^-1074 (three products).
// dr_j = dz_j scale / theta: the computed slope fl(scale / theta) is within 3.02u of the true one
// (1/sqrt(d) is within 2u, the division adds u), so rdr_j = rdz_j |slope~| (1 + 4u) + 4.1u |dr~_j| +
// 3 2^-1074.
// Sink: dz_sink / theta = p_sink (g - D) / theta, bounded as dz_j, then divided (u more, and the
// radius's division rounded up by 2u).
// The products dQ_i = sum_j dr_ij k_j, dK_j = sum_i dr_ij q_i and dV_j = sum_i p_ij dO_i are enclosed
// products with T = m + n + 8 bounding the terms of any one sum; a head's sink gradient is the
// recursive sum of its rows' terms, bounded as D is.

namespace sharpcheck::reference {
namespace {

constexpr double bound_slack = 1 + 0x1p-40;

std::vector<double> magnitudes_of(const Matrix& m) {
  std::vector<double> out(m.values.size());
  std::transform(m.values.begin(), m.values.end(), out.begin(), [](double x) { return std::fabs(x); });
  return out;
}

// A bound on a recursive sum of `count` terms whose magnitudes sum to `magnitude`, given the sum of
// the terms' own error bounds `propagated` (both computed in double).
double sum_radius(double magnitude, double propagated, double count) {
  return ((gamma_of(count + 1) * magnitude + propagated) * (1 + 2 * gamma_of(count + 2)) +
          (3 * count + 1) * 0x1p-1074) *
         bound_slack;
}

// What the whole problem shares: the inputs, their magnitudes, the accumulators.
struct Problem {
  const AttentionBackwardInputs& in;
  std::span<const tensor::HeadScores> heads;
  double terms;  // T: bounds the products summed into any one result
  double gamma_scale;
  std::vector<double> q_abs, k_abs, v_abs, dout_abs;
  BackwardEnclosures sums;  // midpoints; radii hold the product weights until the end
  std::vector<double> sink_magnitudes;
  // Which queries see a key and which keys a query sees: the others' dQ and D, or dK and dV, are
  // sums of no term, exactly 0 (finish_radii gives them radius 0; their weights hold 2^-1074 per
  // masked product, so their intervals would hold both signs and go on to the Arb stage). A query
  // whose dO row and dLSE are 0 has dP = D = 0, so dS = 0 exactly: it moves no dQ and no dK.
  std::vector<char> row_sees_a_key, key_is_seen;
};

// One head's block of query positions [first, last) and the keys they see, [key_first, key_last).
struct Block {
  std::size_t head = 0, first = 0, last = 0, key_first = 0, key_last = 0;
  std::vector<std::vector<std::size_t>> visible;
  [[nodiscard]] std::size_t rows() const { return last - first; }
  [[nodiscard]] std::size_t width() const { return key_last - key_first; }
};

// The block's rows x width matrices: the scores, then dR; dP, then dR's radii; P and its radii;
// sum_t |q_it k_jt| and sum_c |dO_ic v_jc|.
struct BlockMatrices {
  std::vector<double> scores, dp, p, p_radius, scores_magnitude, dp_magnitude;
};

// The error of a dot product of `terms` products computed by a GEMM whose magnitude sum, also
// computed by a GEMM, is `magnitude`: gamma_terms of the true magnitude, which is below
// magnitude (1 + 2 gamma_terms) + terms 2^-1074 (underflow); plus terms 2^-1074 of its own.
double dot_error(double magnitude, std::size_t terms) {
  const auto t = static_cast<double>(terms);
  return (gamma_of(t + 3) * magnitude * (1 + 2 * gamma_of(t + 2)) + (2 * t + 2) * 0x1p-1074) * bound_slack;
}

// What a row gives besides its products: D_i and the sink's gradient term, with their radii.
struct RowResult {
  double d = 0, d_radius = 0, sink = 0, sink_radius = 0;
};

// Row scratch, per thread.
struct RowScratch {
  std::vector<double> logits, errors, exponentials, sum_scratch, p, p_radius, dp, dp_radius;
  void resize(std::size_t entries) {
    for (auto* v : {&logits, &errors, &exponentials, &p, &p_radius, &dp, &dp_radius}) v->resize(entries);
  }
};

double head_scale(const tensor::HeadScores& head, std::size_t d) {
  return head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

// The row's logits with their errors, dP with its errors, from the block's GEMMs. False when a
// bound fails (the stage stands aside).
bool bound_row_inputs(const Problem& problem, const Block& block, std::size_t r, const BlockMatrices& mats,
                      RowScratch& s) {
  const AttentionBackwardInputs& in = problem.in;
  const tensor::HeadScores& head = problem.heads[block.head];
  const std::size_t position = block.first + r;
  const std::size_t d = in.queries.cols, dv = in.values.cols, width = block.width();
  const std::vector<std::size_t>& active = block.visible[r];
  const double scale = head_scale(head, d);
  for (std::size_t a = 0; a < active.size(); ++a) {
    const std::size_t j = active[a], column = r * width + (j - block.key_first);
    const double bias = head.has_bias() ? bias_in_double(head.bias_terms(position, j)) : 0.0;
    const LogitInDouble logit = logit_in_double(
        mats.scores[column], dot_error(mats.scores_magnitude[column], d), scale, bias, head.theta);
    s.logits[a] = logit.z;
    s.errors[a] = logit.error;
    if (!std::isfinite(logit.z) || !std::isfinite(logit.error) || logit.error > 0x1p-30) return false;
    s.dp[a] = mats.dp[column];
    s.dp_radius[a] = dot_error(mats.dp_magnitude[column], dv);
    if (!std::isfinite(s.dp[a]) || !std::isfinite(s.dp_radius[a])) return false;
  }
  if (head.sink) {
    const std::size_t a = active.size();
    s.logits[a] = *head.sink / head.theta;
    s.errors[a] = sink_logit_error(s.logits[a]);
    if (!std::isfinite(s.logits[a]) || s.errors[a] > 0x1p-30) return false;
  }
  return true;
}

// p~_j and rp_j for every entry (rp = 0 for the exact P = 1 of a single key), and D~_i with its
// radius (the header's bounds).
RowResult row_softmax_and_d(std::size_t count, std::size_t entries, bool single, RowScratch& s) {
  AttentionRowInDouble row{s.logits, s.errors, s.exponentials};
  bound_attention_exponentials(entries, s.sum_scratch, row);
  for (std::size_t a = 0; a < entries; ++a) {
    s.p[a] = s.exponentials[a] / row.sum;
    // A subnormal p~ errs absolutely (the quotient's 2^-1075, and p~ e rounding down): 2^-1073.
    s.p_radius[a] =
        s.exponentials[a] == 0 ? 0x1p-1008 : (s.p[a] * coefficient_error(row, a) + 0x1p-1073) * bound_slack;
  }
  if (single) s.p_radius[0] = 0;  // certified_exp(0) / 1 is exactly 1
  RowResult result;
  double magnitude = 0, propagated = 0;
  for (std::size_t a = 0; a < count; ++a) {
    const double term = s.p[a] * s.dp[a];
    result.d += term;
    magnitude += std::fabs(term);
    propagated += s.p[a] * s.dp_radius[a] + s.p_radius[a] * (std::fabs(s.dp[a]) + s.dp_radius[a]);
  }
  result.d_radius = sum_radius(magnitude, propagated, static_cast<double>(count));
  return result;
}

// Row r of the block in double: its D, its sink term, and its rows of dR (over the scores) with
// radii (over dP), P and P's radii; masked columns are zero. False when a bound fails.
bool row_in_double(const Problem& problem, const Block& block, std::size_t r, BlockMatrices& mats,
                   RowResult& result) {
  thread_local RowScratch s;
  const tensor::HeadScores& head = problem.heads[block.head];
  const std::vector<std::size_t>& active = block.visible[r];
  const std::size_t count = active.size(), entries = count + (head.sink ? 1 : 0), width = block.width();
  const std::size_t i = block.head * problem.in.positions() + block.first + r;
  s.resize(entries);
  if (!bound_row_inputs(problem, block, r, mats, s)) return false;
  double* const dr_row = mats.scores.data() + r * width;
  double* const dr_radius_row = mats.dp.data() + r * width;
  double* const p_row = mats.p.data() + r * width;
  double* const p_radius_row = mats.p_radius.data() + r * width;
  for (double* row : {dr_row, dr_radius_row, p_row, p_radius_row}) std::fill(row, row + width, 0.0);
  if (entries == 0) return true;  // no key and no sink: nothing flows back
  // A row with one key and no sink has P = 1 and D = dP exactly, so dP - D + g is g, exactly: a dQ
  // of 0 when g = 0 (the first row of a causal head) is then decided, not straddled.
  const bool single = entries == 1 && count == 1;
  result = row_softmax_and_d(count, entries, single, s);
  const double g = problem.in.d_lse.empty() ? 0.0 : problem.in.d_lse[i];
  const double g_minus_d = g - result.d;
  const double g_minus_d_radius = (result.d_radius + unit_roundoff * std::fabs(g_minus_d)) * bound_slack;
  const double slope = head_scale(head, problem.in.queries.cols) / head.theta;
  for (std::size_t a = 0; a < count; ++a) {
    const std::size_t column = active[a] - block.key_first;
    const double t = single ? g : s.dp[a] + g_minus_d;
    const double t_radius = single ? 0.0 : s.dp_radius[a] + g_minus_d_radius + unit_roundoff * std::fabs(t);
    const double dz = s.p[a] * t;
    const double dz_radius = s.p[a] * t_radius + s.p_radius[a] * (std::fabs(t) + t_radius) +
                             unit_roundoff * std::fabs(dz) + 3 * 0x1p-1074;
    dr_row[column] = dz * slope;
    dr_radius_row[column] = (dz_radius * std::fabs(slope) * (1 + 4 * unit_roundoff) +
                             4.1 * unit_roundoff * std::fabs(dr_row[column]) + 3 * 0x1p-1074) *
                            bound_slack;
    p_row[column] = s.p[a];
    p_radius_row[column] = s.p_radius[a];
    if (!std::isfinite(dr_row[column]) || !std::isfinite(dr_radius_row[column])) return false;
  }
  if (head.sink) {
    const double p = s.p[count], p_radius = s.p_radius[count];
    const double term = p * g_minus_d;
    const double term_radius = p * g_minus_d_radius + p_radius * (std::fabs(g_minus_d) + g_minus_d_radius) +
                               unit_roundoff * std::fabs(term) + 3 * 0x1p-1074;
    result.sink = term / head.theta;
    result.sink_radius = (term_radius / std::fabs(head.theta) * (1 + 2 * unit_roundoff) +
                          unit_roundoff * std::fabs(result.sink) + 2 * 0x1p-1074) *
                         bound_slack;
  }
  return std::isfinite(result.d_radius) && std::isfinite(result.sink_radius);
}

// The block's keys: every key some row of it sees.
void find_visible_keys(const Problem& problem, Block& block) {
  const tensor::KeyRange keys =
      tensor::visible_keys_of_rows(problem.heads[block.head], block.first, block.rows(), block.visible);
  block.key_first = keys.first;
  block.key_last = keys.last;
}

// The block's scores Q K^T and dP = dO V^T over the keys it sees.
void block_scores(const Problem& problem, const Block& block, BlockMatrices& mats) {
  const AttentionBackwardInputs& in = problem.in;
  const std::size_t d = in.queries.cols, dv = in.values.cols, width = block.width();
  const std::size_t first_row = block.head * in.positions() + block.first;
  mats.scores.resize(block.rows() * width);  // written whole by the GEMMs
  mats.dp.resize(block.rows() * width);
  mats.scores_magnitude.resize(block.rows() * width);
  mats.dp_magnitude.resize(block.rows() * width);
  mats.p.resize(block.rows() * width);  // zeroed row by row in row_in_double, then written
  mats.p_radius.resize(block.rows() * width);
  if (width == 0) return;
  plain_product({in.queries.values.data() + first_row * d, block.rows(), d, d},
                {in.keys.values.data() + block.key_first * d, width, d, d, true}, mats.scores.data(), width);
  plain_product({in.d_out.values.data() + first_row * dv, block.rows(), dv, dv},
                {in.values.values.data() + block.key_first * dv, width, dv, dv, true}, mats.dp.data(), width);
  plain_product({problem.q_abs.data() + first_row * d, block.rows(), d, d},
                {problem.k_abs.data() + block.key_first * d, width, d, d, true}, mats.scores_magnitude.data(),
                width);
  plain_product({problem.dout_abs.data() + first_row * dv, block.rows(), dv, dv},
                {problem.v_abs.data() + block.key_first * dv, width, dv, dv, true}, mats.dp_magnitude.data(),
                width);
}

// dQ of the block's rows, and its share of dK and dV, as enclosed products.
void block_products(Problem& problem, const Block& block, BlockMatrices& mats) {
  const AttentionBackwardInputs& in = problem.in;
  const std::size_t d = in.queries.cols, dv = in.values.cols, width = block.width(), rows = block.rows();
  const std::size_t first_row = block.head * in.positions() + block.first;
  if (width == 0) return;
  product_weights(mats.scores, mats.dp, problem.terms, problem.gamma_scale);
  product_weights(mats.p, mats.p_radius, problem.terms, problem.gamma_scale);
  BackwardEnclosures& sums = problem.sums;
  const MatrixOperand dr{mats.scores.data(), rows, width, width},
      dr_weights{mats.dp.data(), rows, width, width};
  const MatrixOperand dr_t{mats.scores.data(), rows, width, width, true};
  const MatrixOperand dr_weights_t{mats.dp.data(), rows, width, width, true};
  const MatrixOperand p_t{mats.p.data(), rows, width, width, true};
  const MatrixOperand p_weights_t{mats.p_radius.data(), rows, width, width, true};
  enclosed_product(dr, dr_weights, {in.keys.values.data() + block.key_first * d, width, d, d},
                   {problem.k_abs.data() + block.key_first * d, width, d, d},
                   {sums.values.d_queries.values.data() + first_row * d,
                    sums.radii.d_queries.values.data() + first_row * d, d});
  enclosed_product(dr_t, dr_weights_t, {in.queries.values.data() + first_row * d, rows, d, d},
                   {problem.q_abs.data() + first_row * d, rows, d, d},
                   {sums.values.d_keys.values.data() + block.key_first * d,
                    sums.radii.d_keys.values.data() + block.key_first * d, d, true});
  enclosed_product(p_t, p_weights_t, {in.d_out.values.data() + first_row * dv, rows, dv, dv},
                   {problem.dout_abs.data() + first_row * dv, rows, dv, dv},
                   {sums.values.d_values.values.data() + block.key_first * dv,
                    sums.radii.d_values.values.data() + block.key_first * dv, dv, true});
}

// Whether query row i has a nonzero dO or dLSE: otherwise its dS is 0 exactly.
bool moves_scores(const AttentionBackwardInputs& in, std::size_t i) {
  if (!in.d_lse.empty() && in.d_lse[i] != 0) return true;
  const std::span<const double> d_out = in.d_out.row(i);
  return std::any_of(d_out.begin(), d_out.end(), [](double x) { return x != 0; });
}

// One block: the GEMMs, the rows in parallel, the products; D and the sink terms recorded. False
// when a row's bound fails.
bool run_block(Problem& problem, Block& block, BlockMatrices& mats, std::vector<RowResult>& rows) {
  find_visible_keys(problem, block);
  block_scores(problem, block, mats);
  rows.assign(block.rows(), RowResult{});
  std::atomic<bool> failed{false};
  parallel_for(block.rows(), 0, [&](std::size_t r) {
    if (!failed && !row_in_double(problem, block, r, mats, rows[r])) failed = true;
  });
  if (failed) return false;
  block_products(problem, block, mats);
  const std::size_t first_row = block.head * problem.in.positions() + block.first;
  AttentionGradients& values = problem.sums.values;
  AttentionGradients& radii = problem.sums.radii;
  for (std::size_t r = 0; r < block.rows(); ++r) {
    if (!block.visible[r].empty() && moves_scores(problem.in, first_row + r)) {
      problem.row_sees_a_key[first_row + r] = 1;
      for (const std::size_t j : block.visible[r]) problem.key_is_seen[j] = 1;
    }
    values.d_rows[first_row + r] = rows[r].d;
    radii.d_rows[first_row + r] = rows[r].d_radius;
    if (values.d_sinks.empty()) continue;
    values.d_sinks[block.head] += rows[r].sink;
    problem.sink_magnitudes[block.head] += std::fabs(rows[r].sink);
    radii.d_sinks[block.head] += rows[r].sink_radius;
  }
  return true;
}

Problem prepare(const AttentionBackwardInputs& in, std::span<const tensor::HeadScores> heads,
                double gamma_scale) {
  const std::size_t m = in.queries.rows, n = in.keys.rows, d = in.queries.cols, dv = in.values.cols;
  const bool sinks =
      std::any_of(heads.begin(), heads.end(), [](const auto& h) { return h.sink.has_value(); });
  const auto zeros = [&] {
    return AttentionGradients{Matrix(m, d), Matrix(n, d), Matrix(n, dv),
                              std::vector<double>(sinks ? in.group : 0), std::vector<double>(m)};
  };
  return Problem{.in = in,
                 .heads = heads,
                 .terms = static_cast<double>(m + n) + 8,
                 .gamma_scale = gamma_scale,
                 .q_abs = magnitudes_of(in.queries),
                 .k_abs = magnitudes_of(in.keys),
                 .v_abs = magnitudes_of(in.values),
                 .dout_abs = magnitudes_of(in.d_out),
                 .sums = BackwardEnclosures{zeros(), zeros()},
                 .sink_magnitudes = std::vector<double>(sinks ? in.group : 0),
                 .row_sees_a_key = std::vector<char>(m),
                 .key_is_seen = std::vector<char>(n)};
}

// The product weights and sums become radii.
void finish_radii(Problem& problem) {
  AttentionGradients& radii = problem.sums.radii;
  for (Matrix* m : {&radii.d_queries, &radii.d_keys, &radii.d_values}) {
    for (double& w : m->values) w = product_radius(w, problem.terms);
  }
  const auto zero_rows = [](Matrix& m, std::size_t row) {
    std::fill_n(m.values.begin() + static_cast<std::ptrdiff_t>(row * m.cols), m.cols, 0.0);
  };
  for (std::size_t i = 0; i < problem.row_sees_a_key.size(); ++i) {
    if (problem.row_sees_a_key[i] != 0) continue;
    zero_rows(radii.d_queries, i);
    radii.d_rows[i] = 0;
  }
  for (std::size_t j = 0; j < problem.key_is_seen.size(); ++j) {
    if (problem.key_is_seen[j] != 0) continue;
    zero_rows(radii.d_keys, j);
    zero_rows(radii.d_values, j);
  }
  // A column of K (Q, dO) that is 0 throughout makes that column of dQ (dK, dV) a sum of exact
  // zeros: a zero-padded head dimension, exactly +0, which the Arb stage would only find slowly.
  const auto zero_columns = [](const Matrix& factor, Matrix& radius) {
    for (std::size_t c = 0; c < factor.cols; ++c) {
      bool zero = true;
      for (std::size_t r = 0; r < factor.rows && zero; ++r) zero = factor(r, c) == 0;
      if (!zero) continue;
      for (std::size_t r = 0; r < radius.rows; ++r) radius(r, c) = 0;
    }
  };
  zero_columns(problem.in.keys, radii.d_queries);
  zero_columns(problem.in.queries, radii.d_keys);
  zero_columns(problem.in.d_out, radii.d_values);
  const auto rows = static_cast<double>(problem.in.positions());
  for (std::size_t h = 0; h < radii.d_sinks.size(); ++h)
    radii.d_sinks[h] = sum_radius(problem.sink_magnitudes[h], radii.d_sinks[h], rows);
}

// The value of `format` every point of [mid - radius, mid + radius] rounds to; a zero is -0 where
// the interval lies below 0 and +0 where it lies at or above 0. An interval of zeros holding both
// signs is left to the Arb stage, whose exponent range can still put it on one side (a gradient of
// about e^-800 underflows double, so here its interval always straddles 0).
std::optional<double> decide(double mid, double radius, const FloatFormat& format) {
  if (!std::isfinite(mid) || !std::isfinite(radius)) return std::nullopt;
  // The ends' own rounding: u |end| each, within 2^-20 radius + 4u |mid|.
  const double bound = radius * (1 + 0x1p-20) + 4 * unit_roundoff * std::fabs(mid);
  const double low = mid - bound, high = mid + bound;
  const std::optional<double> rounded = round_if_decided(low, high, format);
  if (rounded && *rounded == 0 && low < 0 && high > 0) return std::nullopt;
  return rounded;
}

std::size_t decide_each(std::span<const double> mids, std::span<const double> radii,
                        const FloatFormat& format, std::span<double> out, std::vector<bool>& done) {
  std::size_t decided = 0;
  for (std::size_t e = 0; e < mids.size(); ++e) {
    if (done[e]) continue;
    if (const auto value = decide(mids[e], radii[e], format)) {
      out[e] = *value;
      done[e] = true;
      ++decided;
    }
  }
  return decided;
}

}  // namespace

std::optional<BackwardEnclosures> enclose_backward_in_double(const AttentionBackwardInputs& in,
                                                             std::span<const tensor::HeadScores> heads,
                                                             double gamma_scale) {
  if (!certified_arithmetic() ||
      std::any_of(heads.begin(), heads.end(), [](const auto& h) { return h.softcap != 0.0; })) {
    return std::nullopt;
  }
  const SingleThreadedBlas single_threaded;  // the rows run in parallel, the products between them
  Problem problem = prepare(in, heads, gamma_scale);
  // Blocks of about 2^20 scores each: large enough for the GEMMs, small enough to keep the memory
  // near the inputs' size.
  const std::size_t block_rows =
      std::clamp<std::size_t>((std::size_t{1} << 20) / std::max<std::size_t>(in.keys.rows, 1), 8, 512);
  const bool listening = interrupts_apply_here();
  BlockMatrices mats;
  std::vector<RowResult> rows;
  for (std::size_t h = 0; h < heads.size(); ++h) {
    for (std::size_t first = 0; first < heads[h].queries; first += block_rows) {
      if (const int signal = interrupt_signal(); listening && signal != 0) throw Interrupted(signal);
      Block block{
          .head = h, .first = first, .last = std::min(first + block_rows, heads[h].queries), .visible = {}};
      if (!run_block(problem, block, mats, rows)) return std::nullopt;
    }
  }
  finish_radii(problem);
  return std::move(problem.sums);
}

std::size_t decide_backward_in_double(const AttentionBackwardInputs& in,
                                      std::span<const tensor::HeadScores> heads, const FloatFormat& target,
                                      AttentionGradients& out, BackwardDecided& done) {
  if (target.precision() > 24) return 0;
  const std::optional<BackwardEnclosures> enclosures = enclose_backward_in_double(in, heads);
  if (!enclosures) return 0;
  const AttentionGradients& mid = enclosures->values;
  const AttentionGradients& radius = enclosures->radii;
  return decide_each(mid.d_queries.values, radius.d_queries.values, target, out.d_queries.values, done[0]) +
         decide_each(mid.d_keys.values, radius.d_keys.values, target, out.d_keys.values, done[1]) +
         decide_each(mid.d_values.values, radius.d_values.values, target, out.d_values.values, done[2]) +
         decide_each(mid.d_sinks, radius.d_sinks, target, out.d_sinks, done[3]) +
         decide_each(mid.d_rows, radius.d_rows, d_format(target), out.d_rows, done[4]);
}

}  // namespace sharpcheck::reference
