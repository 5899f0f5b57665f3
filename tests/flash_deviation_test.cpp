// The flash-deviation study's kernels are what they claim to be, judged by the precision models
// (the flash kernel passes attention_p_rounded and fails attention_fp32, which forbids rounding P;
// the naive kernel passes attention_math_lowp), and the study's figures are consistent.
#include "studies/flash_deviation.hpp"

#include <gtest/gtest.h>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "metrics/evaluate.hpp"

namespace sharpcheck::studies {
namespace {

Matrix values_of(std::size_t rows, std::size_t cols, double sigma, DeterministicRandom& random) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = round_to_format(random.normal(0, sigma), bf16);
  return matrix;
}

bool passes(const char* model, const Matrix& q, const Matrix& k, const Matrix& v, const Matrix& out) {
  const metrics::JudgeSpec spec{kernels::Operation::attention, &bf16, &metrics::tolerance_for(model)};
  return metrics::judge_attention(spec, q, k, v, {}, out).comparison.passed();
}

TEST(FlashDeviation, EachKernelFitsItsPrecisionModelAndNotATighterOne) {
  DeterministicRandom random(5);
  const Matrix q = values_of(16, 64, 3, random), k = values_of(512, 64, 3, random),
               v = values_of(512, 64, 1, random);
  const Matrix flash = flash_attention_in(bf16, q, k, v, 64);
  const Matrix naive = naive_attention_in(bf16, q, k, v);
  EXPECT_TRUE(passes("attention_p_rounded", q, k, v, flash));
  EXPECT_FALSE(passes("attention_fp32", q, k, v, flash));
  EXPECT_TRUE(passes("attention_math_lowp", q, k, v, naive));
  EXPECT_FALSE(passes("attention_p_rounded", q, k, v, naive));  // its bf16 scores of size ~10
}

TEST(FlashDeviation, TheStudysFiguresAreConsistent) {
  DeviationSettings settings;
  settings.sizes = {128, 1024};
  settings.head_dims = {64};
  settings.query_rows = 4;
  const DeviationStudy study = run_deviation_study(settings);
  ASSERT_EQ(study.points.size(), 3u * 2u * 2u);  // formats x inputs x sizes
  for (const DeviationPoint& point : study.points) {
    for (const Deviation* d : {&point.naive, &point.flash}) {
      EXPECT_GT(d->max_absolute, 0);  // neither kernel is correctly rounded everywhere
      EXPECT_GE(d->max_absolute, d->rmse);
      EXPECT_GE(d->correctly_rounded, 0);
      EXPECT_LT(d->correctly_rounded, 1);
      EXPECT_GE(d->max_ulps, 1);
    }
    EXPECT_GT(point.ratio(), 0);
  }
  settings.sizes = {0};
  EXPECT_THROW((void)run_deviation_study(settings), InputError);
}

}  // namespace
}  // namespace sharpcheck::studies
