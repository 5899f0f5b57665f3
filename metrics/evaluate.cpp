#include "metrics/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "bounds/bounds.hpp"
#include "core/errors.hpp"
#include "reference/attention.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::metrics {
namespace {


struct RowGeometry {
  RowScale scale;
  std::vector<double> z_magnitudes;
};

// |z_j| = |e_j - m| / |theta| over the unmasked entries (masked entries get 0).
RowGeometry row_geometry(std::span<const double> logits, double theta) {
  RowGeometry geometry;
  geometry.z_magnitudes.assign(logits.size(), 0.0);
  double shift = theta > 0 ? -INFINITY : INFINITY;
  for (const double e : logits) {
    if (e == -INFINITY) continue;
    shift = theta > 0 ? std::max(shift, e) : std::min(shift, e);
    ++geometry.scale.n;
  }
  for (std::size_t j = 0; j < logits.size(); ++j) {
    if (logits[j] == -INFINITY) continue;
    geometry.z_magnitudes[j] = std::fabs(logits[j] - shift) / std::fabs(theta);
    geometry.scale.largest_magnitude = std::max(geometry.scale.largest_magnitude, geometry.z_magnitudes[j]);
  }
  geometry.scale.shift_magnitude = std::fabs(shift / theta);
  return geometry;
}

}  // namespace


Evaluation evaluate_softmax(const kernels::SoftmaxKernel& kernel, const Matrix& logits, double theta) {
  Matrix actual;
  kernel.run(logits, theta, actual);
  return judge_softmax(kernel, tolerance_for(kernel.name), logits, theta, std::move(actual));
}

Evaluation judge_softmax(const kernels::SoftmaxKernel& kernel, const Tolerance& tolerance, const Matrix& logits,
                         double theta, Matrix actual) {
  if (actual.rows != logits.rows || actual.cols != logits.cols) {
    throw InputError(InputProblem::shape_mismatch, "judge: the outputs are " + std::to_string(actual.rows) + "x" +
                                                       std::to_string(actual.cols) + " but the logits are " +
                                                       std::to_string(logits.rows) + "x" + std::to_string(logits.cols));
  }
  Evaluation evaluation;
  evaluation.actual = std::move(actual);
  evaluation.expected = Matrix(logits.rows, logits.cols);
  Matrix magnitudes(logits.rows, logits.cols);
  Matrix z_magnitudes(logits.rows, logits.cols);
  evaluation.allowed = Matrix(logits.rows, logits.cols);
  ComparisonInput input{&evaluation.expected, &evaluation.actual, &magnitudes, &z_magnitudes, {}, true, 0,
                        &evaluation.allowed};
  std::vector<std::size_t> judged_rows;
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const std::span<const double> row = logits.row(r);
    RowGeometry geometry = row_geometry(row, theta);
    reference::RowOptions options;
    options.theta = theta;
    options.statistics = &evaluation.reference_statistics;
    if (kernel.operation == kernels::Operation::adaptive_temperature) {
      // beta from the exact definition (probabilities correctly rounded to fp64, entropy with the
      // 1e-9 term in double: both far below the kernel's error), then softmax(beta e / theta).
      const auto probabilities = reference::softmax(row, fp64, options);
      double entropy = 0;
      for (const double p : probabilities) entropy -= p * std::log(p + 1e-9);
      const double n = static_cast<double>(geometry.scale.n);
      const double entropy_error =
          tolerance.accumulation->unit_roundoff() * n * (2 + std::log(n) + geometry.scale.largest_magnitude) + 1e-9 * n;
      const bool near_switch = std::fabs(entropy - 0.5) <= entropy_error ||
                               (entropy > 0.5 && std::fabs(bounds::adaptive_polynomial(entropy) - 1) <= 5 * entropy_error);
      if (near_switch) {
        ++evaluation.rows_not_judged;
        continue;
      }
      options.theta = theta / bounds::adaptive_beta(entropy);
      geometry = row_geometry(row, options.theta);
    }
    const auto expected = reference::softmax(row, *kernel.output, options);
    std::copy(expected.begin(), expected.end(), evaluation.expected.row(r).begin());
    for (std::size_t j = 0; j < row.size(); ++j) {
      magnitudes(r, j) = std::fabs(expected[j]);
      z_magnitudes(r, j) = geometry.z_magnitudes[j];
    }
    input.scales.push_back(geometry.scale);
    judged_rows.push_back(r);
  }
  if (judged_rows.size() == logits.rows) {
    evaluation.comparison = compare(input, tolerance, *kernel.output);
    return evaluation;
  }
  // Compare the judged rows only, one at a time, keeping their row numbers.
  for (std::size_t k = 0; k < judged_rows.size(); ++k) {
    const std::size_t r = judged_rows[k];
    Matrix expected_row(1, logits.cols), actual_row(1, logits.cols), magnitude_row(1, logits.cols),
        z_row(1, logits.cols);
    for (std::size_t j = 0; j < logits.cols; ++j) {
      expected_row(0, j) = evaluation.expected(r, j);
      actual_row(0, j) = evaluation.actual(r, j);
      magnitude_row(0, j) = magnitudes(r, j);
      z_row(0, j) = z_magnitudes(r, j);
    }
    Matrix allowed_row(1, logits.cols);
    const ComparisonInput one{&expected_row, &actual_row, &magnitude_row, &z_row, {input.scales[k]}, true, r,
                              &allowed_row};
    evaluation.comparison.merge(compare(one, tolerance, *kernel.output));
    std::copy(allowed_row.values.begin(), allowed_row.values.end(), evaluation.allowed.row(r).begin());
  }
  return evaluation;
}

