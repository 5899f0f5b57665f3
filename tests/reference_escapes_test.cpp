// The dispersion-escape references (adaptive temperature, SSMax, sigmoid, stick-breaking,
// length-scaled logits) against closed forms and against independent 320-bit cpp_bin_float
// computations of their definitions, in every format; their exact cases; their bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/errors.hpp"
#include "core/mpfr_number.hpp"
#include "core/random.hpp"
#include "reference/dispersion_escapes.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck {
namespace {

using reference::RowOptions;
using testing::Exact;
using testing::is_nearest_in_format;

// ---- Independent definitions in 320-bit binary floating point (no MPFR, no Arb) ----

std::vector<Exact> exact_softmax(const std::vector<double>& logits, const Exact& multiplier) {
  Exact best = Exact(logits[0]) * multiplier;
  for (const double e : logits) best = std::max(best, Exact(e) * multiplier);
  std::vector<Exact> weights;
  Exact sum = 0;
  for (const double e : logits) {
    weights.push_back(exp(Exact(e) * multiplier - best));
    sum += weights.back();
  }
  for (auto& w : weights) w /= sum;
  return weights;
}

std::vector<Exact> exact_adaptive(const std::vector<double>& logits, double theta) {
  const Exact inverse = Exact(1) / Exact(theta);
  const auto p = exact_softmax(logits, inverse);
  Exact entropy = 0;
  for (const auto& pj : p) entropy -= pj * log(pj + Exact(1) / Exact(1000000000));
  Exact beta = 1;
  if (entropy > Exact(0.5)) {
    const Exact h = entropy;
    const Exact poly =
        (((Exact(-37) * h + Exact(481)) * h - Exact(2300)) * h + Exact(4917)) * h - Exact(1791);
    beta = std::max(poly / 1000, Exact(1));
  }
  return exact_softmax(logits, beta * inverse);
}

std::vector<Exact> exact_sigmoid(const std::vector<double>& logits, double theta, const Exact& bias) {
  std::vector<Exact> result;
  for (const double e : logits) result.push_back(1 / (1 + exp(-(Exact(e) / Exact(theta) + bias))));
  return result;
}

std::vector<Exact> exact_stick_breaking(const std::vector<double>& logits, double theta) {
  std::vector<Exact> result(logits.size());
  Exact remaining = 1;  // prod over later keys of (1 - beta_k)
  for (std::size_t j = logits.size(); j-- > 0;) {
    const Exact beta = 1 / (1 + exp(-Exact(logits[j]) / Exact(theta)));
    result[j] = beta * remaining;
    remaining *= 1 - beta;
  }
  return result;
}

// ---- Helpers ----

std::vector<double> random_row(DeterministicRandom& random, std::size_t n, double sigma) {
  std::vector<double> row(n);
  for (double& e : row) e = static_cast<double>(static_cast<float>(random.normal(0, sigma)));
  return row;
}

::testing::AssertionResult all_nearest(const std::vector<double>& rounded, const std::vector<Exact>& exact,
                                       const FloatFormat& format) {
  for (std::size_t j = 0; j < rounded.size(); ++j) {
    auto result = is_nearest_in_format(rounded[j], exact[j], format);
    if (!result) return result << " (entry " << j << ")";
  }
  return ::testing::AssertionSuccess();
}

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {
 protected:
  const FloatFormat& format() const { return *GetParam(); }
};

// ---- Adaptive temperature ----

TEST_P(EveryFormat, AdaptiveTemperatureMatchesItsDefinitionAcrossTheEntropyRange) {
  DeterministicRandom random(31);
  int active_rows = 0;
  for (int trial = 0; trial < 150; ++trial) {
    // Sizes and scales chosen so entropies fall below 0.5, inside the active interval and above it.
    const std::size_t n = 2 + random.below(trial % 3 == 0 ? 600 : 40);
    const double sigma = std::array{0.1, 1.0, 4.0, 12.0}[random.below(4)];
    const auto row = random_row(random, n, sigma);
    const double theta = trial % 5 == 0 ? 0.5 : 1.0;
    RowOptions options;
    options.theta = theta;
    const auto expected = exact_adaptive(row, theta);
    ASSERT_TRUE(
        all_nearest(reference::adaptive_temperature_softmax(row, format(), options), expected, format()))
        << "trial " << trial << " n=" << n << " sigma=" << sigma;
    const auto plain = exact_softmax(row, Exact(1) / Exact(theta));
    if (abs(expected[0] - plain[0]) > Exact(1e-6) * plain[0]) ++active_rows;
  }
  EXPECT_GT(active_rows, 20);  // the polynomial really changed beta on many rows
}

TEST_P(EveryFormat, AdaptiveTemperatureKeepsEqualLogitsUniformAndOneLogitWhole) {
  const std::vector<double> equal(7, 2.5);
  for (const double p : reference::adaptive_temperature_softmax(equal, format())) {
    ASSERT_TRUE(is_nearest_in_format(p, Exact(1) / 7, format()));
  }
  EXPECT_EQ(reference::adaptive_temperature_softmax(std::vector<double>{-3.0}, format()),
            std::vector<double>{1.0});
  // Two logits: H <= ln 2 (about 0.69), where poly(H) < 1, so beta = 1: the logistic function.
  const std::vector<double> two{1.0, -0.5};
  const Exact logistic = 1 / (1 + exp(Exact(-1.5)));
  const auto p = reference::adaptive_temperature_softmax(two, format());
  EXPECT_TRUE(is_nearest_in_format(p[0], logistic, format()));
}

// ---- SSMax ----

TEST_P(EveryFormat, ScalableSoftmaxIsSoftmaxScaledByLogN) {
  DeterministicRandom random(32);
  for (int trial = 0; trial < 150; ++trial) {
    const std::size_t n = 1 + random.below(trial % 4 == 0 ? 2000 : 50);
    const auto row = random_row(random, n, 2.0);
    const double theta = std::array{1.0, 0.5, 3.0, -2.0}[random.below(4)];
    RowOptions options;
    options.theta = theta;
    const Exact multiplier = log(Exact(n)) / Exact(theta);
    ASSERT_TRUE(all_nearest(reference::scalable_softmax(row, format(), options),
                            exact_softmax(row, multiplier), format()))
        << "trial " << trial << " n=" << n << " theta=" << theta;
  }
}

TEST_P(EveryFormat, ScalableSoftmaxRationalCasesAreExact) {
  // s = 1, logits {1, 0}, n = 2: weights 2 and 1, so exactly 2/3 and 1/3.
  const auto two_thirds = reference::scalable_softmax(std::vector<double>{1.0, 0.0}, format());
  EXPECT_TRUE(is_nearest_in_format(two_thirds[0], Exact(2) / 3, format()));
  EXPECT_TRUE(is_nearest_in_format(two_thirds[1], Exact(1) / 3, format()));
  // n = 1 gives log 1 = 0: every unmasked weight equal.
  const auto one = reference::scalable_softmax(std::vector<double>{5.0, -1.0}, format(), {}, 1);
  EXPECT_TRUE(is_nearest_in_format(one[0], Exact(1) / 2, format()));
}

TEST(ScalableSoftmax, ACoefficientExactlyOnARoundingBoundaryIsRoundedToEven) {
  // Length 3 (a causal row's visible keys), s = 1: weights 27, 3, 1, 1 sum to 32, so the first
  // coefficient is exactly 27/32 = 0.11011b: in e4m3 (4 significant bits) the midpoint of
  // 0.1101b and 0.1110b, which no enclosure can decide. Ties to even: 0.875.
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  const std::vector<double> row{3.0, 1.0, 0.0, 0.0};
  const auto p = reference::scalable_softmax(row, fp8_e4m3, options, 3);
  EXPECT_EQ(p[0], 0.875);
  EXPECT_EQ(p[1], 0.09375);  // 3/32 exactly representable
  EXPECT_GE(statistics.exact_cases, 1);
  EXPECT_EQ(reference::scalable_softmax(row, fp32, {}, 3)[0], 27.0 / 32);
}

// ---- Sigmoid ----

TEST_P(EveryFormat, SigmoidWeightsMatchTheirDefinition) {
  DeterministicRandom random(33);
  for (int trial = 0; trial < 150; ++trial) {
    const std::size_t n = 1 + random.below(300);
    const auto row = random_row(random, n, 6.0);
    const double theta = trial % 3 == 0 ? 0.25 : 1.0;
    RowOptions options;
    options.theta = theta;
    ASSERT_TRUE(all_nearest(reference::sigmoid_attention_weights(row, format(), options),
                            exact_sigmoid(row, theta, -log(Exact(n))), format()))
        << "trial " << trial;
    const double bias = random.normal(0, 3);
    ASSERT_TRUE(all_nearest(reference::sigmoid_attention_weights(row, format(), options, bias),
                            exact_sigmoid(row, theta, Exact(bias)), format()))
        << "trial " << trial << " bias " << bias;
  }
}

TEST_P(EveryFormat, SigmoidExactCasesAreOneOverNPlusOneAndOneHalf) {
  for (const std::size_t n : {1u, 3u, 4u, 255u, 1000u}) {
    const std::vector<double> zeros(n, 0.0);
    const auto weights = reference::sigmoid_attention_weights(zeros, format());
    for (const double w : weights) ASSERT_TRUE(is_nearest_in_format(w, Exact(1) / Exact(n + 1), format()));
  }
  const std::vector<double> row{3.0, -1.5};
  RowOptions options;
  options.theta = 2.0;
  const auto weights = reference::sigmoid_attention_weights(row, format(), options, -1.5);  // 3/2 - 1.5 = 0
  EXPECT_EQ(weights[0], 0.5);
}

TEST(SigmoidWeights, DoNotSumToOneAndTheTestSaysSo) {
  // Not a softmax: four zero logits with b = -ln 4 give 1/5 each, a row sum of 4/5.
  const auto weights = reference::sigmoid_attention_weights(std::vector<double>(4, 0.0), fp64);
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  EXPECT_NEAR(sum, 0.8, 1e-15);
  EXPECT_GT(std::fabs(sum - 1.0), 0.1);
}

// ---- Stick-breaking ----

TEST_P(EveryFormat, StickBreakingMatchesItsDefinition) {
  DeterministicRandom random(34);
  for (int trial = 0; trial < 150; ++trial) {
    const std::size_t n = 1 + random.below(trial % 5 == 0 ? 1500 : 60);
    const auto row = random_row(random, n, 3.0);
    const double theta = trial % 4 == 0 ? -0.5 : 1.0;
    RowOptions options;
    options.theta = theta;
    ASSERT_TRUE(all_nearest(reference::stick_breaking_weights(row, format(), options),
                            exact_stick_breaking(row, theta), format()))
        << "trial " << trial << " n=" << n;
  }
}

TEST_P(EveryFormat, StickBreakingZeroTailIsExactPowersOfTwo) {
  // Zero logits after a nonzero one: 1/2 for the nearest key, 1/4, 1/8, ... behind it, rounded
  // exactly (2^-m underflows to 0 or the smallest subnormal exactly as the format says).
  std::vector<double> row(1200, 0.0);
  row[0] = 1.75;
  const auto weights = reference::stick_breaking_weights(row, format());
  MpfrNumber power(2);
  for (std::size_t m = 1; m < row.size(); ++m) {
    mpfr_set_ui_2exp(power.get(), 1, -static_cast<mpfr_exp_t>(m), MPFR_RNDN);
    ASSERT_TRUE(same_bits(weights[row.size() - m], round_to_format(power.get(), format()))) << "m=" << m;
  }
  EXPECT_TRUE(all_nearest(std::vector<double>{weights[0]}, {exact_stick_breaking(row, 1.0)[0]}, format()));
}

TEST(StickBreaking, IsNotMonotoneInTheLogitAndTheTestSaysSo) {
  // A larger logit farther from the query gets less weight than a smaller one nearer: the
  // recency order, not the logit order, decides (unlike softmax and sigmoid).
  const auto weights = reference::stick_breaking_weights(std::vector<double>{3.0, 1.0}, fp64);
  EXPECT_LT(weights[0], weights[1]);
}

// ---- Length-scaled logits ----

TEST_P(EveryFormat, LengthScaledLogitsAreSoftmaxUpToTheTrainingLengthAndScaledBeyond) {
  DeterministicRandom random(35);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t n = 1 + random.below(trial % 4 == 0 ? 3000 : 100);
    const auto row = random_row(random, n, 2.0);
    const std::uint64_t training_length = 16;
    const auto result = reference::length_scaled_softmax(row, format(), training_length);
    if (n <= training_length) {
      ASSERT_EQ(result, reference::softmax(row, format()));
      continue;
    }
    const Exact factor = log(Exact(n)) / log(Exact(training_length));
    ASSERT_TRUE(all_nearest(result, exact_softmax(row, factor), format())) << "trial " << trial << " n=" << n;
  }
}

