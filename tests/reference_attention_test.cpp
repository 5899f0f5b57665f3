// The attention reference against an independent cpp_bin_float computation and exact cases.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "reference/attention.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck {
namespace {

using reference::AttentionOptions;
using testing::Exact;
using testing::is_nearest_in_format;

Matrix random_matrix(std::size_t rows, std::size_t cols, DeterministicRandom& random, double sigma) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = static_cast<float>(random.normal(0, sigma));
  return matrix;
}

// Attention in 320-bit cpp_bin_float: weights and outputs for one query row.
struct IndependentRow {
  std::vector<Exact> weights;
  std::vector<Exact> output;
};
IndependentRow independent_attention_row(const Matrix& q, const Matrix& k, const Matrix& v, std::size_t query,
                                         const std::vector<bool>& visible, Exact scale, double theta) {
  std::vector<Exact> logits(k.rows);
  Exact best = -1e300;
  for (std::size_t j = 0; j < k.rows; ++j) {
    Exact dot = 0;
    for (std::size_t t = 0; t < k.cols; ++t) dot += Exact(q(query, t)) * Exact(k(j, t));
    logits[j] = dot * scale / theta;
    if (visible[j]) best = std::max(best, logits[j]);
  }
  IndependentRow row{std::vector<Exact>(k.rows, Exact(0)), std::vector<Exact>(v.cols, Exact(0))};
  Exact sum = 0;
  for (std::size_t j = 0; j < k.rows; ++j) {
    if (!visible[j]) continue;
    row.weights[j] = exp(logits[j] - best);
    sum += row.weights[j];
  }
  for (std::size_t j = 0; j < k.rows; ++j) {
    row.weights[j] /= sum;
    for (std::size_t c = 0; c < v.cols; ++c) row.output[c] += row.weights[j] * Exact(v(j, c));
  }
  return row;
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(EveryFormat, AgreesWithAnIndependentComputationWithAndWithoutMasks) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(5);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t m = 1 + random.below(3);
    const std::size_t n = 1 + random.below(24);
    const std::size_t d = std::array<std::size_t, 4>{1, 3, 4, 16}[trial % 4];
    const Matrix q = random_matrix(m, d, random, 1.5);
    const Matrix k = random_matrix(n, d, random, 1.5);
    const Matrix v = random_matrix(n, 3, random, 2.0);
    AttentionOptions options;
    options.return_weights = true;
    options.scores.causal = trial % 3 == 1;
    options.scores.theta = trial % 5 == 2 ? -0.75 : 1.0;
    Exact scale = 1 / sqrt(Exact(d));
    if (trial % 4 == 3) {
      options.scores.scale = 0.3;
      scale = Exact(0.3);
    }
    const auto result = reference::attention(q, k, v, format, options);
    AttentionOptions mpfr_only = options;
    mpfr_only.mpfr_only = true;
    const auto by_mpfr_alone = reference::attention(q, k, v, format, mpfr_only);
    ASSERT_EQ(by_mpfr_alone.output.values, result.output.values);
    ASSERT_EQ(by_mpfr_alone.weights->values, result.weights->values);
    for (std::size_t i = 0; i < m; ++i) {
      std::vector<bool> visible(n);
      for (std::size_t j = 0; j < n; ++j) visible[j] = !options.scores.causal || j <= i;
      const auto expected = independent_attention_row(q, k, v, i, visible, scale, options.scores.theta);
      for (std::size_t c = 0; c < v.cols; ++c) {
        ASSERT_TRUE(is_nearest_in_format(result.output(i, c), expected.output[c], format))
            << "trial " << trial;
      }
      for (std::size_t j = 0; j < n; ++j) {
        ASSERT_TRUE(is_nearest_in_format(result.weights->operator()(i, j), expected.weights[j], format));
      }
    }
  }
}

TEST_P(EveryFormat, OneKeyReturnsItsValueRow) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(9);
  const Matrix q = random_matrix(3, 8, random, 1.0);
  const Matrix k = random_matrix(1, 8, random, 1.0);
  const Matrix v = random_matrix(1, 5, random, 1.0);
  const auto result = reference::attention(q, k, v, format);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t c = 0; c < 5; ++c) ASSERT_EQ(result.output(i, c), round_to_format(v(0, c), format));
  }
}

const auto format_name = [](const auto& info) { return std::string(info.param->name); };
INSTANTIATE_TEST_SUITE_P(Reference, EveryFormat, ::testing::ValuesIn(all_float_formats), format_name);

