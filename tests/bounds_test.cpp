// The bounds against independent 320-bit cpp_bin_float values (rigour: the exact value lies
// inside; tightness: by at most a few ulps), simulation, and the Z3 stagnation search.
#include "bounds/bounds.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "proofs/obligation.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck::bounds {
namespace {

using testing::Exact;

// lower <= exact <= upper, and the ends are within 4 ulps of it (outward rounding, not slack).
::testing::AssertionResult tightly_encloses(double lower, double upper, const Exact& exact) {
  if (!(Exact(lower) <= exact && exact <= Exact(upper))) {
    return ::testing::AssertionFailure()
           << "[" << hex_float(lower) << ", " << hex_float(upper) << "] misses " << exact.str(30);
  }
  if (Exact(upper) - Exact(lower) > 8 * Exact(std::nextafter(upper, INFINITY) - upper)) {
    return ::testing::AssertionFailure() << "enclosure too wide";
  }
  return ::testing::AssertionSuccess();
}

TEST(Lemma21, EnclosesTheExactBoundsOnBothSides) {
  DeterministicRandom random(1);
  for (int i = 0; i < 300; ++i) {
    const double n = static_cast<double>(1 + random.below(1 << 20));
    const double delta = random.uniform(0, 30);
    const double theta = random.uniform(0.05, 4);
    const Enclosure lemma = lemma_2_1(n, delta, theta);
    const Exact ratio = Exact(delta) / Exact(theta);
    ASSERT_TRUE(tightly_encloses(lemma.lower, std::nextafter(lemma.lower, INFINITY), exp(-ratio) / Exact(n)));
    ASSERT_TRUE(tightly_encloses(std::nextafter(lemma.upper, -INFINITY), lemma.upper, exp(ratio) / Exact(n)));
    const double largest = tight_largest_coefficient(n, delta, theta);
    const Exact exact_largest = 1 / (1 + (Exact(n) - 1) * exp(-ratio));
    ASSERT_TRUE(tightly_encloses(std::nextafter(largest, -INFINITY), largest, exact_largest));
    const double smallest = tight_smallest_coefficient(n, delta, theta);
    ASSERT_TRUE(tightly_encloses(smallest, std::nextafter(smallest, INFINITY),
                                 1 / (1 + (Exact(n) - 1) * exp(ratio))));
    // The tight forms sit inside the lemma's.
    ASSERT_LE(largest, lemma.upper);
    ASSERT_GE(smallest, lemma.lower);
  }
}

TEST(Theorem22, TheExactThresholdIsTheFirstSizeBelowEpsAndThePaperFormIsAbove) {
  for (const double delta : {0.0, 2.28, 5.69, 14.78}) {
    for (const double eps : {1.0, 0.5, 0.1, 0.01, 0.25}) {
      const std::uint64_t n = smallest_n_below(delta, 1.0, eps);
      const auto coefficient = [&](std::uint64_t size) {
        return 1 / (1 + (Exact(size) - 1) * exp(-Exact(delta)));
      };
      EXPECT_LT(coefficient(n), Exact(eps)) << delta << " " << eps;
      if (n > 1) {
        EXPECT_GE(coefficient(n - 1), Exact(eps)) << delta << " " << eps;
      }
      EXPECT_GE(theorem_2_2_threshold(delta, 1.0, eps) + 1, static_cast<double>(n - 1));
    }
  }
  EXPECT_EQ(smallest_n_below(0.0, 1.0, 0.25), 5u);  // uniform rows: 1/n < 1/4 from n = 5
}

TEST(Entropy, LowerBoundIsLogNMinusTheScaledSpreadRoundedDown) {
  const double bound = entropy_lower_bound(1024, 2.0, 0.5);
  ASSERT_TRUE(tightly_encloses(bound, std::nextafter(bound, INFINITY), log(Exact(1024)) - 4));
}

TEST(Horizons, UnderflowHorizonForUint8AtGemmasMeanSpreadIsNearOneHundredFiftyThousand) {
  const Enclosure horizon = underflow_horizon(5.69, 1.0, 1.0 / 512);
  ASSERT_EQ(horizon.lower, horizon.upper);
  const Exact threshold = 1 + Exact(511) * exp(Exact(5.69));
  EXPECT_EQ(Exact(horizon.lower), ceil(threshold));
  EXPECT_NEAR(horizon.lower, 150000, 2000);
  // At the horizon the largest coefficient is at most 1/512; one item earlier it is above.
  EXPECT_LE(tight_largest_coefficient(horizon.lower, 5.69, 1.0), 1.0 / 512 * (1 + 1e-12));
  EXPECT_GT(1 / (1 + (Exact(horizon.lower) - 2) * exp(-Exact(5.69))), Exact(1) / 512);
}

TEST(Horizons, AccumulationHorizonMatchesSimulationAndZ3sStagnationPoint) {
  for (const FloatFormat* format : {&bf16, &fp16, &fp8_e4m3, &fp8_e5m2, &fp32}) {
    double sum = 0;
    std::uint64_t n = 0;
    while (true) {
      ++n;
      const double next = round_to_format(sum + 1, *format);
      if (next == sum) break;
      sum = next;
    }
    EXPECT_EQ(accumulation_horizon(*format), n) << format->name;
  }
  EXPECT_EQ(accumulation_horizon(bf16), 257u);
  EXPECT_EQ(static_cast<double>(accumulation_horizon(bf16)), proofs::smallest_stagnation_point(8, 8) + 1);
  EXPECT_EQ(static_cast<double>(accumulation_horizon(fp16)), proofs::smallest_stagnation_point(5, 11) + 1);
}

TEST(AdaptiveTemperature, ActiveIntervalEndpointsAreCertifiedAndMatchTheZ3Brackets) {
  const ActiveInterval interval = adaptive_active_interval();
  EXPECT_LE(interval.lower_root.upper - interval.lower_root.lower, 1e-14);
  EXPECT_GE(interval.lower_root.lower, 0.8485);
  EXPECT_LE(interval.lower_root.upper, 0.8486);
  EXPECT_GE(interval.upper_root.lower, 5.9445);
  EXPECT_LE(interval.upper_root.upper, 5.9446);
  EXPECT_EQ(adaptive_beta(0.8), 1.0);
  EXPECT_GT(adaptive_beta(3.0), 1.0);
  EXPECT_EQ(adaptive_beta(6.5), 1.0);
  EXPECT_EQ(adaptive_beta(0.4), 1.0);
}

TEST(SigmaMax, TheCertifiedBoundIsAboveTheTrueValueAndTight) {
  Matrix diagonal(2, 2);
  diagonal(0, 0) = 3;
  diagonal(1, 1) = -1;
  std::string certificate;
  const double sigma = certified_sigma_max(diagonal, &certificate);
  EXPECT_GE(sigma, 3.0);
  EXPECT_LE(sigma, 3.0 * (1 + 1e-8));
  EXPECT_NE(certificate.find("Cholesky"), std::string::npos);
  DeterministicRandom random(5);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t rows = 1 + random.below(40);
    const std::size_t cols = 1 + random.below(40);
    Matrix a(rows, cols);
    for (double& x : a.values) x = random.normal(0, 1);
    const double bound = certified_sigma_max(a, &certificate);
    // sigma_max >= |A e_1| for the first column: a lower bound to check against.
    double column = 0;
    for (std::size_t r = 0; r < rows; ++r) column += a(r, 0) * a(r, 0);
    EXPECT_GE(bound, std::sqrt(column) * (1 - 1e-12));
    EXPECT_NE(certificate.find("Cholesky"), std::string::npos);
  }
}

