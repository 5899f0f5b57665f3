#include "metrics/quantized_weights.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "metrics/inside_rounding.hpp"

namespace sharpcheck::metrics {
namespace {

constexpr double ln2 = 0.6931471805599453;

}  // namespace

bool smooths(const kernels::QuantizedWeights& recipe, const tensor::HeadScores& scores) {
  return recipe.smoothed_keys && scores.softcap == 0.0 && !scores.sink;
}

std::vector<SmoothingShift> smoothing_shifts(const Matrix& queries, const Matrix& keys,
                                             const tensor::HeadScores& scores) {
  const std::size_t d = keys.cols;
  std::vector<SmoothingShift> shifts(queries.rows);
  if (keys.rows == 0) return shifts;
  std::vector<double> mean(d, 0.0);
  for (std::size_t j = 0; j < keys.rows; ++j) {
    for (std::size_t t = 0; t < d; ++t) mean[t] += keys(j, t);
  }
  for (double& m : mean) m /= static_cast<double>(keys.rows);
  // The kernel's own mean, an fp32 sum of the keys before quantisation, is off the given keys' mean
  // by its quantisation (within 2^-6 of the spread) and its fp32 sum's error (within n 2^-23 of the
  // channel's largest |k|).
  double spread = 0;
  std::vector<double> largest(d, 0.0);
  for (std::size_t j = 0; j < keys.rows; ++j) {
    for (std::size_t t = 0; t < d; ++t) {
      spread = std::max(spread, std::fabs(keys(j, t) - mean[t]));
      largest[t] = std::max(largest[t], std::fabs(keys(j, t)));
    }
  }
  const double summation = static_cast<double>(keys.rows + 2) * 0x1p-23;
  const double scale = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const double margin = 1 + 0x1p-40;
  for (std::size_t i = 0; i < queries.rows; ++i) {
    double centre = 0, absolute = 0, slack = 0;
    for (std::size_t t = 0; t < d; ++t) {
      centre += queries(i, t) * mean[t];
      absolute += std::fabs(queries(i, t) * mean[t]);
      slack += std::fabs(queries(i, t)) * (0x1p-6 * spread + summation * largest[t]);
    }
    // The double sums' own errors (d 2^-52 of the absolute sums) go into the slack.
    slack = (slack + static_cast<double>(d) * 0x1p-52 * absolute) * std::fabs(scale) * margin;
    shifts[i] = {.centre = centre * scale,
                 .slack = slack,
                 .bound = (absolute * std::fabs(scale) * margin + slack) / std::fabs(scores.theta)};
  }
  return shifts;
}

void add_smoothing_shifts(const kernels::Tolerance& entry, const Matrix& queries, const Matrix& keys,
                          const tensor::HeadScores& scores, std::span<RowScale> rows) {
  if (entry.quantized_weights == nullptr || !smooths(*entry.quantized_weights, scores)) return;
  const std::vector<SmoothingShift> shifts = smoothing_shifts(queries, keys, scores);
  for (std::size_t i = 0; i < rows.size() && i < shifts.size(); ++i)
    rows[i].smoothing_shift = static_cast<double>(queries.cols + 6) * shifts[i].bound;
}

WeightEmulator::WeightEmulator(const kernels::QuantizedWeights& recipe, const Matrix& queries,
                               const Matrix& keys, const tensor::HeadScores& scores)
    : recipe_(recipe), queries_(queries), keys_(keys), scores_(scores) {
  scale_ = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(queries.cols));
  covers_ = recipe.format != nullptr && recipe.tile > 0 && std::isfinite(scale_) && scores.theta != 0.0 &&
            std::isfinite(scores.theta);
  if (covers_ && smooths(recipe, scores)) shifts_ = smoothing_shifts(queries, keys, scores);
}