Evaluation evaluate_attention(const kernels::AttentionKernel& kernel, const Matrix& queries, const Matrix& keys,
                              const Matrix& values, bool causal, double theta) {
  Matrix actual;
  kernel.run(queries, keys, values, 1.0 / std::sqrt(static_cast<double>(queries.cols)) / theta, causal, actual);
  return judge_attention(kernel, tolerance_for(kernel.name), queries, keys, values, causal, theta, std::move(actual));
}

Evaluation judge_attention(const kernels::AttentionKernel& kernel, const Tolerance& tolerance, const Matrix& queries,
                           const Matrix& keys, const Matrix& values, bool causal, double theta, Matrix actual) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(queries.cols));
  Evaluation evaluation;
  evaluation.actual = std::move(actual);
  reference::AttentionOptions options;
  options.theta = theta;
  options.causal = causal;
  options.return_weights = true;
  options.fully_masked_gives_zeros = true;
  options.statistics = &evaluation.reference_statistics;
  auto reference_result = reference::attention(queries, keys, values, *kernel.output, options);
  evaluation.expected = std::move(reference_result.output);
  const Matrix& weights = *reference_result.weights;
  Matrix magnitudes(queries.rows, values.cols);
  Matrix z_magnitudes(queries.rows, values.cols);
  evaluation.allowed = Matrix(queries.rows, values.cols);
  ComparisonInput input{&evaluation.expected, &evaluation.actual, &magnitudes, &z_magnitudes, {}, false, 0,
                        &evaluation.allowed};
  const double inflation = 1 + 2 * kernel.output->unit_roundoff();  // weights are rounded to the output format
  for (std::size_t i = 0; i < queries.rows; ++i) {
    const std::size_t visible = causal ? std::min(keys.rows, i + 1) : keys.rows;
    RowScale row_scale;
    row_scale.n = visible;
    double largest = -INFINITY;
    double smallest = INFINITY;
    for (std::size_t j = 0; j < visible; ++j) {
      double dot = 0;
      double absolute = 0;
      for (std::size_t t = 0; t < queries.cols; ++t) {
        dot += queries(i, t) * keys(j, t);
        absolute += std::fabs(queries(i, t) * keys(j, t));
      }
      const double z = dot * scale / theta;
      largest = std::max(largest, z);
      smallest = std::min(smallest, z);
      row_scale.logit_rounding = std::max(row_scale.logit_rounding,
                                          static_cast<double>(queries.cols) * absolute * scale / std::fabs(theta));
    }
    row_scale.largest_magnitude = visible == 0 ? 0 : largest - smallest;
    for (std::size_t c = 0; c < values.cols; ++c) {
      double magnitude = 0;
      for (std::size_t j = 0; j < visible; ++j) magnitude += weights(i, j) * std::fabs(values(j, c));
      magnitudes(i, c) = magnitude * inflation;
      z_magnitudes(i, c) = row_scale.largest_magnitude;
    }
    input.scales.push_back(row_scale);
  }
  evaluation.comparison = compare(input, tolerance, *kernel.output);
  return evaluation;
}

}  // namespace sharpcheck::metrics
