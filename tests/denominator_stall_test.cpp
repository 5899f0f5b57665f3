// The denominator-stall study's claims, asserted from its numbers: a bf16 running sum of equal
// terms stalls at 256 and an fp16 one at 2048 (so a row of 16,384 equal logits sums to 64 in bf16
// outputs), an fp32 sum does not stall at these sizes and its kernel stays within an output ulp
// (the wrong-operator twin: the same study with fp32 accumulation shows none of it).
#include "studies/denominator_stall.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace sharpcheck::studies {
namespace {

const StallPoint& point(const StallStudy& study, const FloatFormat& accumulation, StallRows rows,
                        std::size_t n, Summation summation = Summation::sequential) {
  for (const StallPoint& p : study.points) {
    if (*p.strategy.format == accumulation && p.strategy.summation == summation && p.rows == rows && p.n == n)
      return p;
  }
  throw std::logic_error("no such point");
}

std::size_t strategy_index(const StallStudy& study, Summation summation, const FloatFormat& format) {
  for (std::size_t a = 0; a < study.settings.strategies.size(); ++a) {
    if (study.settings.strategies[a].summation == summation && *study.settings.strategies[a].format == format)
      return a;
  }
  throw std::logic_error("no such strategy");
}

// The default study, run once for every test here.
const StallStudy& default_study() {
  static const StallStudy study = run_stall_study({});
  return study;
}

// The study's exact denominator is exp(RN(logsumexp) - max): a few 2^-53 relative.
constexpr double denominator_accuracy = 1e-14;

TEST(DenominatorStall, Bf16AndFp16RunningSumsStallWhereTheirPrecisionEnds) {
  const StallStudy& study = default_study();
  const auto stall = [&](const FloatFormat& format) {
    return study.stall_values[strategy_index(study, Summation::sequential, format)];
  };
  EXPECT_EQ(stall(bf16), 256.0);     // bf16: 8 bits of precision
  EXPECT_EQ(stall(fp16), 2048.0);    // fp16: 11 bits
  EXPECT_EQ(stall(fp8_e4m3), 16.0);  // e4m3: 4 bits
  EXPECT_EQ(stall(fp8_e5m2), 8.0);   // e5m2: 3 bits
  EXPECT_FALSE(stall(fp32));         // fp32: not within 16,384 terms
  const auto& stalled = point(study, bf16, StallRows::equal, 16384);
  EXPECT_NEAR(stalled.denominator_error, 1 - 256.0 / 16384, denominator_accuracy);
  EXPECT_EQ(stalled.row_sum, 64.0);  // every output 1/256 instead of 1/16384
  EXPECT_NEAR(point(study, bf16, StallRows::equal, 256).denominator_error, 0.0, denominator_accuracy);
  EXPECT_NEAR(point(study, fp16, StallRows::equal, 16384).denominator_error, 1 - 2048.0 / 16384,
              denominator_accuracy);
  const auto& sound = point(study, fp32, StallRows::equal, 16384);
  EXPECT_NEAR(sound.denominator_error, 0.0, denominator_accuracy);
  EXPECT_EQ(sound.row_sum, 1.0);
  EXPECT_EQ(sound.max_relative_error, 0.0);
}

TEST(DenominatorStall, RandomRowsDegradeWithNInBf16ButNotInFp32) {
  const StallStudy& study = default_study();
  const double small = point(study, bf16, StallRows::random_normal, 64).denominator_error;
  const double large = point(study, bf16, StallRows::random_normal, 16384).denominator_error;
  EXPECT_GT(large, 0.5);  // most of the mass lost
  EXPECT_GT(large, 20 * small);
  for (const std::size_t n : {16, 1024, 16384}) {
    const auto& fp32_point = point(study, fp32, StallRows::random_normal, static_cast<std::size_t>(n));
    EXPECT_LT(fp32_point.denominator_error, 1e-4) << n;
    EXPECT_LE(fp32_point.max_relative_error, std::ldexp(1.0, -7)) << n;  // within one bf16 ulp
  }
}

// The sums stall exactly where bounds::accumulation_horizon says they must: the horizon is the
// count of terms whose last changes nothing, so the stalled value is one less. (A wrong horizon,
// e.g. fp16's for bf16, would differ: the horizons are distinct per format.)
TEST(DenominatorStall, SequentialSumsStallAtTheHorizonBoundsComputes) {
  const StallStudy& study = default_study();
  std::size_t checked = 0;
  for (std::size_t a = 0; a < study.settings.strategies.size(); ++a) {
    if (study.settings.strategies[a].summation != Summation::sequential) {
      EXPECT_FALSE(study.horizons[a]);
      continue;
    }
    ASSERT_TRUE(study.horizons[a]);
    if (!study.stall_values[a]) {
      EXPECT_GT(*study.horizons[a], 16384u) << study.settings.strategies[a].name();  // fp32: beyond the sizes
      continue;
    }
    EXPECT_EQ(*study.stall_values[a], static_cast<double>(*study.horizons[a] - 1))
        << study.settings.strategies[a].name();
    ++checked;
  }
  EXPECT_EQ(checked, 4u);  // bf16, fp16, e4m3, e5m2
  EXPECT_NE(study.horizons[strategy_index(study, Summation::sequential, bf16)],
            study.horizons[strategy_index(study, Summation::sequential, fp16)]);
}

// Pairwise and Kahan summation in bf16 do not stall: a row of 16,384 equal logits keeps its whole
// denominator, and random rows lose far less than the sequential bf16 sum (its twin, which does).
TEST(DenominatorStall, PairwiseAndKahanInBf16AvoidTheStall) {
  const StallStudy& study = default_study();
  const double sequential = point(study, bf16, StallRows::random_normal, 16384).denominator_error;
  for (const Summation summation : {Summation::pairwise, Summation::kahan}) {
    EXPECT_NEAR(point(study, bf16, StallRows::equal, 16384, summation).denominator_error, 0.0,
                denominator_accuracy);
    const double random = point(study, bf16, StallRows::random_normal, 16384, summation).denominator_error;
    EXPECT_LT(random, 0.01);
    EXPECT_LT(100 * random, sequential);
  }
  EXPECT_GT(point(study, bf16, StallRows::equal, 16384).denominator_error, 0.9);  // the twin stalls
}

}  // namespace
}  // namespace sharpcheck::studies