// The exact logit z = (softcap(scale q.k) + b) / theta in double (its own error, d 2^-52 sum |q k|
// and a few roundings of |z|, is part of `error`) and the most an honest kernel's fp32 logit may
// differ from it: any summation order of the d products, blocked or not, with at most d + 4
// roundings each relative to sum_t |q_t k_t| (the recursive-summation bound gamma_n, with the block
// scales' products and conversions); the scale held in fp32 and multiplied (2^-23 |s|); a soft-cap's
// division, tanh (within 4 ulp) and product (2^-21 (|s| + |c|) in all, tanh's slope being at
// most 1); the bias converted to fp32 and added (2^-23 (|b| + |c + b|)); 1/theta in fp32 and its
// product (2^-23 |z|). Each is taken twice over.
WeightEmulator::Score WeightEmulator::score(std::size_t query, std::size_t key) const {
  const std::size_t d = queries_.cols;
  const double* q = queries_.row(query).data();
  const double* k = keys_.row(key).data();
  double dot = 0, absolute = 0;
  for (std::size_t t = 0; t < d; ++t) {
    dot += q[t] * k[t];
    absolute += std::fabs(q[t] * k[t]);
  }
  const double scaled = dot * scale_;
  const double cap = scores_.softcap;
  const double capped = cap != 0.0 ? cap * std::tanh(scaled / cap) : scaled;
  const double bias = scores_.has_bias() ? scores_.bias_of(query, key) : 0.0;
  const double biased = capped + bias;
  const double theta = std::fabs(scores_.theta);
  const double value = biased / scores_.theta;
  if (recipe_.exact_dot_product && cap == 0.0) return {value, exact_dot_error(query, scaled, bias, value)};
  const double units = static_cast<double>(d + 4) * 0x1p-23 + static_cast<double>(d + 2) * 0x1p-51;
  double error = units * absolute * std::fabs(scale_) + 0x1p-22 * std::fabs(scaled);
  if (cap != 0.0) error += 0x1p-20 * (std::fabs(scaled) + std::fabs(capped));
  error += 0x1p-22 * (std::fabs(bias) + std::fabs(biased));
  return {value, error / theta + 0x1p-22 * std::fabs(value) + 0x1p-50 * std::fabs(value)};
}

// The kernel's max lies in [max_j (z_j - e_j), max_j (z_j + e_j)], which holds the exact one too.
// (A key hidden by a mask of -1e9 has an error near 500 but cannot reach the max: it widens nothing.)
WeightEmulator::Score WeightEmulator::largest_of(std::span<const Score> tile) {
  double value = -std::numeric_limits<double>::infinity(), low = value, high = value;
  for (const auto& score : tile) {
    value = std::max(value, score.value);
    low = std::max(low, score.value - score.error);
    high = std::max(high, score.value + score.error);
  }
  return {value, std::max(high - value, value - low)};
}

// An exact dot product (an INT8 MMA into int32, converted to fp32 exactly below 2^24) times
// fl(s_q s_k) and the scale, in any order: each of the few fp32 roundings is relative to the
// kernel's scaled score, which for smoothed keys is the declared one less the kernel's shift,
// |scaled - C| <= |scaled - centre| + slack (the declared one where the head is not smoothed); then
// the bias and theta as score() charges them. Each
// is taken twice over (2^-21 for about three roundings of 2^-24), plus the double's own error.
double WeightEmulator::exact_dot_error(std::size_t query, double scaled, double bias, double value) const {
  double own = std::fabs(scaled);
  if (!shifts_.empty()) own = std::fabs(scaled - shifts_[query].centre) + shifts_[query].slack;
  const double error = 0x1p-21 * own + static_cast<double>(queries_.cols + 2) * 0x1p-51 * std::fabs(scaled) +
                       0x1p-22 * (std::fabs(bias) + std::fabs(scaled + bias));
  return error / std::fabs(scores_.theta) + 0x1p-22 * std::fabs(value) + 0x1p-50 * std::fabs(value);
}

