#include "metrics/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "bounds/bounds.hpp"
#include "core/errors.hpp"
#include "kernels/escape_kernels.hpp"
#include "metrics/attention_geometry.hpp"
#include "metrics/inside_rounding.hpp"
#include "metrics/quantized_weights.hpp"
#include "metrics/score_emulation.hpp"
#include "reference/attention.hpp"
#include "reference/dispersion_escapes.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::metrics {
namespace {

struct RowGeometry {
  RowScale scale;
  std::vector<double> z_magnitudes;
};

// |z_j| = |e_j - m| / |theta| over the unmasked entries (masked entries get 0), with m the logit
// that maximises e / theta; or, for operators that do not shift (sigmoid and stick-breaking look
// at each logit itself), m = 0. With `cut_negligible` (shifted softmax), entries with
// z_j < -negligible_below are counted as negligible, not in n or the spread (tolerance_table.cpp).
RowGeometry row_geometry(std::span<const double> logits, double theta, bool shifted = true,
                         bool cut_negligible = false) {
  RowGeometry geometry;
  geometry.z_magnitudes.assign(logits.size(), 0.0);
  double shift = shifted ? (theta > 0 ? -INFINITY : INFINITY) : 0.0;
  for (const double e : logits) {
    if (e == -INFINITY) continue;
    if (shifted) shift = theta > 0 ? std::max(shift, e) : std::min(shift, e);
  }
  for (std::size_t j = 0; j < logits.size(); ++j) {
    if (logits[j] == -INFINITY) continue;
    double z = std::fabs(logits[j] - shift) / std::fabs(theta);
    if (!std::isfinite(z)) {  // e_j - m overflowed double (logits near -+DBL_MAX): long double holds it
      z = static_cast<double>(std::fabs(static_cast<long double>(logits[j]) - shift) / std::fabs(theta));
    }
    if (cut_negligible && shifted && z > negligible_below) {
      ++geometry.scale.negligible;
      continue;
    }
    ++geometry.scale.n;
    geometry.z_magnitudes[j] = z;
    geometry.scale.largest_magnitude = std::max(geometry.scale.largest_magnitude, z);
  }
  geometry.scale.shift_magnitude = std::fabs(shift / theta);
  return geometry;
}

std::size_t unmasked(std::span<const double> logits) {
  return static_cast<std::size_t>(
      std::count_if(logits.begin(), logits.end(), [](double e) { return e != -INFINITY; }));
}

struct ReferenceRow {
  std::vector<double> expected;
  RowGeometry geometry;  // in terms of what the operator exponentiates
};

// The correctly rounded reference for the kernel's operation on one row, and the row's geometry
// for the tolerance table.
ReferenceRow reference_for(const JudgeSpec& spec, std::span<const double> row, double theta,
                           reference::ZivStatistics* statistics) {
  reference::RowOptions options;
  options.theta = theta;
  options.statistics = statistics;
  const FloatFormat& target = *spec.output;
  const auto n = static_cast<double>(unmasked(row));
  switch (spec.operation) {
    case kernels::Operation::softmax:
      return {reference::softmax(row, target, options), row_geometry(row, theta, true, true)};
    case kernels::Operation::adaptive_temperature: {
      // The geometry at the row's beta (in double: it only scales the bound's u terms).
      const auto probabilities = reference::softmax(row, fp64, reference::RowOptions{theta});
      double entropy = 0;
      for (const double p : probabilities) entropy -= p * std::log(p + 1e-9);
      return {reference::adaptive_temperature_softmax(row, target, options),
              row_geometry(row, theta / bounds::adaptive_beta(entropy), true, true)};
    }
    case kernels::Operation::scalable_softmax:  // n = 1: theta / 0 is infinite and every z is 0
      return {reference::scalable_softmax(row, target, options),
              row_geometry(row, theta / std::log(n), true, true)};
    case kernels::Operation::length_scaled_softmax: {
      const double factor = reference::length_scale_factor(static_cast<std::uint64_t>(n),
                                                           kernels::length_scaled_training_length);
      return {reference::length_scaled_softmax(row, target, kernels::length_scaled_training_length, options),
              row_geometry(row, theta / factor, true, true)};
    }
    case kernels::Operation::sigmoid_attention:
      return {reference::sigmoid_attention_weights(row, target, options), row_geometry(row, theta, false)};
    case kernels::Operation::stick_breaking:
      return {reference::stick_breaking_weights(row, target, options), row_geometry(row, theta, false)};
    case kernels::Operation::attention:
      break;
  }
  throw std::logic_error("judge_softmax: attention is not a row operation");
}

}  // namespace

