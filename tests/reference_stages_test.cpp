// The staged reference (certified double, Arb balls, then MPFR's Ziv loop) against the MPFR loop
// alone; the double stage's exp against its proven bound; and inputs built to sit next to a
// rounding boundary, which must force escalation and still round right.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/mpfr_number.hpp"
#include "core/random.hpp"
#include "reference/attention.hpp"
#include "reference/double_stage.hpp"
#include "reference/softmax.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck {
namespace {

using reference::RowOptions;

// 10^6 random elements per format: 1,000 rows of 1,000 logits, N(0, 3^2) and N(0, 12^2) mixed.
TEST(Stages, BallsThenMpfrEqualMpfrAloneOnAMillionElementsPerFormat) {
  for (const FloatFormat* format : all_float_formats) {
    DeterministicRandom random(format->precision());
    reference::ZivStatistics staged;
    std::size_t elements = 0;
    for (int row_index = 0; row_index < 1000; ++row_index) {
      std::vector<double> row(1000);
      const double sigma = row_index % 2 == 0 ? 3.0 : 12.0;
      for (double& e : row) e = static_cast<float>(random.normal(0, sigma));
      RowOptions both;
      both.statistics = &staged;
      RowOptions alone;
      alone.mpfr_only = true;
      ASSERT_EQ(reference::softmax(row, *format, both), reference::softmax(row, *format, alone))
          << format->name << " row " << row_index;
      elements += row.size();
    }
    EXPECT_EQ(elements, 1000000u);
    // The fast stages carry the load: they decide all but a handful of the million, the double
    // stage nearly all of them for targets of 24 bits or fewer.
    EXPECT_GT(static_cast<double>(staged.decided_in_double + staged.decided_by_balls), 0.9999 * 1e6)
        << format->name;
    if (format->precision() <= 24) {
      EXPECT_GT(static_cast<double>(staged.decided_in_double), 0.999 * 1e6) << format->name;
    } else {
      EXPECT_EQ(staged.decided_in_double, 0) << format->name;
    }
  }
}

// 1,023 logits at 0 and one at -2^-100: the sum is 1,024 - 2^-100 (nearly), so each of the 1,023
// coefficients is 2^-10 (1 + 2^-110), a hair above 2^-10, which is exactly half of fp8 e4m3's
// smallest subnormal: a rounding boundary (whose tie would go down, to 0). Neither the balls (at
// 64 + 2 log2 n = 86 bits for these 1,024 terms) nor MPFR at 64 bits can tell the sum from 1,024;
// at 128 bits MPFR decides: up, to 2^-9. The last coefficient, a hair below the boundary, rounds to 0.
TEST(Stages, ARowAHairFromARoundingBoundaryForcesEscalationAndRoundsCorrectly) {
  std::vector<double> row(1024, 0.0);
  row[1023] = -0x1p-100;
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  const auto probabilities = reference::softmax(row, fp8_e4m3, options);
  EXPECT_GT(statistics.escalations + (statistics.highest_precision > 64 ? 1 : 0), 0);
  EXPECT_GE(statistics.highest_precision, 128);
  EXPECT_LT(statistics.decided_by_balls, 1024);
  const auto exact = testing::independent_softmax(row, 1.0);
  EXPECT_EQ(probabilities[0], std::ldexp(1.0, -9));
  EXPECT_EQ(probabilities[1023], 0.0);
  for (const std::size_t j : {std::size_t{0}, std::size_t{500}, std::size_t{1023}}) {
    EXPECT_TRUE(testing::is_nearest_in_format(probabilities[j], exact[j], fp8_e4m3)) << j;
  }
  // Exactly on the boundary (1,024 equal logits: 2^-10 exactly) the exact branch rounds the tie
  // to the even neighbour, 0.
  row[1023] = 0.0;
  EXPECT_EQ(reference::softmax(row, fp8_e4m3)[0], 0.0);
}

// The largest relative error of `exp_under_test` over `inputs`, against MPFR at 256 bits.
template <typename Exp>
double largest_relative_error(const std::vector<double>& inputs, Exp exp_under_test) {
  MpfrNumber exact(256);
  MpfrNumber error(256);
  double largest = 0;
  for (const double x : inputs) {
    mpfr_set_d(exact.get(), x, MPFR_RNDN);
    mpfr_exp(exact.get(), exact.get(), MPFR_RNDN);
    mpfr_sub_d(error.get(), exact.get(), exp_under_test(x), MPFR_RNDN);
    mpfr_div(error.get(), error.get(), exact.get(), MPFR_RNDN);
    largest = std::max(largest, std::fabs(mpfr_get_d(error.get(), MPFR_RNDU)));
  }
  return largest;
}

std::vector<double> exp_test_inputs() {
  std::vector<double> inputs;
  DeterministicRandom random(47);
  for (int i = 0; i < 1000000; ++i) inputs.push_back(-708 * random.uniform());
  // The reduction's worst cases: x next to k ln 2 (r near 0, where x - k ln2_high cancels) and next
  // to (k + 1/2) ln 2 (where k flips and |r| is largest), a few ulps either side, every k.
  for (int k = 0; k <= 1021; ++k) {
    for (const double centre : {-k * 0x1.62e42fefa39efp-1, -(k + 0.5) * 0x1.62e42fefa39efp-1}) {
      double x = centre;
      for (int step = 0; step < 8; ++step) x = std::nextafter(x, 0.0);
      for (int step = 0; step < 17; ++step, x = std::nextafter(x, -INFINITY)) {
        if (x <= 0 && x >= -708) inputs.push_back(x);
      }
    }
  }
  for (const double x : {0.0, -0.0, -0x1p-1074, -0x1p-60, -0x1p-30, -708.0}) inputs.push_back(x);
  return inputs;
}

TEST(DoubleStage, CertifiedExpStaysWithinItsProvenBoundOnAMillionInputsAndTheReductionsWorstCases) {
  const auto inputs = exp_test_inputs();
  const double observed = largest_relative_error(inputs, reference::certified_exp);
  EXPECT_LE(observed, reference::certified_exp_error);
  std::printf("certified_exp: largest relative error %.3g = %.2f u over %zu inputs (bound 2^-47 = 64 u)\n",
              observed, observed / 0x1p-53, inputs.size());
  // Mutation check: an exp 2^-46 off would be caught by the same comparison.
  EXPECT_GT(
      largest_relative_error(inputs, [](double x) { return reference::certified_exp(x) * (1 + 0x1p-46); }),
      reference::certified_exp_error);
}

// rows x cols of N(0, 1) draws rounded to fp32.
Matrix fp32_normal_matrix(std::size_t rows, std::size_t cols, DeterministicRandom& random) {
  Matrix result(rows, cols);
  for (double& x : result.values) x = static_cast<float>(random.normal(0, 1));
  return result;
}

TEST(DoubleStage, AttentionRowsEqualTheMpfrLoopAloneAndTheDoubleStageCarriesThem) {
  // 16 queries against 1,024 keys of dimension 64 (fp32 entries, N(0, 1)), weights too.
  DeterministicRandom random(61);
  const auto matrix = [&](std::size_t rows, std::size_t cols) {
    return fp32_normal_matrix(rows, cols, random);
  };
  const Matrix q = matrix(16, 64);
  const Matrix k = matrix(1024, 64);
  const Matrix v = matrix(1024, 16);
  for (const FloatFormat* format : {&fp32, &bf16, &fp8_e4m3}) {
    reference::ZivStatistics statistics;
    reference::AttentionOptions options;
    options.return_weights = true;
    options.statistics = &statistics;
    const auto staged = reference::attention(q, k, v, *format, options);
    options.mpfr_only = true;
    options.statistics = nullptr;
    const auto alone = reference::attention(q, k, v, *format, options);
    ASSERT_EQ(staged.output.values, alone.output.values) << format->name;
    ASSERT_EQ(staged.weights->values, alone.weights->values) << format->name;
    const double results = 16 * 16 + 16 * 1024;  // outputs and weights
    EXPECT_GT(static_cast<double>(statistics.decided_in_double), 0.99 * results) << format->name;
  }
}

// The double stage forms a block of query rows' sums as products over the keys any of them sees:
// rows that see different keys (causal, a window, a padded tail, a bias, a sink) in blocks of 32,
// the last one partial, must still equal the MPFR loop alone, result for result.
TEST(DoubleStage, BlocksOfRowsThatSeeDifferentKeysEqualTheMpfrLoopAlone) {
  DeterministicRandom random(62);
  const auto matrix = [&](std::size_t rows, std::size_t cols) {
    return fp32_normal_matrix(rows, cols, random);
  };
  const Matrix q = matrix(70, 24);
  const Matrix k = matrix(90, 24);
  Matrix v = matrix(90, 9);
  for (std::size_t j = 0; j < 90; ++j) v(j, 4) = 0;  // a zero column: exactly +0
  std::vector<double> bias(70 * 90);
  for (double& b : bias)
    b = random.uniform() < 0.1 ? -800 : random.normal(0, 1);  // e^-800: below the stage's floor
  reference::AttentionOptions options;
  options.scores.causal = true;
  options.scores.window_left = 40;
  options.scores.keys = 85;  // the last five keys are padding
  options.scores.sink = 0.5;
  options.scores.bias = bias;
  options.return_lse = true;
  for (const FloatFormat* format : {&fp32, &bf16}) {
    reference::ZivStatistics statistics;
    options.statistics = &statistics;
    options.mpfr_only = false;
    const auto staged = reference::attention(q, k, v, *format, options);
    options.mpfr_only = true;
    options.statistics = nullptr;
    const auto alone = reference::attention(q, k, v, *format, options);
    ASSERT_EQ(staged.output.values, alone.output.values) << format->name;
    ASSERT_EQ(staged.lse, alone.lse) << format->name;
    EXPECT_GT(static_cast<double>(statistics.decided_in_double), 0.99 * 70 * 10) << format->name;
  }
}

TEST(DoubleStage, DecidesNothingForWideTargetsOrOtherRoundingModes) {
  std::vector<double> row{1.0, 2.0, 3.5};
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  (void)reference::softmax(row, fp64, options);
  EXPECT_EQ(statistics.decided_in_double, 0);
  (void)reference::softmax(row, fp32, options);
  EXPECT_EQ(statistics.decided_in_double, 3);
  std::fesetround(FE_UPWARD);
  const auto upward = reference::softmax(row, fp32, options);
  std::fesetround(FE_TONEAREST);
  EXPECT_EQ(statistics.decided_in_double, 3);  // the stage stood aside; the result is unchanged
  EXPECT_EQ(upward, reference::softmax(row, fp32));
}

}  // namespace
}  // namespace sharpcheck