// Visible keys are taken in tiles of key positions [t tile, (t + 1) tile), as FlashAttention-style
// kernels tile K (a tile with no visible key is skipped).
bool WeightEmulator::emulate_row(std::size_t query, std::span<const std::size_t> visible,
                                 EmulatedWeights& out) const {
  const std::size_t n = visible.size();
  // The kernel holds the threshold in fp32 and adds it to its max in fp32 (charged 2^-22 below).
  const double threshold = recipe_.rescale_threshold_log2 * ln2;
  RowState state;
  for (auto* column : {&state.code, &state.spread, &state.unrounded, &state.unrounded_error, &state.at})
    column->assign(n, 0.0);
  const double sink = scores_.sink ? *scores_.sink / scores_.theta : 0.0;
  if (scores_.sink) state.max = {sink, 0x1p-21 * std::fabs(sink)};
  std::vector<Score> tile;
  // Smoothed keys: the kernel's logits are z_j - c, their fp32 roundings relative to |z_j| + |c|
  // (exact_dot_error charges them relative to |z_j - c| itself).
  const double shift_error =
      shifts_.empty() || recipe_.exact_dot_product ? 0.0 : 0x1p-21 * shifts_[query].bound;
  for (std::size_t start = 0, end = 0; start < n; start = end) {
    tile.clear();
    for (end = start; end < n && visible[end] / recipe_.tile == visible[start] / recipe_.tile; ++end) {
      tile.push_back(score(query, visible[end]));
      if (!std::isfinite(tile.back().value)) return false;
      tile.back().error += shift_error;
    }
    const Score tile_max = largest_of(tile);
    const Score before = state.max;
    if (before.value != -std::numeric_limits<double>::infinity()) {
      const double gap = tile_max.value - (before.value + threshold);
      const double margin = tile_max.error + before.error + 0x1p-22 * (std::fabs(before.value) + threshold);
      if (std::fabs(gap) <= margin) return false;  // an honest kernel may decide either way
      if (gap > 0) {
        state.max = tile_max;
        // The kernel rescales what it has summed by fl(exp(m_old - m_new)): that factor's relative
        // error, charged in finish_row in proportion to the share it scales.
        const double exponent = before.error + tile_max.error +
                                0x1p-22 * (std::fabs(before.value) + std::fabs(tile_max.value)) + 0x1p-21;
        state.rescales.push_back({std::expm1(exponent), start});
      }
    } else {
      state.max = tile_max;
    }
    round_tile(tile, start, state);
  }
  finish_row(state, sink, out);
  return true;
}

// The codes of one tile's weights, against the running max (the header's schedule).
void WeightEmulator::round_tile(std::span<const Score> tile, std::size_t first, RowState& state) const {
  const double offset = std::ldexp(1.0, recipe_.offset_log2);
  const double largest = recipe_.format->max_finite;
  const auto rounded = [&](double w) { return round_to_format(std::min(w, largest), *recipe_.format); };
  const Score& max = state.max;
  for (std::size_t j = 0; j < tile.size(); ++j) {
    const double difference = tile[j].value - max.value;
    const double x = offset * std::exp(difference);
    // The exponent's error: both logits', the fp32 subtraction's (2^-24 |z - m|, taken as 2^-22),
    // a log2(e) folded into either before exp2 (2^-22 (|z| + |m|)) and an fp32 exponential within
    // 4 ulp (2^-21 relative).
    const double delta = tile[j].error + max.error + 0x1p-22 * std::fabs(difference) +
                         0x1p-22 * (std::fabs(tile[j].value) + std::fabs(max.value)) + 0x1p-21;
    state.at[first + j] = max.value;
    // A key hidden by a finite mask (-1e9, finfo.min): even at the far end of its enclosure its
    // weight is below every format's least subnormal, so it is 0 in any honest kernel (and 0 times
    // exp(delta), infinite, is not asked).
    if (difference + delta < -1000) continue;
    state.code[first + j] = rounded(x);
    state.spread[first + j] = rounded(x * std::exp(delta)) - rounded(x * std::exp(-delta));
    state.unrounded[first + j] = x;
    state.unrounded_error[first + j] = x * std::expm1(delta);
  }
}