Evaluation evaluate_softmax(const kernels::SoftmaxKernel& kernel, const Matrix& logits, double theta) {
  Matrix actual;
  kernel.run(logits, theta, actual);
  return judge_softmax({kernel.operation, kernel.output, &tolerance_for(kernel.name)}, logits, theta,
                       std::move(actual));
}

Evaluation judge_softmax(const JudgeSpec& spec, const Matrix& logits, double theta, Matrix actual,
                         std::size_t first_row_number) {
  if (actual.rows != logits.rows || actual.cols != logits.cols) {
    throw InputError(InputProblem::shape_mismatch, "judge: the outputs are " + std::to_string(actual.rows) +
                                                       "x" + std::to_string(actual.cols) +
                                                       " but the logits are " + std::to_string(logits.rows) +
                                                       "x" + std::to_string(logits.cols));
  }
  Evaluation evaluation;
  evaluation.actual = std::move(actual);
  evaluation.expected = Matrix(logits.rows, logits.cols);
  Matrix magnitudes(logits.rows, logits.cols);
  Matrix z_magnitudes(logits.rows, logits.cols);
  evaluation.allowed = Matrix(logits.rows, logits.cols);
  // Sigmoid and stick-breaking weights are not distributions: no sum, argmax or KL check for them.
  const bool distributions = spec.operation != kernels::Operation::sigmoid_attention &&
                             spec.operation != kernels::Operation::stick_breaking;
  ComparisonInput input{&evaluation.expected, &evaluation.actual, &magnitudes,        &z_magnitudes, {},
                        distributions,        first_row_number,   &evaluation.allowed};
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const std::span<const double> row = logits.row(r);
    const ReferenceRow reference_row = reference_for(spec, row, theta, &evaluation.reference_statistics);
    std::copy(reference_row.expected.begin(), reference_row.expected.end(),
              evaluation.expected.row(r).begin());
    for (std::size_t j = 0; j < row.size(); ++j) {
      magnitudes(r, j) = std::fabs(reference_row.expected[j]);
      z_magnitudes(r, j) = reference_row.geometry.z_magnitudes[j];
    }
    input.scales.push_back(reference_row.geometry.scale);
  }
  evaluation.comparison = compare(input, *spec.tolerance, *spec.output);
  return evaluation;
}