TEST_P(EveryFormat, EveryEscapeMeetsItsClosedFormsAtOneTwoAndEqualLogits) {
  const auto sigma = [](const Exact& x) { return 1 / (1 + exp(-x)); };
  // n = 1: the normalised escapes give 1; sigmoid (bias -ln 1 = 0) and stick-breaking sigma(z).
  const std::vector<double> one{0.75};
  for (const auto& result :
       {reference::adaptive_temperature_softmax(one, format()), reference::scalable_softmax(one, format()),
        reference::length_scaled_softmax(one, format(), 16)}) {
    EXPECT_EQ(result, std::vector<double>{1.0});
  }
  EXPECT_TRUE(is_nearest_in_format(reference::sigmoid_attention_weights(one, format())[0], sigma(Exact(0.75)),
                                   format()));
  EXPECT_TRUE(is_nearest_in_format(reference::stick_breaking_weights(one, format())[0], sigma(Exact(0.75)),
                                   format()));
  // Two logits a, b.
  const double a = 1.25;
  const double b = -0.5;
  const std::vector<double> two{a, b};
  const Exact d = Exact(a) - Exact(b);
  EXPECT_TRUE(is_nearest_in_format(reference::scalable_softmax(two, format())[0], sigma(d * log(Exact(2))),
                                   format()));
  EXPECT_TRUE(
      is_nearest_in_format(reference::length_scaled_softmax(two, format(), 16)[0], sigma(d), format()));
  EXPECT_TRUE(
      is_nearest_in_format(reference::adaptive_temperature_softmax(two, format())[0], sigma(d), format()));
  const auto sigmoid = reference::sigmoid_attention_weights(two, format());
  EXPECT_TRUE(is_nearest_in_format(sigmoid[1], sigma(Exact(b) - log(Exact(2))), format()));
  const auto stick = reference::stick_breaking_weights(two, format());
  EXPECT_TRUE(is_nearest_in_format(stick[0], sigma(Exact(a)) * sigma(-Exact(b)), format()));
  EXPECT_TRUE(is_nearest_in_format(stick[1], sigma(Exact(b)), format()));
  // k equal logits z: 1/k for the normalised escapes; sigma(z - ln k) each for sigmoid; the
  // m-th key from the query sigma(z) (1 - sigma(z))^(m-1) for stick-breaking.
  const std::size_t k = 5;
  const std::vector<double> equal(k, -1.5);
  for (const auto& result :
       {reference::adaptive_temperature_softmax(equal, format()),
        reference::scalable_softmax(equal, format()), reference::length_scaled_softmax(equal, format(), 2)}) {
    for (const double w : result) ASSERT_TRUE(is_nearest_in_format(w, Exact(1) / Exact(k), format()));
  }
  for (const double w : reference::sigmoid_attention_weights(equal, format())) {
    ASSERT_TRUE(is_nearest_in_format(w, sigma(Exact(-1.5) - log(Exact(k))), format()));
  }
  const auto sticks = reference::stick_breaking_weights(equal, format());
  for (std::size_t m = 1; m <= k; ++m) {
    ASSERT_TRUE(
        is_nearest_in_format(sticks[k - m], sigma(Exact(-1.5)) * pow(sigma(Exact(1.5)), m - 1), format()));
  }
}

