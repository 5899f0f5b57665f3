#include "studies/denominator_stall.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/errors.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::studies {
namespace {

std::vector<double> logits_of(StallRows rows, std::size_t n, std::mt19937_64& random) {
  std::vector<double> logits(n, 0.0);
  if (rows == StallRows::random_normal) {
    std::normal_distribution<double> normal(0, 1);
    for (double& x : logits) x = round_to_format(normal(random), fp32);
  }
  return logits;
}

// The exact denominator sum_j exp(z_j - max) to double precision (well below the effects
// studied: the study's figures are relative errors of 1e-4 and more), from the correctly rounded
// logsumexp.
double exact_denominator(const std::vector<double>& logits) {
  const double top = *std::max_element(logits.begin(), logits.end());
  return std::exp(reference::logsumexp(logits, fp64) - top);
}

// sum_j RN32(exp(z_j - max)), left to right, every partial sum rounded to `accumulation`.
double running_denominator(const std::vector<double>& logits, const FloatFormat& accumulation) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const double z : logits)
    sum = round_to_format(sum + round_to_format(std::exp(z - top), fp32), accumulation);
  return sum;
}

void measure_row(const std::vector<double>& logits, const FloatFormat& accumulation,
                 const FloatFormat& output, StallPoint& point) {
  const std::vector<double> computed = softmax_with_running_sum(logits, accumulation, output);
  const std::vector<double> exact = reference::softmax(logits, output);
  const double denominator_error =
      std::fabs(running_denominator(logits, accumulation) / exact_denominator(logits) - 1);
  if (denominator_error >= point.denominator_error) {
    point.denominator_error = denominator_error;
    point.row_sum = std::accumulate(computed.begin(), computed.end(), 0.0);
  }
  for (std::size_t j = 0; j < exact.size(); ++j) {
    if (exact[j] != 0)
      point.max_relative_error = std::max(point.max_relative_error, std::fabs(computed[j] / exact[j] - 1));
  }
}

// The value at which a running sum of ones stops growing in `accumulation` (0: not below `largest`).
double stall_value(const FloatFormat& accumulation, std::size_t largest) {
  double sum = 0;
  for (std::size_t n = 1; n <= largest; ++n) {
    const double next = round_to_format(sum + 1.0, accumulation);
    if (next == sum) return sum;
    sum = next;
  }
  return 0;
}

}  // namespace

std::vector<double> softmax_with_running_sum(const std::vector<double>& logits,
                                             const FloatFormat& accumulation, const FloatFormat& output) {
  const double top = *std::max_element(logits.begin(), logits.end());
  const double sum = running_denominator(logits, accumulation);
  std::vector<double> probabilities(logits.size());
  for (std::size_t j = 0; j < logits.size(); ++j)
    probabilities[j] = round_to_format(round_to_format(std::exp(logits[j] - top), fp32) / sum, output);
  return probabilities;
}

StallStudy run_stall_study(const StallSettings& settings) {
  StallStudy study{settings, {}, {}};
  if (study.settings.sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) study.settings.sizes.push_back(n);
  }
  for (const std::size_t n : study.settings.sizes) {
    if (n == 0 || n > (std::size_t{1} << 24)) {
      throw InputError(InputProblem::out_of_range,
                       "study: denominator-stall sizes must be from 1 to 16777216, got " + std::to_string(n));
    }
  }
  const std::size_t largest = *std::max_element(study.settings.sizes.begin(), study.settings.sizes.end());
  for (const FloatFormat* accumulation : study.settings.accumulations) {
    study.stall_values.push_back(stall_value(*accumulation, largest));
    for (const StallRows rows : {StallRows::equal, StallRows::random_normal}) {
      std::mt19937_64 random(settings.seed);
      for (const std::size_t n : study.settings.sizes) {
        StallPoint point{accumulation, rows, n};
        const std::size_t count = rows == StallRows::equal ? 1 : settings.rows;
        for (std::size_t r = 0; r < count; ++r)
          measure_row(logits_of(rows, n, random), *accumulation, *settings.output, point);
        study.points.push_back(point);
      }
    }
  }
  return study;
}

}  // namespace sharpcheck::studies