Evaluation judge_log_softmax(const JudgeSpec& spec, const Matrix& logits, double theta, Matrix actual,
                             std::size_t first_row_number) {
  if (actual.rows != logits.rows || actual.cols != logits.cols) {
    throw InputError(InputProblem::shape_mismatch,
                     "judge: the log-probabilities are " + std::to_string(actual.rows) + "x" +
                         std::to_string(actual.cols) + " but the logits are " + std::to_string(logits.rows) +
                         "x" + std::to_string(logits.cols));
  }
  Evaluation evaluation;
  evaluation.expected = Matrix(logits.rows, logits.cols);
  evaluation.actual = Matrix(logits.rows, logits.cols);
  evaluation.allowed = Matrix(logits.rows, logits.cols);
  Matrix magnitudes(logits.rows, logits.cols), z_magnitudes(logits.rows, logits.cols);
  Matrix own_rounding(logits.rows, logits.cols);
  ComparisonInput input{&evaluation.expected, &evaluation.actual,  &magnitudes,  &z_magnitudes, {}, false,
                        first_row_number,     &evaluation.allowed, &own_rounding};
  const double u_out = spec.output->unit_roundoff();
  reference::RowOptions options;
  options.theta = theta;
  options.statistics = &evaluation.reference_statistics;
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const std::span<const double> row = logits.row(r);
    const std::vector<double> expected = reference::log_softmax(row, *spec.output, options);
    // n and the spread without the negligible entries (as for softmax); each element's own
    // argument term with its own |z_j|, negligible or not (its log-probability is its size).
    const RowGeometry geometry = row_geometry(row, theta, true, true);
    const RowGeometry own = row_geometry(row, theta, true, false);
    for (std::size_t j = 0; j < row.size(); ++j) {
      const bool masked = expected[j] == -INFINITY;  // -inf is the one right answer there
      evaluation.expected(r, j) = masked ? 0.0 : expected[j];
      evaluation.actual(r, j) = masked ? (actual(r, j) == -INFINITY ? 0.0 : NAN) : actual(r, j);
      magnitudes(r, j) = masked ? 0.0 : 1.0;
      own_rounding(r, j) = masked ? 0.0 : 2 * u_out * std::fabs(expected[j]) * (1 + 0x1p-40);
      z_magnitudes(r, j) = own.z_magnitudes[j];
    }
    input.scales.push_back(geometry.scale);
  }
  evaluation.comparison = compare(input, *spec.tolerance, *spec.output);
  return evaluation;
}

Evaluation evaluate_attention(const kernels::AttentionKernel& kernel, const Matrix& queries,
                              const Matrix& keys, const Matrix& values, const tensor::HeadScores& scores) {
  Matrix actual;
  kernel.run(queries, keys, values, scores, actual, nullptr);
  const JudgeSpec spec{kernels::Operation::attention, kernel.output, &tolerance_for(kernel.name)};
  if (kernel.declared_inputs == nullptr)
    return judge_attention(spec, queries, keys, values, scores, std::move(actual));
  // A kernel that quantises its own inputs is judged on the values its declared quantisation gives.
  Matrix q = queries, k = keys, v = values;
  kernel.declared_inputs(q, k, v, scores);
  return judge_attention(spec, q, k, v, scores, std::move(actual));
}

