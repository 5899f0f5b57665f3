// The softmax reference against closed forms, against an independent 320-bit cpp_bin_float
// computation, and against MPFR at twice the working precision rounded once; in every format.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "core/random.hpp"
#include "reference/exact_rounding.hpp"
#include "reference/softmax.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck {
namespace {

using reference::RowOptions;
using testing::Exact;
using testing::is_nearest_in_format;

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {
 protected:
  const FloatFormat& format() const { return *GetParam(); }
};

// The reference's softmax, checked equal to what the MPFR loop alone gives (the staged path must
// not change a single result).
std::vector<double> softmax_by_every_stage(std::span<const double> row, const FloatFormat& format,
                                           const RowOptions& options) {
  const auto probabilities = reference::softmax(row, format, options);
  RowOptions mpfr_only = options;
  mpfr_only.mpfr_only = true;
  EXPECT_EQ(reference::softmax(row, format, mpfr_only), probabilities)
      << "theta " << hex_float(options.theta);
  return probabilities;
}

TEST_P(EveryFormat, OneLogitGivesProbabilityOneAndEntropyZero) {
  for (const double logit : {0.0, 3.0, -1e300, 1e300, 0x1p-1074}) {
    for (const double theta : {1.0, 0.1, -3.0}) {
      RowOptions options;
      options.theta = theta;
      const std::vector<double> row{logit};
      EXPECT_EQ(reference::softmax(row, format(), options), std::vector<double>{1.0});
      EXPECT_EQ(reference::log_softmax(row, format(), options), std::vector<double>{0.0});
      EXPECT_TRUE(same_bits(reference::logsumexp(row, format(), options), round_to_format(logit, format())));
      EXPECT_EQ(reference::entropy(row, format(), options), 0.0);
    }
  }
}

TEST_P(EveryFormat, TwoLogitsGiveTheLogisticFunction) {
  DeterministicRandom random(21);
  for (int i = 0; i < 200; ++i) {
    const double a = random.normal(0, 4);
    const double b = random.normal(0, 4);
    const std::vector<double> row{a, b};
    const auto probabilities = reference::softmax(row, format());
    const Exact logistic = 1 / (1 + exp(Exact(b) - Exact(a)));
    ASSERT_TRUE(is_nearest_in_format(probabilities[0], logistic, format())) << "a=" << a << " b=" << b;
    ASSERT_TRUE(is_nearest_in_format(probabilities[1], 1 - logistic, format()));
  }
}

TEST_P(EveryFormat, KEqualLogitsGiveExactlyOneOverK) {
  for (const std::size_t k : {1u, 2u, 3u, 5u, 7u, 10u, 16u, 100u, 768u, 1000u, 4099u}) {
    for (const double value : {0.0, -7.25, 1e10}) {
      std::vector<double> row(k, value);
      row.push_back(-INFINITY);  // a masked entry must not count
      const auto probabilities = reference::softmax(row, format());
      for (std::size_t j = 0; j < k; ++j) {
        ASSERT_TRUE(is_nearest_in_format(probabilities[j], Exact(1) / Exact(k), format())) << "k=" << k;
      }
      ASSERT_TRUE(same_bits(probabilities[k], 0.0));
      if (std::has_single_bit(k)) {
        ASSERT_EQ(probabilities[0], round_to_format(1.0 / static_cast<double>(k), format()));
      }
    }
  }
}

TEST_P(EveryFormat, MaskedEntriesGetExactlyZeroAndDoNotChangeTheRest) {
  const std::vector<double> row{1.5, -INFINITY, 0.25, 3.0, -2.0};
  const std::vector<std::uint8_t> keep{1, 1, 1, 0, 1};
  RowOptions options;
  options.keep = keep;
  const auto masked = reference::softmax(row, format(), options);
  const auto unmasked_only = reference::softmax(std::vector<double>{1.5, 0.25, -2.0}, format());
  EXPECT_TRUE(same_bits(masked[1], 0.0));
  EXPECT_TRUE(same_bits(masked[3], 0.0));
  EXPECT_EQ(masked[0], unmasked_only[0]);
  EXPECT_EQ(masked[2], unmasked_only[1]);
  EXPECT_EQ(masked[4], unmasked_only[2]);
  const auto log_masked = reference::log_softmax(row, format(), options);
  EXPECT_EQ(log_masked[1], -INFINITY);
  EXPECT_EQ(log_masked[3], -INFINITY);
}

// Random rows, moderate and wide spreads, positive and negative temperatures, checked element by
// element against the 320-bit cpp_bin_float computation: each result must be the nearest value.
TEST_P(EveryFormat, AgreesWithAnIndependentCppBinFloatComputation) {
  DeterministicRandom random(100 + format().precision());
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 2 + random.below(30);
    const double sigma = std::array{1.0, 3.0, 12.0}[trial % 3];
    const double theta = std::array{1.0, 0.7, -2.5, 1.0}[trial % 4];
    std::vector<double> row(n);
    for (double& e : row) e = random.normal(0, sigma);
    // Rows with repeated logits, which the ball stages group by value.
    if (trial % 5 == 4)
      for (double& e : row) e = std::round(e * 2) / 2;
    RowOptions options;
    options.theta = theta;
    const auto exact = testing::independent_softmax(row, theta);
    RowOptions mpfr_only = options;
    mpfr_only.mpfr_only = true;
    const auto probabilities = softmax_by_every_stage(row, format(), options);
    const auto logs = reference::log_softmax(row, format(), options);
    Exact sum = 0;
    Exact best = Exact(row[0]) / theta;
    for (const double e : row) best = std::max(best, Exact(e) / theta);
    for (const double e : row) sum += exp(Exact(e) / theta - best);
    Exact entropy = 0;
    for (std::size_t j = 0; j < n; ++j) {
      ASSERT_TRUE(is_nearest_in_format(probabilities[j], exact[j], format()))
          << "trial " << trial << " j " << j;
      ASSERT_TRUE(is_nearest_in_format(logs[j], Exact(row[j]) / theta - best - log(sum), format()));
      entropy -= exact[j] * log(exact[j]);
    }
    const Exact lse = theta * (best + log(sum));
    ASSERT_TRUE(is_nearest_in_format(reference::logsumexp(row, format(), options), lse, format()));
    const double rounded_entropy = reference::entropy(row, format(), options);
    ASSERT_TRUE(is_nearest_in_format(rounded_entropy, entropy, format()));
    ASSERT_EQ(reference::entropy(row, format(), mpfr_only), rounded_entropy);
  }
}

