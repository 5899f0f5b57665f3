// The properties that carry over from softmax to the dispersion escapes, stated per operator, and
// the ones that do not, refuted explicitly: sigmoid weights need not sum to 1 and stick-breaking
// weights are not monotone in the logit. References are correctly rounded, so the properties
// that hold are checked with no slack beyond the rounding itself.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "bounds/bounds.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "properties/generators.hpp"
#include "reference/dispersion_escapes.hpp"

namespace sharpcheck::properties {
namespace {

// Small training length, so that rows of a few dozen logits are length-scaled.
constexpr std::uint64_t short_training_length = 4;

enum class Normalised { adaptive, ssmax, length_scaled };

std::vector<double> normalised_escape(Normalised which, const Row& row, double theta) {
  reference::RowOptions options;
  options.theta = theta;
  switch (which) {
    case Normalised::adaptive:
      return reference::adaptive_temperature_softmax(row, fp32, options);
    case Normalised::ssmax:
      return reference::scalable_softmax(row, fp32, options);
    case Normalised::length_scaled:
      return reference::length_scaled_softmax(row, fp32, short_training_length, options);
  }
  return {};
}

rc::Gen<Normalised> a_normalised_escape() {
  return rc::gen::element(Normalised::adaptive, Normalised::ssmax, Normalised::length_scaled);
}

double sum_of(const std::vector<double>& weights) {
  return static_cast<double>(std::accumulate(weights.begin(), weights.end(), 0.0L));
}

// fp32 values of a row of at most 64: each rounding is at most u p_j (normal) or half the
// smallest subnormal, and the long double sum of 64 of them is exact to far below that.
double fp32_sum_slack(std::size_t n) {
  return fp32.unit_roundoff() + static_cast<double>(n) * 0x1p-150 + 0x1p-60;
}

// Each correctly rounded weight is within u of its value (or half the smallest subnormal), so a
// row summing to 1 sums to 1 within fp32_sum_slack.
void assert_sums_to_one(const std::vector<double>& weights) {
  RC_ASSERT(std::fabs(sum_of(weights) - 1) <= fp32_sum_slack(weights.size()));
}

// Rounding is monotone, so a larger logit must get at least the weight: no slack.
void assert_larger_logits_weigh_no_less(const Row& row, const std::vector<double>& weights) {
  for (std::size_t i = 0; i < row.size(); ++i) {
    for (std::size_t j = 0; j < row.size(); ++j) {
      if (row[i] > row[j]) RC_ASSERT(weights[i] >= weights[j]);
    }
  }
}

double spread(const Row& row) {
  const auto [low, high] = std::minmax_element(row.begin(), row.end());
  return *high - *low;
}

RC_GTEST_PROP(Escapes, AdaptiveSsmaxAndLengthScaledRowsSumToOneWithinTheirRounding, ()) {
  const Row row = *rows_of_logits_within(20);
  const double theta = *a_temperature();
  assert_sums_to_one(normalised_escape(*a_normalised_escape(), row, theta));
}

RC_GTEST_PROP(Escapes, ALargerLogitNeverGetsASmallerWeightUnderTheNormalisedEscapesAndSigmoid, ()) {
  const Row row = *rows_of_logits_within(20);
  const double theta = *a_temperature();  // > 0
  const bool sigmoid = *rc::gen::arbitrary<bool>();
  reference::RowOptions options;
  options.theta = theta;
  const auto weights = sigmoid ? reference::sigmoid_attention_weights(row, fp32, options)
                               : normalised_escape(*a_normalised_escape(), row, theta);
  assert_larger_logits_weigh_no_less(row, weights);
}

RC_GTEST_PROP(Escapes, SsmaxAndLengthScaledObeyLemma21AtTheirEffectiveTemperature, ()) {
  // Both are softmax at temperature theta / c: c = ln n (SSMax), c = max(1, ln n / ln L).
  const Row row = *rows_of_logits_within(20);
  RC_PRE(row.size() >= 2);
  const double theta = *a_temperature();
  const auto n = static_cast<double>(row.size());
  const bool ssmax = *rc::gen::arbitrary<bool>();
  const double factor =
      ssmax ? std::log(n) : reference::length_scale_factor(row.size(), short_training_length);
  // Rounding the effective temperature down only raises the bound: it stays rigorous.
  const double effective = std::nextafter(std::nextafter(theta / factor, 0.0), 0.0);
  const auto bound = bounds::lemma_2_1(n, spread(row), effective);
  const auto weights = normalised_escape(ssmax ? Normalised::ssmax : Normalised::length_scaled, row, theta);
  for (const double w : weights) RC_ASSERT(w <= bound.upper);
}

RC_GTEST_PROP(Escapes, SigmoidWeightsStayBelowExpZOverN, ()) {
  // sigma(z - ln n) = 1 / (1 + n e^-z) < e^z / n: sigmoid attention with its default bias
  // disperses like softmax, with the logit itself in place of the spread.
  const Row row = *rows_of_logits_within(20);
  const double theta = *a_temperature();
  reference::RowOptions options;
  options.theta = theta;
  const auto weights = reference::sigmoid_attention_weights(row, fp32, options);
  const auto n = static_cast<double>(row.size());
  for (std::size_t j = 0; j < row.size(); ++j) {
    const double bound =
        std::exp(row[j] / theta) / n * (1 + 0x1p-40);  // double's own error is far below 2^-40
    // fp32 rounding: u relative, or half the smallest subnormal absolute.
    RC_ASSERT(weights[j] <= std::min(1.0, bound) * (1 + fp32.unit_roundoff() * 2) + 0x1p-150);
  }
}

RC_GTEST_PROP(Escapes, StickBreakingRowsSumToOneMinusWhatNoKeyTook, ()) {
  const Row row = *rows_of_logits_within(20);
  const double theta = *a_temperature();
  reference::RowOptions options;
  options.theta = theta;
  const auto weights = reference::stick_breaking_weights(row, fp64, options);
  long double remainder = 1;  // prod_j (1 - sigma(z_j)) = prod_j sigma(-z_j)
  for (const double e : row) remainder /= 1 + std::exp(static_cast<long double>(e) / theta);
  const double sum = sum_of(weights);
  RC_ASSERT(sum <= 1 + 0x1p-50);
  RC_ASSERT(std::fabs(sum - static_cast<double>(1 - remainder)) <= 0x1p-44);
}

std::vector<const kernels::SoftmaxKernel*> escape_kernels() {
  std::vector<const kernels::SoftmaxKernel*> result;
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (kernel.operation != kernels::Operation::softmax && !kernel.deliberately_broken)
      result.push_back(&kernel);
  }
  return result;
}

RC_GTEST_PROP(Escapes, EveryEscapeKernelStaysWithinItsEntryOnStressingRows, ()) {
  const auto* kernel = *rc::gen::elementOf(escape_kernels());
  const Row row = in_format(*any_stressing_row(), *kernel->input);
  const double theta = *a_temperature();
  const auto evaluation = metrics::evaluate_softmax(*kernel, as_matrix(row), theta);
  RC_ASSERT(evaluation.comparison.passed());
}

// Where a property of softmax does not hold for an escape, RapidCheck must find a counterexample.
TEST(EscapesWherePropertiesFail, SigmoidWeightsDoNotSumToOne) {
  const bool held = rc::check("sigmoid weights sum to 1 (false)", [] {
    const Row row = *rows_of_logits_within(20);
    assert_sums_to_one(reference::sigmoid_attention_weights(row, fp32));
  });
  EXPECT_FALSE(held);
}

TEST(EscapesWherePropertiesFail, StickBreakingWeightsAreNotMonotoneInTheLogit) {
  const bool held = rc::check("a larger logit gets at least the weight (false for stick-breaking)", [] {
    const Row row = *rows_of_logits_within(20);
    assert_larger_logits_weigh_no_less(row, reference::stick_breaking_weights(row, fp32));
  });
  EXPECT_FALSE(held);
}

TEST(EscapesWherePropertiesFail, SsmaxBreaksLemma21AtTheGivenTemperature) {
  // The point of SSMax: at theta itself (not theta / ln n) Lemma 2.1's dispersion bound fails.
  const bool held = rc::check("SSMax within Lemma 2.1 at theta (false)", [] {
    const Row row = *rows_with_spread(1.0);
    const auto weights = reference::scalable_softmax(row, fp32);
    const auto bound = bounds::lemma_2_1(static_cast<double>(row.size()), spread(row), 1.0);
    for (const double w : weights) RC_ASSERT(w <= bound.upper);
  });
  EXPECT_FALSE(held);
}

}  // namespace
}  // namespace sharpcheck::properties