// Two groups of tied logits (q.k = 2 for two keys, 0 for one) whose value means are both
// 1 + 2^-8: the output is exactly that, a bf16 rounding boundary that no enclosure can decide, so
// the exact branch must find it and round the tie to even (1.0).
TEST(ExactCases, TiedGroupsWithEqualMeansGiveThatMeanExactly) {
  Matrix q(1, 2);
  q(0, 0) = 1.0;
  Matrix k(3, 2);
  k(0, 0) = 2.0;
  k(1, 0) = 2.0;
  Matrix v(3, 2);
  v(0, 0) = 1.0;
  v(1, 0) = 1.0 + 0x1p-7;
  v(2, 0) = 1.0 + 0x1p-8;
  v(0, 1) = 1.0;  // column 1: unequal means, an ordinary irrational output
  v(1, 1) = 2.0;
  v(2, 1) = 3.0;
  reference::ZivStatistics statistics;
  AttentionOptions options;
  options.statistics = &statistics;
  const auto result = reference::attention(q, k, v, bf16, options);
  EXPECT_EQ(result.output(0, 0), 1.0);
  EXPECT_EQ(statistics.exact_cases, 1);
  EXPECT_GT(statistics.escalations, 0);
  const auto in_fp32 = reference::attention(q, k, v, fp32, options);
  EXPECT_EQ(in_fp32.output(0, 0), 1.0 + 0x1p-8);
}

TEST(ExactCases, AllKeysTiedGiveWeightsOfExactlyOneOverN) {
  Matrix q(1, 4, 0.5);
  Matrix k(3, 4, 0.25);
  Matrix v(3, 1);
  v(0, 0) = 1.0;
  v(1, 0) = 1.0 + 0x1p-22;  // mean 1 + 2^-23 / 1.5 ... not a boundary; still exact via Ziv
  v(2, 0) = 1.0 + 0x1p-23;
  AttentionOptions options;
  options.return_weights = true;
  const auto result = reference::attention(q, k, v, fp32, options);
  for (std::size_t j = 0; j < 3; ++j)
    EXPECT_TRUE(is_nearest_in_format(result.weights->operator()(0, j), Exact(1) / 3, fp32));
  EXPECT_TRUE(
      is_nearest_in_format(result.output(0, 0), (Exact(3) + Exact(0x1p-22) + Exact(0x1p-23)) / 3, fp32));
}

// Scale 0 under a soft-cap: every capped score is cap tanh(0) = 0 whatever q . k is, so the row
// is one group and its output a plain mean, here a tie ((2 + 2^-52) / 2 = 1 + 2^-53, to the even
// 1). The exact cases group the soft-cap's pairs by s q . k (by the raw q . k they split this row;
// the double stage decides it here anyway, its weights being exactly 1/2).
TEST(ExactCases, ScaleZeroUnderASoftCapIsOneGroup) {
  Matrix q(1, 2), k(2, 2), v(2, 1);
  q(0, 0) = 1;
  k(0, 0) = 1;
  k(1, 0) = 2;
  v(0, 0) = 2;
  v(1, 0) = 0x1p-52;
  AttentionOptions options;
  options.scores.scale = 0.0;
  options.scores.softcap = 1.0;
  EXPECT_EQ(reference::attention(q, k, v, fp64, options).output(0, 0), 1.0);
}

// A tie broken by an exponentially small weight (reference/attention_exact.cpp,
// decide_outputs_by_their_tail): q = 0, so keys 0 and 1 tie, and their mean is a bf16 midpoint;
// key 2 is hidden by a finite additive mask (as -1e9 or finfo.min masks are) and its value pulls the
// output off the midpoint by about e^-gap. The output rounds to the neighbour on the hidden key's
// side, against ties-to-even in two of the four cases. At a gap of 2000 it is checked against MPFR
// at 12,000 bits (which separates e^-2000 ~ 2^-2885 from the midpoint); at 1e9, where no
// precision does, by the side alone (before: UndecidedRounding at 131072 bits).
TEST(ExactCases, ATieBrokenByAHiddenKeyRoundsTowardIt) {
  struct Tie {
    double low, high, hidden;
  };
  const Tie ties[] = {{1.0, 1.0 + 0x1p-7, 5.0},  // midpoint 1 + 2^-8, ties to even: 1
                      {1.0, 1.0 + 0x1p-7, -5.0},
                      {1.0 + 0x1p-7, 1.0 + 0x1p-6, 5.0},  // midpoint 1 + 3 2^-8, ties to even: 1 + 2^-6
                      {1.0 + 0x1p-7, 1.0 + 0x1p-6, -5.0}};
  for (const double gap : {2000.0, 1e9}) {
    for (const Tie& tie : ties) {
      Matrix q(1, 2, 0.0), k(3, 2, 1.0), v(3, 1);
      v(0, 0) = tie.low;
      v(1, 0) = tie.high;
      v(2, 0) = tie.hidden;
      const std::vector<double> bias{0.0, 0.0, -gap};
      AttentionOptions options;
      options.scores.bias = bias;
      const double got = reference::attention(q, k, v, bf16, options).output(0, 0);
      EXPECT_EQ(got, tie.hidden > tie.low ? tie.high : tie.low) << "gap " << gap << " hidden " << tie.hidden;
      options.mpfr_only = true;  // the Ziv loop and its exact cases alone (the double stage may decide)
      EXPECT_EQ(reference::attention(q, k, v, bf16, options).output(0, 0), got);
      if (gap > 1e6) continue;
      mpfr_t weight, sum, total;
      mpfr_inits2(12000, weight, sum, total, static_cast<mpfr_ptr>(nullptr));
      mpfr_set_d(weight, -gap, MPFR_RNDN);
      mpfr_exp(weight, weight, MPFR_RNDN);  // e^-gap, the hidden key's weight against the tied keys' 1
      mpfr_mul_d(sum, weight, tie.hidden, MPFR_RNDN);
      mpfr_add_d(sum, sum, tie.low, MPFR_RNDN);
      mpfr_add_d(sum, sum, tie.high, MPFR_RNDN);
      mpfr_add_ui(total, weight, 2, MPFR_RNDN);
      mpfr_div(sum, sum, total, MPFR_RNDN);
      EXPECT_EQ(got, round_to_format(sum, bf16)) << "hidden " << tie.hidden;
      mpfr_clears(weight, sum, total, static_cast<mpfr_ptr>(nullptr));
    }
  }
}