TEST(Proposition31, TheBoundHoldsForRandomWeightsAndReportsTheActualSpread) {
  DeterministicRandom random(7);
  for (int trial = 0; trial < 30; ++trial) {
    const std::size_t d = 1 + random.below(64);
    const std::size_t heads = 1 + random.below(16);
    Matrix q(heads, d), k(heads, d), y(1, d), x(1 + random.below(20), d);
    for (auto* m : {&q, &k, &y, &x}) {
      for (double& v : m->values) v = random.normal(0, 1);
    }
    const Proposition31 result = proposition_3_1(q, k, y, x);
    EXPECT_LE(result.actual_spread.upper, result.bound) << "trial " << trial;
    EXPECT_LE(result.actual_spread.lower, result.actual_spread.upper);
    EXPECT_GT(result.bound, 0);
  }
}

TEST(BadInput, EveryArgumentIsChecked) {
  const auto problem_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InputError& error) {
      return error.what();
    }
    return "no error";
  };
  EXPECT_NE(problem_of([] { (void)lemma_2_1(0, 1, 1); }).find("n must be >= 1"), std::string::npos);
  EXPECT_NE(problem_of([] { (void)lemma_2_1(4, -1, 1); }).find("delta must be >= 0"), std::string::npos);
  EXPECT_NE(problem_of([] { (void)tight_largest_coefficient(4, 1, 0); }).find("theta"), std::string::npos);
  EXPECT_NE(problem_of([] { (void)theorem_2_2_threshold(1, 1, 0); }).find("eps"), std::string::npos);
  EXPECT_NE(problem_of([] { (void)smallest_n_below(1, 1, 1.5); }).find("eps"), std::string::npos);
  EXPECT_NE(problem_of([] { (void)entropy_lower_bound(NAN, 1, 1); }).find("n is not finite"),
            std::string::npos);
  EXPECT_NE(problem_of([] {
              (void)proposition_3_1(Matrix(2, 3), Matrix(2, 3), Matrix(1, 4), Matrix(1, 3));
            }).find("y has 4 entries"),
            std::string::npos);
  EXPECT_NE(problem_of([] {
              (void)proposition_3_1(Matrix(2, 3), Matrix(3, 3), Matrix(1, 3), Matrix(1, 3));
            }).find("same length"),
            std::string::npos);
}

}  // namespace
}  // namespace sharpcheck::bounds