// Plain MPFR softmax at twice the reference's starting precision, rounded once to the format.
std::vector<double> mpfr_softmax_rounded_once(const std::vector<double>& row, const FloatFormat& format) {
  const mpfr_prec_t precision = 2 * reference::ZivSchedule::for_format(format).initial;
  mpfr_t best, sum, term;
  mpfr_inits2(precision, best, sum, term, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_d(best, *std::max_element(row.begin(), row.end()), MPFR_RNDN);
  mpfr_set_zero(sum, 1);
  for (const double e : row) {
    mpfr_set_d(term, e, MPFR_RNDN);
    mpfr_sub(term, term, best, MPFR_RNDN);
    mpfr_exp(term, term, MPFR_RNDN);
    mpfr_add(sum, sum, term, MPFR_RNDN);
  }
  std::vector<double> result;
  for (const double e : row) {
    mpfr_set_d(term, e, MPFR_RNDN);
    mpfr_sub(term, term, best, MPFR_RNDN);
    mpfr_exp(term, term, MPFR_RNDN);
    mpfr_div(term, term, sum, MPFR_RNDN);
    result.push_back(round_to_format(term, format));
  }
  mpfr_clears(best, sum, term, static_cast<mpfr_ptr>(nullptr));
  return result;
}

TEST_P(EveryFormat, EqualsMpfrAtTwiceThePrecisionRoundedOnce) {
  DeterministicRandom random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> row(1 + random.below(200));
    for (double& e : row) e = random.normal(0, 3);
    const auto expected = mpfr_softmax_rounded_once(row, format());
    ASSERT_EQ(reference::softmax(row, format()), expected) << "trial " << trial;
    RowOptions mpfr_only;
    mpfr_only.mpfr_only = true;
    ASSERT_EQ(reference::softmax(row, format(), mpfr_only), expected) << "trial " << trial;
  }
}