const auto format_name = [](const auto& info) { return std::string(info.param->name); };
INSTANTIATE_TEST_SUITE_P(Escapes, EveryFormat, ::testing::ValuesIn(all_float_formats), format_name);

// ---- Masks, statistics and bad input, shared by every escape ----

TEST(EveryEscape, MaskedEntriesGetExactlyZero) {
  const std::vector<double> row{1.5, -INFINITY, 0.25, 3.0};
  const std::vector<std::uint8_t> keep{1, 1, 1, 0};
  RowOptions options;
  options.keep = keep;
  const std::vector<std::vector<double>> results{reference::adaptive_temperature_softmax(row, fp32, options),
                                                 reference::scalable_softmax(row, fp32, options),
                                                 reference::sigmoid_attention_weights(row, fp32, options),
                                                 reference::stick_breaking_weights(row, fp32, options),
                                                 reference::length_scaled_softmax(row, fp32, 2, options)};
  for (const auto& result : results) {
    EXPECT_TRUE(same_bits(result[1], 0.0));
    EXPECT_TRUE(same_bits(result[3], 0.0));
    EXPECT_GT(result[0], 0.0);
  }
  // Stick-breaking skips masked keys: the weights are those of the row without them.
  EXPECT_EQ(reference::stick_breaking_weights(std::vector<double>{1.5, 0.25}, fp32)[0], results[3][0]);
}