// The log-sum-exp's counterpart (decide_lse_by_its_tail): one key whose logit is a bf16 midpoint
// (1 + 2^-8), one hidden far below, so L = x + ln(1 + e^-gap) lies just above the midpoint and
// rounds up to 1 + 2^-7 (ties to even would give 1); checked against MPFR where the gap allows.
TEST(ExactCases, ALogSumExpJustAboveAMidpointRoundsUp) {
  for (const double gap : {2000.0, 1e9}) {
    Matrix q(1, 1, 1.0), k(2, 1, 1.0 + 0x1p-8), v(2, 1, 1.0);
    const std::vector<double> bias{0.0, -gap};
    AttentionOptions options;
    options.scores.bias = bias;
    options.scores.scale = 1.0;
    options.return_lse = true;
    options.lse_format = &bf16;
    for (const bool mpfr_only : {false, true}) {
      options.mpfr_only = mpfr_only;
      EXPECT_EQ(reference::attention(q, k, v, fp32, options).lse.at(0), 1.0 + 0x1p-7) << "gap " << gap;
    }
    if (gap > 1e6) continue;
    mpfr_t l;
    mpfr_init2(l, 12000);
    mpfr_set_d(l, -gap, MPFR_RNDN);
    mpfr_exp(l, l, MPFR_RNDN);
    mpfr_log1p(l, l, MPFR_RNDN);
    mpfr_add_d(l, l, 1.0 + 0x1p-8, MPFR_RNDN);
    EXPECT_EQ(round_to_format(l, bf16), 1.0 + 0x1p-7);
    mpfr_clear(l);
  }
}

TEST(Masks, ExplicitMaskHidesKeysAndFullyMaskedQueriesAreErrorsOrZeros) {
  DeterministicRandom random(17);
  const Matrix q = random_matrix(2, 4, random, 1.0);
  const Matrix k = random_matrix(3, 4, random, 1.0);
  const Matrix v = random_matrix(3, 2, random, 1.0);
  const std::vector<std::uint8_t> keep{1, 0, 1, 0, 0, 0};
  AttentionOptions options;
  options.scores.keep = keep;
  options.return_weights = true;
  EXPECT_THROW((void)reference::attention(q, k, v, fp32, options), InputError);
  options.scores.fully_masked = tensor::FullyMaskedRows::zeros;
  const auto result = reference::attention(q, k, v, fp32, options);
  EXPECT_EQ(result.weights->operator()(0, 1), 0.0);
  EXPECT_EQ(result.output(1, 0), 0.0);
  EXPECT_EQ(result.output(1, 1), 0.0);
  EXPECT_NE(result.output(0, 0), 0.0);
}

TEST(BadInput, ShapesAndValuesAreNamed) {
  const auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InputError& error) {
      return error.what();
    }
    return "no error";
  };
  const Matrix q(2, 4, 1.0);
  const Matrix k(3, 4, 1.0);
  const Matrix v(3, 2, 1.0);
  EXPECT_EQ(message_of([&] { (void)reference::attention(q, Matrix(3, 5, 1.0), v, fp32); }),
            "attention: Q has 4 columns but K has 5");
  EXPECT_EQ(message_of([&] { (void)reference::attention(q, k, Matrix(2, 2, 1.0), fp32); }),
            "attention: K has 3 rows but V has 2");
  Matrix bad_keys = k;
  bad_keys(2, 1) = NAN;
  EXPECT_EQ(message_of([&] { (void)reference::attention(q, bad_keys, v, fp32); }),
            "attention: K(2, 1) is NaN");
  AttentionOptions zero_theta;
  zero_theta.scores.theta = 0.0;
  EXPECT_NE(message_of([&] { (void)reference::attention(q, k, v, fp32, zero_theta); }).find("theta"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)reference::attention(Matrix(0, 4), k, v, fp32); }).find("empty"),
            std::string::npos);
}

}  // namespace
}  // namespace sharpcheck