const auto format_name = [](const auto& info) { return std::string(info.param->name); };
// The extremes of fp64: logits near +-DBL_MAX (their differences overflow double), subnormal
// logits, temperatures from 1e-300 to 1e300 of both signs. Every coefficient must still be the
// nearest value to the independent 320-bit computation, whichever stage decides it. (Before the
// double stage stood aside on an overflowing difference, the first row gave 0x1p+0 0x0p+0 in every
// format narrower than fp64.)
TEST_P(EveryFormat, StaysCorrectlyRoundedAtTheExtremesOfDouble) {
  const double big = 0x1.e42d130773b76p+1023;
  const std::vector<std::pair<std::vector<double>, double>> cases{
      {{big, -big}, 0x1.1ccf385ebc8a0p+1023},
      {{big, -big, 0.0, big / 2}, 0x1p+1020},
      {{-big, big}, -0x1p+1022},
      {{DBL_MAX, -DBL_MAX, 1.0}, 1e300},
      {{0x1p-1074, -0x1p-1074, 0x1.8p-1070, 0.0}, 0x1p-1072},
      {{0x1p-1074, 0.0, -0x1p-1073}, -1e-300},
      {{1.0, 2.0, 3.0}, 1e300},
      {{1e-300, 2e-300, -3e-300}, 1e-300},
      {{DBL_MAX, DBL_MAX / 3, -DBL_MAX / 7}, DBL_MAX},
  };
  for (const auto& [row, theta] : cases) {
    RowOptions options;
    options.theta = theta;
    const auto exact = testing::independent_softmax(row, theta);
    const auto probabilities = softmax_by_every_stage(row, format(), options);
    for (std::size_t j = 0; j < row.size(); ++j) {
      EXPECT_TRUE(is_nearest_in_format(probabilities[j], exact[j], format()))
          << "row starting " << hex_float(row[0]) << ", theta " << hex_float(theta) << ", j " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, EveryFormat, ::testing::ValuesIn(all_float_formats), format_name);

// Mutation check: rounding MPFR's result to double and then the double to bf16 (double rounding)
// is wrong on this row, found by searching logits whose softmax lies within 2^-54 of a bf16
// rounding boundary. The correct-rounding check above must catch that path.
TEST(DoubleRounding, IsCaughtByTheCorrectRoundingCheck) {
  const std::vector<double> row{0x1.400a6b46f591bp-5, 0.0};
  const Exact exact = testing::independent_softmax(row, 1.0)[0];
  const double correct = reference::softmax(row, bf16)[0];
  const double double_rounded = round_to_format(reference::softmax(row, fp64)[0], bf16);
  EXPECT_TRUE(is_nearest_in_format(correct, exact, bf16));
  EXPECT_FALSE(is_nearest_in_format(double_rounded, exact, bf16));
  EXPECT_NE(correct, double_rounded);
}

TEST(LargeRows, SixteenThousandLogitsAgreeWithTheIndependentComputation) {
  DeterministicRandom random(3);
  std::vector<double> row(16384);
  for (double& e : row) e = static_cast<float>(random.normal(0, 3));
  const auto exact = testing::independent_softmax(row, 1.0);
  const auto probabilities = reference::softmax(row, fp32);
  for (std::size_t j = 0; j < row.size(); j += 7)
    ASSERT_TRUE(is_nearest_in_format(probabilities[j], exact[j], fp32));
  std::vector<float> as_float(row.begin(), row.end());
  EXPECT_EQ(reference::softmax(std::span<const float>(as_float), fp32), probabilities);
}

TEST(ExtremeRows, UnderflowAndHugeSpreadsRoundCorrectly) {
  EXPECT_EQ(reference::softmax(std::vector<double>{0.0, -1e300}, fp32), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(reference::softmax(std::vector<double>{1e300, -1e300}, fp64), (std::vector<double>{1.0, 0.0}));
  // e^-17 / (1 + e^-17) ~ 4.1e-8 is below fp16's smallest normal and rounds to its smallest subnormal.
  EXPECT_EQ(reference::softmax(std::vector<double>{0.0, -17.0}, fp16)[1], std::ldexp(1.0, -24));
  EXPECT_EQ(reference::logsumexp(std::vector<double>{1e308, 1e308}, fp64), 1e308 + 0.0);
  EXPECT_EQ(reference::logsumexp(std::vector<double>{3e38, 3e38}, fp32), static_cast<double>(3e38F));
  EXPECT_EQ(reference::logsumexp(std::vector<double>{70000.0, 0.0}, fp16), INFINITY);
}

// A top logit alone on a rounding boundary of the target (a midpoint between two neighbours), the
// rest far below: logsumexp = top + theta log(1 + T), T > 0 tiny, so the exact value lies just past
// the midpoint on theta's side and rounds there (a tie rule would pick the even neighbour). No
// enclosure within the cap decides it (T is about e^-1e6); before the tail rule every call refused.
TEST(ExtremeRows, ALogSumExpOnAMidpointRoundsTowardItsTail) {
  struct Case {
    const FloatFormat* format;
    double midpoint, below, above;  // the boundary and its two neighbours
  };
  const Case cases[] = {{&bf16, 1 + 0x1p-8, 1, 1 + 0x1p-7},
                        {&fp32, 1 + 0x1p-24, 1, 1 + 0x1p-23},
                        {&fp8_e4m3, 1 + 0x1p-4, 1, 1 + 0x1p-3}};
  for (const Case& c : cases) {
    for (const double theta : {1.0, 2.0, 0.5, -1.0, -3.0}) {
      RowOptions options;
      options.theta = theta;
      // the rest lie 1e6 |theta| away on the far side of the top (the top is the largest e / theta)
      const std::vector<double> row = {c.midpoint, c.midpoint - std::copysign(1e6, theta) * std::abs(theta)};
      double got = NAN;
      EXPECT_NO_THROW(got = reference::logsumexp(row, *c.format, options)) << c.format->name << " " << theta;
      EXPECT_EQ(got, theta > 0 ? c.above : c.below) << c.format->name << " theta " << theta;
    }
  }
}

// From the independent audit (mpmath): a lone top logit on the overflow threshold (e4m3's 464,
// e5m2's 61440 approached from below, bf16's -(2 - 2^-8) 2^127) rounds as its tail says, and a
// negative tail of e^-1e4 in fp64 (a quarter of 2^-1074 underflowed double) is -0.
TEST(ExtremeRows, ALogSumExpOnTheOverflowThresholdOrBelowTheSubnormalsIsDecided) {
  const auto lse = [](std::vector<double> row, double theta, const FloatFormat& format) {
    RowOptions options;
    options.theta = theta;
    return reference::logsumexp(row, format, options);
  };
  EXPECT_TRUE(std::isnan(lse({464.0, 464.0 - 1e5}, 1, fp8_e4m3)));
  EXPECT_TRUE(std::isnan(lse({464.0, -1.5e300}, 1, fp8_e4m3)));
  EXPECT_EQ(lse({-3.39617752923046e+38, -1e+308}, 0.5, bf16), -0x1.fep+127);
  EXPECT_EQ(lse({-INFINITY, 61440.0, 1e+27}, -0.001, fp8_e5m2), 57344.0);
  const double zero = lse({0.0, 1e4}, -1, fp64);
  EXPECT_EQ(zero, 0.0);
  EXPECT_TRUE(std::signbit(zero));
}

TEST(BadInput, EachProblemIsNamedWithItsPosition) {
  const auto expect_problem = [](auto&& call, InputProblem problem, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no exception; expected: " << text;
    } catch (const InputError& error) {
      EXPECT_EQ(error.problem(), problem);
      EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
    }
  };
  const std::vector<double> with_nan{1.0, 2.0, NAN};
  expect_problem([&] { (void)reference::softmax(with_nan, fp32); }, InputProblem::nan_value,
                 "logit 2 is NaN");
  const std::vector<double> with_inf{INFINITY, 1.0};
  expect_problem([&] { (void)reference::entropy(with_inf, fp32); }, InputProblem::positive_infinity,
                 "entropy: logit 0 is +inf");
  expect_problem([&] { (void)reference::logsumexp(std::vector<double>{}, fp32); }, InputProblem::empty_input,
                 "empty");
  for (const double theta : {0.0, -0.0, double{INFINITY}, double{NAN}}) {
    RowOptions options;
    options.theta = theta;
    expect_problem([&] { (void)reference::log_softmax(std::vector<double>{1.0}, fp32, options); },
                   InputProblem::bad_temperature, "theta");
  }
  const std::vector<std::uint8_t> short_mask{1};
  RowOptions masked;
  masked.keep = short_mask;
  expect_problem(
      [&] {
        (void)reference::softmax(std::vector<double>{1.0, 2.0}, fp32, masked);
      },
      InputProblem::shape_mismatch, "mask has 1 entries but the row has 2");
  const std::vector<double> all_masked{-INFINITY, -INFINITY};
  expect_problem([&] { (void)reference::softmax(all_masked, fp32); }, InputProblem::fully_masked_row,
                 "every one of the 2 entries is masked");
  RowOptions zeros;
  zeros.fully_masked_gives_zeros = true;
  EXPECT_EQ(reference::softmax(all_masked, fp32, zeros), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(reference::logsumexp(all_masked, fp32, zeros), -INFINITY);
  EXPECT_EQ(reference::entropy(all_masked, fp32, zeros), 0.0);
}

TEST(Statistics, TheLoopReportsItsPrecisionAndExactCases) {
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  (void)reference::softmax(std::vector<double>{1.0, 1.0, 1.0}, fp32, options);
  EXPECT_EQ(statistics.exact_cases, 1);
  (void)reference::softmax(std::vector<double>{1.0, 2.0}, fp32, options);
  EXPECT_EQ(statistics.calls, 2);
  EXPECT_EQ(statistics.decided_in_double, 2);  // fp32: the double stage decides both
  EXPECT_EQ(statistics.decided_by_balls, 0);
  EXPECT_EQ(statistics.highest_precision, 0);  // the MPFR loop was not needed
  (void)reference::softmax(std::vector<double>{1.0, 2.0}, fp64, options);
  EXPECT_EQ(statistics.decided_in_double, 2);  // fp64 is too wide for it: the balls decide
  EXPECT_EQ(statistics.decided_by_balls, 2);
  options.mpfr_only = true;
  (void)reference::softmax(std::vector<double>{1.0, 2.0}, fp32, options);
  EXPECT_EQ(statistics.decided_in_double, 2);
  EXPECT_EQ(statistics.decided_by_balls, 2);
  EXPECT_EQ(statistics.highest_precision, reference::ZivSchedule::for_format(fp32).initial);
}

// A decision is a cell of finite values, or an enclosure wholly beyond overflow on one side: in
// e4m3 (overflow is NaN) both ends of an enclosure reaching past -464 and +464 round to the same
// NaN bits, and -0 and +0 compare equal as numbers. Each rule checked with its mutation's input.
TEST(Decisions, NaNEndsOfBothSignsAndMixedZerosDecideNothingWrong) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(reference::decided_rounding(nan, nan, -1, 1).has_value());
  ASSERT_TRUE(reference::decided_rounding(nan, nan, 1, 1).has_value());
  EXPECT_TRUE(std::isnan(*reference::decided_rounding(nan, nan, 1, 1)));
  EXPECT_FALSE(reference::decided_rounding(nan, 448.0, 1, 1).has_value());
  EXPECT_FALSE(std::signbit(*reference::decided_rounding(-0.0, 0.0, -1, 1)));  // sign not claimed: +0
  EXPECT_FALSE(std::signbit(*reference::decided_rounding(0.0, 0.0, 1, 1)));
  EXPECT_TRUE(std::signbit(*reference::decided_rounding(-0.0, -0.0, -1, -1)));
  EXPECT_FALSE(reference::decided_rounding(-0.0, 0x1p-149, -1, 1).has_value());
  EXPECT_EQ(*reference::decided_rounding(0.5, 0.5, 1, 1), 0.5);
}

// Issue class: fp32 softmax at theta = 2^-60 returned -0 for coefficients whose exact value is
// positive (the double stage's bracket dips below 0 and rounds to -0).
TEST(Decisions, AnUnderflowingPositiveCoefficientIsPlusZero) {
  const std::vector<double> logits = {0x1.2e4635592bbe0p+1, 0x1.2dabe1d193712p+2, 0x1.d218c6ca71c80p+1};
  reference::RowOptions options;
  options.theta = 0x1p-60;
  const std::vector<double> p = reference::softmax(logits, fp32, options);
  EXPECT_EQ(p[1], 1.0);
  for (const std::size_t j : {0U, 2U}) {
    EXPECT_EQ(p[j], 0.0);
    EXPECT_FALSE(std::signbit(p[j])) << j;
  }
}

// fp8 outputs (e4m3: overflow is NaN; e5m2: IEEE) on the extreme-input families: temperatures of
// 1e-17, 2^-60 and -1e-17 (one-hot rows, ties at the top), logits of +-1e30 and 1e300 at theta 0.5,
// against the independent 320-bit backend; nothing refused.
TEST(Fp8Extremes, SoftmaxOnTinyTemperaturesAndHugeLogits) {
  DeterministicRandom random(29);
  const std::pair<double, double> families[] = {
      {1e-17, 1}, {0x1p-60, 1}, {-1e-17, 1}, {1, 1e30}, {0.5, 1e300}};
  for (const FloatFormat* format : {&fp8_e4m3, &fp8_e5m2}) {
    for (const auto& [theta, scale] : families) {
      for (int trial = 0; trial < 6; ++trial) {
        const std::size_t n = 2 + random.below(12);
        std::vector<double> logits(n);
        for (double& e : logits) e = scale * round_to_format(random.normal(0, 1), bf16);
        if (trial >= 4) logits[n - 1] = logits[0];  // ties, perhaps at the top
        RowOptions options;
        options.theta = theta;
        const std::vector<double> p = reference::softmax(logits, *format, options);
        const std::vector<Exact> exact = testing::independent_softmax(logits, theta);
        for (std::size_t j = 0; j < n; ++j)
          EXPECT_TRUE(is_nearest_in_format(p[j], exact[j], *format))
              << format->name << " theta " << theta << " scale " << scale << " trial " << trial << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace sharpcheck