TEST(EveryEscape, BadInputIsAnInputErrorNamingThePlace) {
  const auto expect_problem = [](auto&& call, InputProblem problem, const char* text) {
    try {
      call();
      ADD_FAILURE() << "no error for " << text;
    } catch (const InputError& error) {
      EXPECT_EQ(error.problem(), problem) << error.what();
      EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
    }
  };
  const std::vector<double> nan_row{1.0, NAN};
  const std::vector<double> empty;
  RowOptions zero_theta;
  zero_theta.theta = 0.0;
  expect_problem([&] { (void)reference::adaptive_temperature_softmax(nan_row, fp32); },
                 InputProblem::nan_value, "adaptive_temperature_softmax: logit 1 is NaN");
  expect_problem([&] { (void)reference::scalable_softmax(empty, fp32); }, InputProblem::empty_input, "empty");
  expect_problem(
      [&] { (void)reference::sigmoid_attention_weights(std::vector<double>{1.0}, fp32, zero_theta); },
      InputProblem::bad_temperature, "theta");
  expect_problem([&] { (void)reference::stick_breaking_weights(std::vector<double>{INFINITY}, fp32); },
                 InputProblem::positive_infinity, "logit 0 is +inf");
  expect_problem([&] { (void)reference::length_scaled_softmax(std::vector<double>{1.0}, fp32, 1); },
                 InputProblem::out_of_range, "training length L must be at least 2");
  expect_problem([&] { (void)reference::scalable_softmax(std::vector<double>{1.0}, fp32, {}, 0); },
                 InputProblem::out_of_range, "length n must be at least 1");
  expect_problem(
      [&] { (void)reference::sigmoid_attention_weights(std::vector<double>{1.0}, fp32, {}, INFINITY); },
      InputProblem::non_finite_value, "bias");
  expect_problem([&] { (void)reference::stick_breaking_weights(std::vector<double>{-INFINITY}, fp32); },
                 InputProblem::fully_masked_row, "masked");
}

TEST(EveryEscape, AMillionEntryRowWithTwoValuesIsCheapAndExact) {
  // The dispersion study's extremal row at its largest size: one logit delta above 2^20 - 1 zeros.
  std::vector<double> row(std::size_t{1} << 20, 0.0);
  row[0] = 5.69;
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  const auto p = reference::scalable_softmax(row, fp32, options);
  const Exact n = Exact(row.size());
  const Exact top = exp(Exact(5.69) * log(n));
  EXPECT_TRUE(is_nearest_in_format(p[0], top / (top + n - 1), fp32));
  EXPECT_TRUE(is_nearest_in_format(p[1], 1 / (top + n - 1), fp32));
  EXPECT_EQ(statistics.decided_by_balls, 2);  // one decision per distinct value
}

}  // namespace
}  // namespace sharpcheck