namespace {

// Each row's copies (RowRounding::copies): the rows with bit-equal q in a head whose scores do not
// depend on the position (no causal mask, window, mask, bias or ALiBi), itself included.
void set_copies(const Matrix& queries, const tensor::HeadScores& head, std::span<RowRounding> roundings) {
  if (!head.rows_alike()) return;
  std::unordered_map<std::string, std::vector<std::size_t>> rows;
  const std::size_t computed = head.queries != 0 ? std::min(head.queries, queries.rows) : queries.rows;
  for (std::size_t i = 0; i < computed; ++i) {  // padding rows are nobody's copies
    const std::span<const double> row = queries.row(i);
    rows[std::string(reinterpret_cast<const char*>(row.data()), row.size_bytes())].push_back(i);
  }
  for (const auto& [bytes, same] : rows)
    for (const std::size_t i : same)
      if (i < roundings.size()) roundings[i].copies = static_cast<double>(same.size());
}

// The statistical tier around emulated scores of one chain: each row's o~ and spreads, then the
// comparison and row-scale test of `base` again around o~. nullopt if a row cannot be emulated.
std::optional<Comparison> judge_emulated(const ScoreEmulator& emulator, const JudgeSpec& spec,
                                         const Matrix& queries, const Matrix& values,
                                         const tensor::HeadScores& head, const ComparisonInput& base) {
  const std::size_t rows = queries.rows, columns = values.cols;
  InsideSpreads spreads{Matrix(rows, columns), Matrix(rows, columns), Matrix(rows, columns),
                        Matrix(rows, columns), Matrix(rows, columns)};
  std::vector<RowRounding> roundings(rows);
  std::vector<std::size_t> visible;
  EmulatedRow row;
  VisibleWeights weights;
  for (std::size_t i = 0; i < rows; ++i) {
    head.visible_keys(i, visible);
    if (!emulator.row(i, visible, row)) return std::nullopt;
    if (row.z.empty()) continue;  // o = 0: the base comparison's zeros stand
    const EmulatedSink sink{emulated_weights(row.z, visible.size(), weights),
                            row.z.size() > visible.size() ? row.ambiguity.back() : 0.0};
    for (std::size_t c = 0; c < columns; ++c) {
      double magnitude = 0;
      for (std::size_t a = 0; a < visible.size(); ++a)
        magnitude += weights.p[a] * std::fabs(values(visible[a], c));
      spreads.centre_magnitude(i, c) = magnitude * (1 + 1e-9);
    }
    roundings[i] = emulated_rounding(values, visible, weights, {row.ambiguity.data(), visible.size()}, sink,
                                     spreads.centre_magnitude.row(i));
    for (std::size_t c = 0; c < columns; ++c) spreads.centre(i, c) = roundings[i].exact[c];
    store_spreads(roundings[i], i, spreads);
  }
  ComparisonInput input = base;
  input.allowed = nullptr;
  input.inside = &spreads;
  Comparison comparison = compare(input, *spec.tolerance, *spec.output);
  set_copies(queries, head, roundings);
  judge_head_scales(*base.actual, roundings, spreads.centre_magnitude, *spec.tolerance, base.scales,
                    *spec.output, /*emulated_only=*/true, comparison);
  return comparison;
}

// How far a comparison is from passing the statistical tier (the elements and the row scales).
double statistical_closeness(const Comparison& comparison) {
  return std::max(comparison.max_statistical_ratio, comparison.max_row_scale_ratio);
}

// The math path's scores, emulated one variant at a time (`tried`: score_variants(head)): one
// comparison per variant, or none when a row cannot be emulated (a score beyond F's range). The
// variant that fits best is a head's verdict, and every variant is kept so that a judgement of many
// heads picks one variant for all of them (judge_tensors.cpp): a kernel forms its scores one way.
// The proven tier stays the worst case of any two roundings.
std::vector<Comparison> emulated_variants(const JudgeSpec& spec, const Matrix& queries, const Matrix& keys,
                                          const Matrix& values, const tensor::HeadScores& head,
                                          const ComparisonInput& input, std::span<const ScoreVariant> tried) {
  std::vector<Comparison> variants;
  for (const ScoreVariant& variant : tried) {
    const ScoreEmulator emulator(variant.chain, queries, keys, head, *spec.tolerance->score_format,
                                 variant.rounding, variant.cap);
    if (!emulator.distinct()) {  // the same factors as the fp32 variant just before: the same comparison
      variants.push_back(Comparison(variants[variants.size() - static_cast<std::size_t>(variant.rounding)]));
      continue;
    }
    std::optional<Comparison> emulated = judge_emulated(emulator, spec, queries, values, head, input);
    if (!emulated) return {};
    variants.push_back(std::move(*emulated));
  }
  return variants;
}

}  // namespace

namespace {

// The head's correctly rounded output (and log-sum-exp) into `evaluation`: computed, or taken from
// the slot a judgement of several recipes keeps it in (JudgeSpec::known).
void attention_reference(const JudgeSpec& spec, const Matrix& queries, const Matrix& keys,
                         const Matrix& values, const tensor::HeadScores& head, Evaluation& evaluation) {
  if (spec.known != nullptr && spec.known->has_value()) {
    evaluation.expected = (*spec.known)->output;
    evaluation.expected_lse = (*spec.known)->lse;
    evaluation.reference_statistics = (*spec.known)->statistics;
    return;
  }
  reference::AttentionOptions options;
  options.scores = head;
  options.return_lse = spec.lse;
  options.lse_base2 = spec.lse_base2;
  options.lse_format = spec.lse_format;
  options.statistics = &evaluation.reference_statistics;
  auto reference_result = reference::attention(queries, keys, values, *spec.output, options);
  evaluation.expected = std::move(reference_result.output);
  evaluation.expected_lse = std::move(reference_result.lse);
  if (spec.known != nullptr)
    spec.known->emplace(
        KnownReference{evaluation.expected, evaluation.expected_lse, evaluation.reference_statistics});
}

}  // namespace

