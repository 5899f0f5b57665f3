#include "metrics/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace sharpcheck::metrics {
namespace {
constexpr std::size_t max_described_violations = 8;

void add_violation(Comparison& comparison, std::string text) {
  ++comparison.violation_count;
  if (comparison.violations.size() < max_described_violations)
    comparison.violations.push_back(std::move(text));
}
}  // namespace

std::string ElementReport::describe() const {
  std::ostringstream text;
  text << "row " << row << " index " << index << ": expected " << hex_float(expected) << " got "
       << hex_float(actual);
  if (ulps) {
    text << " (" << *ulps << " ulp";
  } else {
    text << " (no ulp distance";
  }
  text << ", |error| " << std::fabs(actual - expected) << " vs allowed " << allowed << ", bound ratio "
       << bound_ratio << ")";
  return text.str();
}

void Comparison::merge(const Comparison& other) {
  const bool take_worst = elements == 0 || other.max_bound_ratio > max_bound_ratio;
  const double total_ulps =
      mean_ulps * static_cast<double>(elements) + other.mean_ulps * static_cast<double>(other.elements);
  rows += other.rows;
  elements += other.elements;
  mean_ulps = elements == 0 ? 0 : total_ulps / static_cast<double>(elements);
  max_ulps = std::max(max_ulps, other.max_ulps);
  max_absolute_error = std::max(max_absolute_error, other.max_absolute_error);
  max_relative_error = std::max(max_relative_error, other.max_relative_error);
  max_sum_error = std::max(max_sum_error, other.max_sum_error);
  argmax_disagreements += other.argmax_disagreements;
  max_kl_divergence = std::max(max_kl_divergence, other.max_kl_divergence);
  false_zeros += other.false_zeros;
  non_finite += other.non_finite;
  if (take_worst) worst = other.worst;
  max_bound_ratio = std::max(max_bound_ratio, other.max_bound_ratio);
  violation_count += other.violation_count;
  for (const auto& text : other.violations) {
    if (violations.size() < max_described_violations) violations.push_back(text);
  }
}

namespace {

// Argmax of row r: judged only where the reference's top two are farther apart than their bounds.
void judge_argmax(const Matrix& expected, const Matrix& actual, std::size_t r,
                  const std::vector<double>& allowed, std::size_t row_number, Comparison& result) {
  std::size_t top = 0;
  for (std::size_t j = 1; j < expected.cols; ++j) {
    if (expected(r, j) > expected(r, top)) top = j;
  }
  double runner_up = -INFINITY;
  std::size_t runner_up_index = top;
  for (std::size_t j = 0; j < expected.cols; ++j) {
    if (j != top && expected(r, j) > runner_up) {
      runner_up = expected(r, j);
      runner_up_index = j;
    }
  }
  if (runner_up_index == top || expected(r, top) - runner_up <= allowed[top] + allowed[runner_up_index])
    return;
  const double kernel_best = *std::max_element(actual.row(r).begin(), actual.row(r).end());
  if (!(actual(r, top) >= kernel_best)) {
    ++result.argmax_disagreements;
    add_violation(result,
                  "row " + std::to_string(row_number) + ": argmax moved from index " + std::to_string(top));
  }
}

}  // namespace

Comparison compare(const ComparisonInput& input, const Tolerance& tolerance, const FloatFormat& output) {
  const Matrix& expected = *input.expected;
  const Matrix& actual = *input.actual;
  Comparison result;
  result.rows = expected.rows;
  result.elements = expected.rows * expected.cols;
  const double relative_floor = std::ldexp(1.0, output.min_normal_exponent);
  double total_ulps = 0;
  bool have_worst = false;
  for (std::size_t r = 0; r < expected.rows; ++r) {
    const std::size_t row_number = input.first_row_number + r;
    double sum = 0;
    double allowed_sum = 0;
    double kl = 0;
    std::vector<double> allowed(expected.cols);
    for (std::size_t j = 0; j < expected.cols; ++j) {
      const double e = expected(r, j);
      const double a = actual(r, j);
      allowed[j] = allowed_error(tolerance, (*input.magnitudes)(r, j), (*input.z_magnitudes)(r, j),
                                 input.scales[r], output);
      if (input.additional != nullptr) allowed[j] += (*input.additional)(r, j);
      if (input.allowed != nullptr) (*input.allowed)(r, j) = allowed[j];
      ElementReport element{row_number, j, e, a, std::nullopt, allowed[j], 0};
      if (is_representable(a, output)) element.ulps = ulp_distance(a, e, output);
      const double error = std::fabs(a - e);
      if (!std::isfinite(a) && std::isfinite(e)) {
        ++result.non_finite;
        element.bound_ratio = std::numeric_limits<double>::infinity();
      } else {
        element.bound_ratio = error == 0 ? 0 : error / allowed[j];
        result.max_absolute_error = std::max(result.max_absolute_error, error);
        result.max_relative_error =
            std::max(result.max_relative_error, error / std::max(std::fabs(e), relative_floor));
      }
      if (element.ulps) {
        result.max_ulps = std::max(result.max_ulps, *element.ulps);
        total_ulps += static_cast<double>(*element.ulps);
      }
      if (a == 0 && e != 0) ++result.false_zeros;
      if (!(element.bound_ratio <= 1)) add_violation(result, element.describe());
      if (!have_worst || element.bound_ratio > result.max_bound_ratio ||
          (element.bound_ratio == result.max_bound_ratio &&
           element.ulps.value_or(0) > result.worst.ulps.value_or(0))) {
        result.worst = element;
        result.max_bound_ratio = element.bound_ratio;
        have_worst = true;
      }
      sum += a;
      allowed_sum += allowed[j] + std::fabs(e) * output.unit_roundoff();
      if (e > 0) kl += a > 0 ? e * std::log(e / a) : std::numeric_limits<double>::infinity();
    }
    if (!input.rows_are_distributions || expected.cols == 0) continue;
    const double sum_error = std::fabs(sum - 1);
    result.max_sum_error = std::max(result.max_sum_error, std::isnan(sum_error) ? INFINITY : sum_error);
    allowed_sum += static_cast<double>(expected.cols) * 0x1p-52;
    if (!(sum_error <= allowed_sum)) {
      add_violation(result, "row " + std::to_string(row_number) + ": |sum - 1| = " +
                                std::to_string(sum_error) + " exceeds " + std::to_string(allowed_sum));
    }
    result.max_kl_divergence = std::max(result.max_kl_divergence, kl);
    judge_argmax(expected, actual, r, allowed, row_number, result);
  }
  result.mean_ulps = result.elements == 0 ? 0 : total_ulps / static_cast<double>(result.elements);
  return result;
}

}  // namespace sharpcheck::metrics
