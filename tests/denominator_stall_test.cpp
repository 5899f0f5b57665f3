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
                        std::size_t n) {
  for (const StallPoint& p : study.points) {
    if (*p.accumulation == accumulation && p.rows == rows && p.n == n) return p;
  }
  throw std::logic_error("no such point");
}

// The study's exact denominator is exp(RN(logsumexp) - max): a few 2^-53 relative.
constexpr double denominator_accuracy = 1e-14;

TEST(DenominatorStall, Bf16AndFp16RunningSumsStallWhereTheirPrecisionEnds) {
  const StallStudy study = run_stall_study({});
  ASSERT_EQ(study.stall_values.size(), 3u);
  EXPECT_EQ(study.stall_values[0], 256.0);   // bf16: 8 bits of precision
  EXPECT_EQ(study.stall_values[1], 2048.0);  // fp16: 11 bits
  EXPECT_EQ(study.stall_values[2], 0.0);     // fp32: not within 16,384 terms
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
  const StallStudy study = run_stall_study({});
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

}  // namespace
}  // namespace sharpcheck::studies
