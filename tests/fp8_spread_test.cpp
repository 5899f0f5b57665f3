// The fp8-spread study's claims, asserted from its own numbers: FP8 attention's error grows with
// the logits' spread; Hadamard rotation lowers it on outlier inputs at small spreads (and, the
// twin, not on inputs without outliers, where there is nothing to spread); FlashAttention 4's lazy
// rescaling saturates e4m3 P from a small spread on, and the kernels that always rescale never do.
#include "studies/fp8_spread.hpp"

#include <gtest/gtest.h>

#include <cstdio>

#include "core/errors.hpp"

namespace sharpcheck::studies {
namespace {

const Fp8SpreadStudy& small_study() {
  static const Fp8SpreadStudy study = [] {
    Fp8SpreadSettings settings;
    settings.keys = 512;
    settings.query_rows = 16;
    settings.sigmas = {0.25, 0.5, 1, 2, 4};
    settings.inputs = {DeviationInputs::normal, DeviationInputs::outliers};
    return run_fp8_spread_study(settings);
  }();
  return study;
}

const Fp8Error& error_at(DeviationInputs inputs, double sigma, Fp8Variant variant) {
  for (const Fp8SpreadPoint& point : small_study().points) {
    if (point.inputs == inputs && !point.unscaled && point.sigma == sigma)
      return point.errors[static_cast<int>(variant)];
  }
  throw std::logic_error("no such point");
}

TEST(Fp8Spread, TheLogitsHaveTheAskedSpread) {
  for (const Fp8SpreadPoint& point : small_study().points) {
    if (!point.unscaled) {
      EXPECT_NEAR(point.measured, point.sigma, 1e-9 * point.sigma);
    }
  }
}

TEST(Fp8Spread, ErrorGrowsWithTheSpread) {
  for (const DeviationInputs inputs : {DeviationInputs::normal, DeviationInputs::outliers}) {
    EXPECT_GT(error_at(inputs, 4, Fp8Variant::plain).rmse,
              3 * error_at(inputs, 0.25, Fp8Variant::plain).rmse);
  }
  EXPECT_GT(error_at(DeviationInputs::normal, 4, Fp8Variant::plain).rmse,
            5 * error_at(DeviationInputs::normal, 0.5, Fp8Variant::plain).rmse);
}

TEST(Fp8Spread, RotationHelpsOnOutliersAtSmallSpreadsAndNotWithoutOutliers) {
  for (const double sigma : {0.25, 0.5}) {
    const double plain = error_at(DeviationInputs::outliers, sigma, Fp8Variant::plain).rmse;
    const double rotated = error_at(DeviationInputs::outliers, sigma, Fp8Variant::rotated).rmse;
    EXPECT_LT(rotated, plain) << sigma;
    if (sigma == 0.5) {
      EXPECT_LT(1.3 * rotated, plain);
    }
    std::printf("outliers, sigma %g: plain / rotated RMSE %.3f\n", sigma, plain / rotated);
    const double plain_normal = error_at(DeviationInputs::normal, sigma, Fp8Variant::plain).rmse;
    const double rotated_normal = error_at(DeviationInputs::normal, sigma, Fp8Variant::rotated).rmse;
    EXPECT_NEAR(rotated_normal / plain_normal, 1.0, 0.1) << sigma;  // the twin: nothing to spread
  }
}

TEST(Fp8Spread, LazyRescalingSaturatesAndTheOthersNever) {
  for (const Fp8SpreadPoint& point : small_study().points) {
    for (const Fp8Variant variant : {Fp8Variant::plain, Fp8Variant::block, Fp8Variant::rotated})
      EXPECT_EQ(point.errors[static_cast<int>(variant)].saturated, 0.0);
  }
  ASSERT_EQ(small_study().first_saturation.size(), 2u);
  for (const auto& sigma : small_study().first_saturation) {
    ASSERT_TRUE(sigma);
    EXPECT_LE(*sigma, 1.0);
  }
  // The saturation point (lazy RMSE twice the plain one) on normal inputs: near FlashAttention 4's
  // 0.8 in log2 units, i.e. 0.56 natural; the grid here has 0.5 and 1.
  const auto& point = small_study().saturation_point[0];
  ASSERT_TRUE(point);
  EXPECT_GE(*point, 0.5);
  EXPECT_LE(*point, 1.0);
  for (const double sigma : {1.0, 2.0, 4.0}) {
    EXPECT_GT(error_at(DeviationInputs::normal, sigma, Fp8Variant::lazy).rmse,
              2 * error_at(DeviationInputs::normal, sigma, Fp8Variant::plain).rmse)
        << sigma;
  }
}

TEST(Fp8Spread, DeterministicFromItsSeedWhateverTheThreads) {
  Fp8SpreadSettings settings;
  settings.keys = 128;
  settings.query_rows = 4;
  settings.sigmas = {1};
  settings.threads = 1;
  const Fp8SpreadStudy one = run_fp8_spread_study(settings);
  settings.threads = 2;
  const Fp8SpreadStudy two = run_fp8_spread_study(settings);
  ASSERT_EQ(one.points.size(), two.points.size());
  for (std::size_t p = 0; p < one.points.size(); ++p) {
    for (int v = 0; v < 4; ++v) EXPECT_EQ(one.points[p].errors[v].rmse, two.points[p].errors[v].rmse);
  }
  settings.head_dim = 96;
  EXPECT_THROW((void)run_fp8_spread_study(settings), InputError);
  settings.head_dim = 64;
  settings.sigmas = {0};
  EXPECT_THROW((void)run_fp8_spread_study(settings), InputError);
}

}  // namespace
}  // namespace sharpcheck::studies
