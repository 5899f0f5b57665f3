// The paper's claims and the kernels' invariants as RapidCheck properties, each named as a
// sentence. Default run counts are sized for CI; RC_PARAMS="max_success=1000000 seed=..." scales
// a run up, and every failure prints its seed and reproduce string.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>

#include "bounds/bounds.hpp"
#include "core/random.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "properties/generators.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::properties {
namespace {

struct Spread {
  double n = 0;
  double delta = 0;
};
Spread spread_of(const Row& row) {
  Spread result;
  double low = INFINITY;
  double high = -INFINITY;
  for (const double e : row) {
    if (e == -INFINITY) continue;
    result.n += 1;
    low = std::min(low, e);
    high = std::max(high, e);
  }
  result.delta = high - low;  // exact: fp32 values well inside double's range
  return result;
}

std::vector<double> reference_softmax(const Row& row, double theta) {
  reference::RowOptions options;
  options.theta = theta;
  return reference::softmax(row, fp64, options);
}

std::vector<const kernels::SoftmaxKernel*> sound_plain_softmax_kernels() {
  std::vector<const kernels::SoftmaxKernel*> result;
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (!kernel.deliberately_broken && kernel.operation == kernels::Operation::softmax)
      result.push_back(&kernel);
  }
  return result;
}

RC_GTEST_PROP(Reference, EveryCoefficientLiesWithinLemma21sBoundsWithNoSlack, ()) {
  const Row row = *rows_of_logits_within(30);
  const double theta = *a_temperature();
  const Spread spread = spread_of(row);
  const auto bound = bounds::lemma_2_1(spread.n, spread.delta, theta);
  // Correct rounding is monotone, so an exact p within [L, U] rounds within [RD(L), RU(U)].
  for (const double p : reference_softmax(row, theta)) RC_ASSERT(bound.lower <= p && p <= bound.upper);
}

RC_GTEST_PROP(Reference, TheTightBoundHoldsForEveryRowAndIsMetByTheExtremalRow, ()) {
  const Row row = *rows_of_logits_within(30);
  const double theta = *a_temperature();
  const Spread spread = spread_of(row);
  const double tight = bounds::tight_largest_coefficient(spread.n, spread.delta, theta);
  const auto coefficients = reference_softmax(row, theta);
  RC_ASSERT(*std::max_element(coefficients.begin(), coefficients.end()) <= tight);
  Row extremal(row.size(), 0.0);
  extremal[0] = spread.delta;
  const double attained = reference_softmax(extremal, theta)[0];
  // The extremal row's coefficient is the tight bound itself, correctly rounded: the bound
  // (rounded up) is that value or the next double.
  RC_ASSERT(attained <= tight && tight <= std::nextafter(attained, INFINITY));
}

RC_GTEST_PROP(Reference, EntropyIsAtLeastLogNMinusTheScaledSpread, ()) {
  const Row row = *rows_of_logits_within(30);
  const double theta = *a_temperature();
  const Spread spread = spread_of(row);
  reference::RowOptions options;
  options.theta = theta;
  RC_ASSERT(reference::entropy(row, fp64, options) >=
            bounds::entropy_lower_bound(spread.n, spread.delta, theta));
}

RC_GTEST_PROP(Bounds, Proposition31HoldsForRandomWeightsInOneToSixtyFourDimensions, ()) {
  const auto d = static_cast<std::size_t>(*rc::gen::inRange(1, 65));
  const auto heads = static_cast<std::size_t>(*rc::gen::inRange(1, 9));
  const auto items = static_cast<std::size_t>(*rc::gen::inRange(1, 9));
  const Matrix q = *a_matrix(heads, d);
  const Matrix k = *a_matrix(heads, d);
  const Matrix y = *a_matrix(1, d);
  const Matrix x = *a_matrix(items, d);
  const auto result = bounds::proposition_3_1(q, k, y, x);
  RC_ASSERT(result.actual_spread.upper <= result.bound);
}

RC_GTEST_PROP(AdaptiveTemperature, NeverRaisesEntropyOnTheReference, ()) {
  const Row row = *rows_of_logits_within(10);
  const double entropy = reference::entropy(row, fp64);
  const double beta = bounds::adaptive_beta(entropy);
  RC_ASSERT(beta >= 1.0);
  reference::RowOptions sharper;
  sharper.theta = 1 / beta;
  // Entropy falls as the inverse temperature grows; correct rounding keeps the order.
  RC_ASSERT(reference::entropy(row, fp64, sharper) <= entropy * (1 + 0x1p-50));
}

double entropy_in_double(std::span<const double> probabilities) {
  double entropy = 0;
  for (const double p : probabilities) {
    if (p > 0) entropy -= p * std::log(p);
  }
  return entropy;
}

RC_GTEST_PROP(AdaptiveTemperature, NeverRaisesEntropyOnTheKernel, ()) {
  const Row row = *rows_of_logits_within(10);
  const Matrix logits = as_matrix(row);
  Matrix plain;
  Matrix adaptive;
  kernels::find_softmax_kernel("safe3")->run(logits, 1.0, plain);
  kernels::find_softmax_kernel("adaptive")->run(logits, 1.0, adaptive);
  // Slack: the fp32 outputs carry relative error of order n u; entropy moves by at most that
  // times (1 + log n + spread).
  const double n = static_cast<double>(row.size());
  const double slack = 1e-5 * n * (2 + std::log(n) + spread_of(row).delta);
  RC_ASSERT(entropy_in_double(adaptive.row(0)) <= entropy_in_double(plain.row(0)) + slack);
}

