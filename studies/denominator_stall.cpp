#include "studies/denominator_stall.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>

#include "bounds/bounds.hpp"
#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::studies {
namespace {

std::vector<double> logits_of(StallRows rows, std::size_t n, DeterministicRandom& random) {
  std::vector<double> logits(n, 0.0);
  if (rows == StallRows::random_normal) {
    for (double& x : logits) x = round_to_format(random.normal(), fp32);
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

std::vector<double> terms_of(const std::vector<double>& logits) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> terms(logits.size());
  for (std::size_t j = 0; j < logits.size(); ++j) terms[j] = round_to_format(std::exp(logits[j] - top), fp32);
  return terms;
}

double sequential_sum(std::span<const double> terms, const FloatFormat& format) {
  double sum = 0;
  for (const double term : terms) sum = round_to_format(sum + term, format);
  return sum;
}

// Halves summed recursively, each sum rounded (8 terms or fewer summed in order at the leaves).
double pairwise_sum(std::span<const double> terms, const FloatFormat& format) {
  if (terms.size() <= 8) return sequential_sum(terms, format);
  const std::size_t half = terms.size() / 2;
  return round_to_format(pairwise_sum(terms.first(half), format) + pairwise_sum(terms.subspan(half), format),
                         format);
}

// Kahan's compensated sum with the sum, the compensation and every intermediate in `format`.
double kahan_sum(std::span<const double> terms, const FloatFormat& format) {
  double sum = 0, compensation = 0;
  for (const double term : terms) {
    const double y = round_to_format(round_to_format(term, format) - compensation, format);
    const double t = round_to_format(sum + y, format);
    compensation = round_to_format(round_to_format(t - sum, format) - y, format);
    sum = t;
  }
  return sum;
}

void measure_row(const std::vector<double>& logits, const FloatFormat& output, StallPoint& point) {
  const std::vector<double> computed = softmax_with_running_sum(logits, point.strategy, output);
  const std::vector<double> exact = reference::softmax(logits, output);
  const double denominator_error =
      std::fabs(strategy_denominator(logits, point.strategy) / exact_denominator(logits) - 1);
  if (denominator_error >= point.denominator_error) {
    point.denominator_error = denominator_error;
    point.row_sum = std::accumulate(computed.begin(), computed.end(), 0.0);
  }
  for (std::size_t j = 0; j < exact.size(); ++j) {
    if (exact[j] != 0)
      point.max_relative_error = std::max(point.max_relative_error, std::fabs(computed[j] / exact[j] - 1));
  }
}

// A sequential sum of ones: the value at which it stops growing, found by summing (nullopt: not
// below `largest`). Other strategies: the first sum of n ones over the sizes that is not n.
std::optional<double> stall_value(const AccumulationStrategy& strategy,
                                  const std::vector<std::size_t>& sizes) {
  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
  if (strategy.summation == Summation::sequential) {
    double sum = 0;
    for (std::size_t n = 1; n <= largest; ++n) {
      const double next = round_to_format(sum + 1.0, *strategy.format);
      if (next == sum) return sum;
      sum = next;
    }
    return std::nullopt;
  }
  for (const std::size_t n : sizes) {
    const double sum = strategy_denominator(std::vector<double>(n, 0.0), strategy);
    if (sum != static_cast<double>(n)) return sum;
  }
  return std::nullopt;
}

std::vector<AccumulationStrategy> default_strategies() {
  using enum Summation;
  return {{sequential, &bf16}, {sequential, &fp16}, {sequential, &fp8_e4m3}, {sequential, &fp8_e5m2},
          {pairwise, &bf16},   {kahan, &bf16},      {sequential, &fp32}};
}

}  // namespace

std::string AccumulationStrategy::name() const {
  const char* kind = summation == Summation::sequential ? "sequential_"
                     : summation == Summation::pairwise ? "pairwise_"
                                                        : "kahan_";
  return kind + std::string(format->name);
}

double strategy_denominator(const std::vector<double>& logits, const AccumulationStrategy& strategy) {
  const std::vector<double> terms = terms_of(logits);
  switch (strategy.summation) {
    case Summation::pairwise:
      return pairwise_sum(terms, *strategy.format);
    case Summation::kahan:
      return kahan_sum(terms, *strategy.format);
    case Summation::sequential:
      break;
  }
  return sequential_sum(terms, *strategy.format);
}

std::vector<double> softmax_with_running_sum(const std::vector<double>& logits,
                                             const AccumulationStrategy& strategy,
                                             const FloatFormat& output) {
  const std::vector<double> terms = terms_of(logits);
  const double sum = strategy_denominator(logits, strategy);
  std::vector<double> probabilities(logits.size());
  for (std::size_t j = 0; j < logits.size(); ++j) probabilities[j] = round_to_format(terms[j] / sum, output);
  return probabilities;
}

StallStudy run_stall_study(const StallSettings& settings) {
  StallStudy study{settings, {}, {}, {}};
  if (study.settings.sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) study.settings.sizes.push_back(n);
  }
  if (study.settings.strategies.empty()) study.settings.strategies = default_strategies();
  for (const std::size_t n : study.settings.sizes) {
    if (n == 0 || n > (std::size_t{1} << 24)) {
      throw InputError(InputProblem::out_of_range,
                       "study: stall sizes must be from 1 to 16777216, got " + std::to_string(n));
    }
  }
  const auto& strategies = study.settings.strategies;
  const std::size_t sizes = study.settings.sizes.size();
  for (const AccumulationStrategy& strategy : strategies) {
    study.stall_values.push_back(stall_value(strategy, study.settings.sizes));
    study.horizons.push_back(strategy.summation == Summation::sequential
                                 ? std::optional(bounds::accumulation_horizon(*strategy.format))
                                 : std::nullopt);
  }
  // One work item per strategy and row kind, each drawing its rows from the seed in size order, so
  // the results do not depend on the threads.
  study.points.resize(strategies.size() * 2 * sizes);
  parallel_for(strategies.size() * 2, settings.threads, [&](std::size_t item) {
    const StallRows rows = item % 2 == 0 ? StallRows::equal : StallRows::random_normal;
    DeterministicRandom random(settings.seed);
    for (std::size_t s = 0; s < sizes; ++s) {
      StallPoint& point = study.points[item * sizes + s];
      point = StallPoint{strategies[item / 2], rows, study.settings.sizes[s]};
      const std::size_t count = rows == StallRows::equal ? 1 : settings.rows;
      for (std::size_t r = 0; r < count; ++r)
        measure_row(logits_of(rows, point.n, random), *settings.output, point);
    }
  });
  return study;
}

}  // namespace sharpcheck::studies