// Every weight relative to the last max, as the kernel's rescaling leaves them, over the declared
// row sum (the sink's weight is the offset at its own logit). The drift: a rescale by a factor of
// relative error e scales a share phi of the row (numerator and row sum alike), moving o by at most
// e (M_A + phi |o|) / (1 - e phi) <= e (M + |o|) / (1 - e phi), and nothing where phi is exactly 0
// (a tile hidden by a finite mask, its weights 0 once rescaled); a row sum of the fp32 weights moves
// with their errors, sum_j x_j expm1(delta_j) / sum_j x_j relative. With a row sum of the rounded
// codes, flips of total F move the row sum too, so each flip is charged over 1 - F. A share or
// flips too large for these bounds make the drift infinite: the row keeps the worst case.
void WeightEmulator::finish_row(const RowState& state, double sink, EmulatedWeights& out) const {
  const std::size_t n = state.code.size();
  const double offset = std::ldexp(1.0, recipe_.offset_log2);
  const double sink_share = scores_.sink ? offset * std::exp(sink - state.max.value) : 0.0;
  std::vector<double> summed(n + 1, sink_share);  // summed[j]: the row sum before key j
  double sum_error = 0, flips = 0;
  out.weight.assign(n, 0.0);
  out.flip.assign(n, 0.0);
  out.row_sum_of_rounded = recipe_.row_sum_of_rounded;
  for (std::size_t j = 0; j < n; ++j) {
    const double factor = std::exp(state.at[j] - state.max.value);
    summed[j + 1] = summed[j];
    if (factor == 0) continue;  // rescaled to exactly 0 in any honest kernel
    out.weight[j] = state.code[j] * factor;
    out.flip[j] = state.spread[j] * factor;
    summed[j + 1] += (recipe_.row_sum_of_rounded ? state.code[j] : state.unrounded[j]) * factor;
    sum_error += state.unrounded_error[j] * factor;
  }
  const double sum = summed[n];
  out.drift = 0;
  if (sum == 0) return;  // no key and no sink: the kernel writes zeros
  for (const auto& [error, first] : state.rescales) {
    const double share = summed[first] / sum;
    if (share > 0) out.drift += error * share < 0.5 ? error / (1 - error * share) : INFINITY;
  }
  if (!recipe_.row_sum_of_rounded) out.drift += sum_error / sum;
  for (std::size_t j = 0; j < n; ++j) {
    out.weight[j] /= sum;
    out.flip[j] /= sum;
    flips += out.flip[j];
  }
  if (!recipe_.row_sum_of_rounded) return;
  if (!(flips < 0.5)) out.drift = INFINITY;
  for (double& flip : out.flip) flip /= 1 - flips;
}

kernels::Tolerance around_emulated_weights(const kernels::Tolerance& entry) {
  kernels::Tolerance rest = entry;
  rest.probabilities_in_output = rest.probability_floor = 0;
  rest.argument = rest.spread = rest.dot_product = 0;
  return rest;
}

namespace {

// Row i of the centred comparison: o~ = sum_j w_j v_j and its magnitude sum_j w_j |v_j|; in
// `s_second` what the flips can move it by, each flip's full width times |v_jc| (and |o~_c|
// where the row sum takes the same weights, which moves the denominator too), plus the double
// arithmetic's own error (n + 11) 2^-50 (M~ + |o~|), and the drift (rescale factors, an fp32 row
// sum) times M~ + |o~|. The row-scale fields the same way, projected on the signs of o~
// (RowRounding's emulated form).
RowRounding centred_row(const EmulatedWeights& w, const Matrix& values, std::span<const std::size_t> visible,
                        std::size_t i, InsideSpreads& spreads) {
  const std::size_t columns = values.cols;
  RowRounding r;
  r.exact.assign(columns, 0.0);
  r.p_spread.assign(columns, 0.0);
  r.s_spread.assign(columns, 0.0);
  r.s_second.assign(columns, 0.0);
  r.emulated = true;
  std::vector<double> magnitude(columns, 0.0), flips(columns, 0.0);
  double flip_weight = 0, flip_projection = 0;
  for (std::size_t a = 0; a < visible.size(); ++a) {
    const double* v = values.row(visible[a]).data();
    for (std::size_t c = 0; c < columns; ++c) {
      r.exact[c] += w.weight[a] * v[c];
      magnitude[c] += w.weight[a] * std::fabs(v[c]);
      flips[c] += w.flip[a] * std::fabs(v[c]);
    }
    flip_weight += w.flip[a];
  }
  double absolute_sum = 0, arithmetic_total = 0;
  for (const double o : r.exact) absolute_sum += std::fabs(o);
  for (std::size_t a = 0; a < visible.size(); ++a) {
    if (w.flip[a] == 0) continue;
    double absolute = 0;
    for (const double v : values.row(visible[a])) absolute += std::fabs(v);
    flip_projection += w.flip[a] * absolute;
  }
  const double arithmetic = static_cast<double>(visible.size() + 11) * 0x1p-50 + w.drift * (1 + 0x1p-30);
  const double shared = w.row_sum_of_rounded ? flip_weight : 0.0;
  for (std::size_t c = 0; c < columns; ++c) {
    const double own = arithmetic * (magnitude[c] + std::fabs(r.exact[c]));
    arithmetic_total += own;
    r.s_second[c] = (flips[c] + shared * std::fabs(r.exact[c])) * (1 + 0x1p-30) + own;
    spreads.centre(i, c) = r.exact[c];
    spreads.centre_magnitude(i, c) = magnitude[c] * (1 + 1e-9);
    spreads.s_second(i, c) = r.s_second[c];
  }
  r.scale_s_second = (flip_projection + shared * absolute_sum) * (1 + 0x1p-30) + arithmetic_total;
  return r;
}

// A row the emulation cannot follow, centred on the correctly rounded output e (within u_out |e| of
// the exact one) with the entry's whole statistical allowance in `s_second`, which the centred
// charge adds to the rest's: the worst case of P's rounding, as without the emulation.
void worst_case_row(const kernels::Tolerance& entry, const FloatFormat& output, const ComparisonInput& base,
                    std::size_t i, InsideSpreads& spreads) {
  const double u_out = output.unit_roundoff();
  for (std::size_t c = 0; c < spreads.centre.cols; ++c) {
    const double e = (*base.expected)(i, c), magnitude = (*base.magnitudes)(i, c);
    spreads.centre(i, c) = e;
    spreads.centre_magnitude(i, c) = magnitude;
    spreads.s_second(i, c) = allowed_error(entry, magnitude, (*base.z_magnitudes)(i, c), base.scales[i],
                                           output, Tier::statistical, std::fabs(e)) +
                             u_out * std::fabs(e) * (1 + 0x1p-20);
  }
}

}  // namespace