RC_GTEST_PROP(Kernels, EverySoundKernelStaysWithinItsEntryOnStressingRows, ()) {
  const auto* kernel = *rc::gen::elementOf(sound_plain_softmax_kernels());
  const Row row = in_format(*any_stressing_row(), *kernel->input);
  const double theta = *a_temperature();
  const auto evaluation = metrics::evaluate_softmax(*kernel, as_matrix(row), theta);
  RC_ASSERT(evaluation.comparison.passed());
  RC_ASSERT(evaluation.comparison.argmax_disagreements == 0u);
}

RC_GTEST_PROP(Kernels, OutputsObeyLemma21UpToTheirEntry, ()) {
  const auto* kernel = *rc::gen::elementOf(sound_plain_softmax_kernels());
  const Row row = in_format(*rows_of_logits_within(20), *kernel->input);
  const double theta = *a_temperature();
  const auto evaluation = metrics::evaluate_softmax(*kernel, as_matrix(row), theta);
  const Spread spread = spread_of(row);
  const auto bound = bounds::lemma_2_1(spread.n, spread.delta, theta);
  for (std::size_t j = 0; j < row.size(); ++j) {
    RC_ASSERT(evaluation.actual(0, j) <= bound.upper + evaluation.allowed(0, j));
    RC_ASSERT(evaluation.actual(0, j) >= bound.lower - evaluation.allowed(0, j));
  }
}

RC_GTEST_PROP(Kernels, AddingAConstantToEveryLogitChangesNoOutputBeyondTheEntry, ()) {
  const auto* kernel = *rc::gen::elementOf(sound_plain_softmax_kernels());
  const Row row = in_format(*rows_of_logits_within(20), *kernel->input);
  const double constant = *rc::gen::inRange(-8, 9);
  Row shifted = row;
  for (double& e : shifted) e += constant;
  RC_PRE(in_format(shifted, *kernel->input) == shifted);  // the shifted logits must be exact inputs
  const auto original = metrics::evaluate_softmax(*kernel, as_matrix(row), 1.0);
  const auto moved = metrics::evaluate_softmax(*kernel, as_matrix(shifted), 1.0);
  for (std::size_t j = 0; j < row.size(); ++j) {
    RC_ASSERT(std::fabs(original.actual(0, j) - moved.actual(0, j)) <=
              original.allowed(0, j) + moved.allowed(0, j));
  }
}

RC_GTEST_PROP(Kernels, PermutingTheLogitsPermutesTheOutputsWithinTheEntry, ()) {
  const auto* kernel = *rc::gen::elementOf(sound_plain_softmax_kernels());
  const Row row = in_format(*any_stressing_row(), *kernel->input);
  DeterministicRandom random(*rc::gen::arbitrary<std::uint64_t>());
  std::vector<std::size_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[random.below(i)]);
  Row permuted(row.size());
  for (std::size_t j = 0; j < row.size(); ++j) permuted[j] = row[order[j]];
  const auto original = metrics::evaluate_softmax(*kernel, as_matrix(row), 1.0);
  const auto moved = metrics::evaluate_softmax(*kernel, as_matrix(permuted), 1.0);
  for (std::size_t j = 0; j < row.size(); ++j) {
    RC_ASSERT(std::fabs(moved.actual(0, j) - original.actual(0, order[j])) <=
              moved.allowed(0, j) + original.allowed(0, order[j]));
  }
}

RC_GTEST_PROP(Kernels, ALargerLogitNeverGetsASmallerWeightBeyondTheEntry, ()) {
  const auto* kernel = *rc::gen::elementOf(sound_plain_softmax_kernels());
  const Row row = in_format(*any_stressing_row(), *kernel->input);
  const auto evaluation = metrics::evaluate_softmax(*kernel, as_matrix(row), 1.0);
  for (std::size_t i = 0; i < row.size(); ++i) {
    for (std::size_t j = 0; j < row.size(); ++j) {
      if (row[i] > row[j]) {
        RC_ASSERT(evaluation.actual(0, i) >=
                  evaluation.actual(0, j) - evaluation.allowed(0, i) - evaluation.allowed(0, j));
      }
    }
  }
}

// Mutation checks: a false bound and a broken kernel must be refuted, and the false bound's
// counterexample must shrink to a short row.
TEST(Mutation, TheFalseBoundCoefficientAtMostOneOverNIsRefutedAndShrunkToAShortRow) {
  std::size_t last_failing_size = 0;
  const bool held = rc::check("coefficient <= 1/n (false)", [&] {
    const Row row = *rows_of_logits_within(30);
    const auto coefficients = reference_softmax(row, 1.0);
    const double largest = *std::max_element(coefficients.begin(), coefficients.end());
    const bool holds = largest <= 1.0 / static_cast<double>(row.size());
    if (!holds) last_failing_size = row.size();
    RC_ASSERT(holds);
  });
  EXPECT_FALSE(held);
  EXPECT_GE(last_failing_size, 2u);
  EXPECT_LE(last_failing_size, 4u) << "RapidCheck should shrink to a row of at most 4 logits";
}

TEST(Mutation, TheBf16AccumulatorKernelIsRefuted) {
  const auto* broken = kernels::find_softmax_kernel("bf16acc");
  const bool held = rc::check("bf16acc within its entry (false)", [&] {
    const Row row = in_format(*rows_of_logits_within(4, 600), bf16);
    RC_ASSERT(metrics::evaluate_softmax(*broken, as_matrix(row), 1.0).comparison.passed());
  });
  EXPECT_FALSE(held);
}

}  // namespace
}  // namespace sharpcheck::properties