Evaluation judge_attention(const JudgeSpec& spec, const Matrix& queries, const Matrix& keys,
                           const Matrix& values, const tensor::HeadScores& scores, Matrix actual) {
  Evaluation evaluation;
  evaluation.actual = std::move(actual);
  tensor::HeadScores head = scores;
  head.fully_masked = tensor::FullyMaskedRows::zeros;
  attention_reference(spec, queries, keys, values, head, evaluation);
  Matrix magnitudes(queries.rows, values.cols);
  Matrix z_magnitudes(queries.rows, values.cols);
  evaluation.allowed = Matrix(queries.rows, values.cols);
  ComparisonInput input{&evaluation.expected, &evaluation.actual, &magnitudes, &z_magnitudes, {}, false, 0,
                        &evaluation.allowed};
  input.output_rounding_of_expected = true;
  if (head.queries == 0) head.queries = queries.rows;
  if (head.keys == 0) head.keys = keys.rows;
  if (head.row_stride == 0) head.row_stride = keys.rows;
  InsideSpreads spreads{.p = Matrix(queries.rows, values.cols),
                        .s = Matrix(queries.rows, values.cols),
                        .s_second = Matrix(queries.rows, values.cols),
                        .centre = {},
                        .centre_magnitude = {}};
  input.inside = &spreads;
  const double u_s = inside_units(*spec.tolerance, *spec.output).s;
  HeadGeometry geometry = attention_head_geometry(queries, keys, values, head, u_s);
  magnitudes = std::move(geometry.magnitudes);
  std::vector<RowRounding>& roundings = geometry.roundings;
  for (std::size_t i = 0; i < queries.rows; ++i) {
    for (std::size_t c = 0; c < values.cols; ++c) z_magnitudes(i, c) = geometry.scales[i].largest_magnitude;
    store_spreads(roundings[i], i, spreads);
    evaluation.lse_spreads.push_back(
        {roundings[i].lse_p_spread, roundings[i].lse_s_spread, roundings[i].lse_s_second});
  }
  input.scales = std::move(geometry.scales);
  add_smoothing_shifts(*spec.tolerance, queries, keys, head, input.scales);
  evaluation.comparison = compare(input, *spec.tolerance, *spec.output);
  evaluation.row_scales = input.scales;
  if (spec.tolerance->scores_emulated && spec.tolerance->score_format != nullptr && scores_emulable(head)) {
    input.inside = nullptr;
    const std::vector<ScoreVariant> tried = score_variants(head);
    std::vector<Comparison> variants = emulated_variants(spec, queries, keys, values, head, input, tried);
    if (!variants.empty()) {
      std::size_t best = 0;
      for (std::size_t v = 1; v < variants.size(); ++v) {
        if (statistical_closeness(variants[v]) < statistical_closeness(variants[best])) best = v;
      }
      evaluation.score_chain = describe(tried[best]);
      evaluation.comparison = variants[best];
      evaluation.emulated_variants = std::move(variants);
      return evaluation;
    }
  }
  // A kernel whose rounded weights are emulated: the statistical tier is judged around them.
  if (auto around_weights = judge_emulated_weights(*spec.tolerance, *spec.output, queries, keys, values, head,
                                                   input, roundings)) {
    evaluation.comparison = std::move(*around_weights);
    return evaluation;
  }
  set_copies(queries, head, roundings);
  judge_head_scales(evaluation.actual, roundings, magnitudes, *spec.tolerance, input.scales, *spec.output,
                    /*emulated_only=*/false, evaluation.comparison);
  return evaluation;
}

}  // namespace sharpcheck::metrics