std::optional<Comparison> judge_emulated_weights(const kernels::Tolerance& entry, const FloatFormat& output,
                                                 const Matrix& queries, const Matrix& keys,
                                                 const Matrix& values, const tensor::HeadScores& head,
                                                 const ComparisonInput& base,
                                                 std::span<const RowRounding> standard) {
  if (entry.quantized_weights == nullptr) return std::nullopt;
  const WeightEmulator emulator(*entry.quantized_weights, queries, keys, head);
  if (!emulator.covers_head()) return std::nullopt;
  const std::size_t rows = queries.rows, columns = values.cols;
  InsideSpreads spreads{.p = {},
                        .s = Matrix(rows, columns),
                        .s_second = Matrix(rows, columns),
                        .centre = Matrix(rows, columns),
                        .centre_magnitude = Matrix(rows, columns),
                        .weights_emulated = true,
                        .centre_slack = {}};
  std::vector<RowRounding> roundings(rows);
  std::vector<std::size_t> visible;
  EmulatedWeights weights;
  for (std::size_t i = 0; i < rows; ++i) {
    head.visible_keys(i, visible);
    // A row whose schedule could branch otherwise, or whose enclosures are too wide to say anything
    // (a logit beyond fp32's range), keeps the worst-case charge; the rest of the head does not.
    if (!emulator.emulate_row(i, visible, weights) || !std::isfinite(weights.drift) ||
        !std::all_of(weights.flip.begin(), weights.flip.end(), [](double f) { return std::isfinite(f); })) {
      worst_case_row(entry, output, base, i, spreads);
      continue;
    }
    roundings[i] = centred_row(weights, values, visible, i, spreads);
  }
  ComparisonInput input = base;
  input.allowed = nullptr;
  input.inside = &spreads;
  Comparison comparison = compare(input, entry, output);
  const kernels::Tolerance rest = around_emulated_weights(entry);
  HeadScale head_scale;
  for (std::size_t i = 0; i < rows; ++i) {
    if (roundings[i].emulated)
      head_scale.add(judge_row_scale(*base.actual, i, roundings[i], spreads.centre_magnitude.row(i), rest,
                                     base.scales[i], output, comparison));
    else if (i < standard.size())
      head_scale.add(judge_row_scale(*base.actual, i, standard[i], base.magnitudes->row(i), entry,
                                     base.scales[i], output, comparison));
  }
  head_scale.judge(comparison);
  return comparison;
}

}  // namespace sharpcheck::metrics
