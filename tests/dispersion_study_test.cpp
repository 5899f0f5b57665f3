// The dispersion study's own numbers carry the claims: softmax's spike weight stays under
// Lemma 2.1 and falls as O(1/n); SSMax with s delta >= 1 stays above 1/2 at every n; the
// checks fail when handed the wrong operator's numbers; results do not depend on threads.
#include "studies/dispersion_study.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "bounds/bounds.hpp"
#include "core/errors.hpp"
#include "reference/attention_escapes.hpp"

namespace sharpcheck::studies {
namespace {

using Series = std::vector<const DispersionPoint*>;

// Every spike weight at or under Lemma 2.1's bound exp(delta)/n (rounded up), and falling with n
// until it underflows.
::testing::AssertionResult stays_under_lemma_2_1(const Series& series) {
  for (std::size_t i = 0; i < series.size(); ++i) {
    const auto& point = *series[i];
    const double bound = bounds::lemma_2_1(static_cast<double>(point.n), point.delta, 1.0).upper;
    if (!(point.spike_weight[0] <= bound)) {
      return ::testing::AssertionFailure()
             << escape_name(point.escape) << " delta " << point.delta << " n " << point.n << ": "
             << point.spike_weight[0] << " > Lemma 2.1's " << bound;
    }
    const bool underflowed = point.spike_weight[0] == 0;  // below fp64's range: no longer falls
    if (i > 0 && !underflowed && !(point.spike_weight[0] < series[i - 1]->spike_weight[0])) {
      return ::testing::AssertionFailure() << escape_name(point.escape) << " does not fall at n " << point.n;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult stays_at_least(const Series& series, double constant) {
  for (const auto* point : series) {
    if (!(point->spike_weight[0] >= constant)) {
      return ::testing::AssertionFailure() << escape_name(point->escape) << " delta " << point->delta << " n "
                                           << point->n << ": " << point->spike_weight[0] << " < " << constant;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(DispersionStudy, TheDefaultStudysNumbersShowDispersionAndItsEscapes) {
  const DispersionStudy study = run_dispersion_study({});
  ASSERT_EQ(study.settings.sizes.back(), std::uint64_t{1} << 20);
  for (const double delta : study.settings.spreads) {
    SCOPED_TRACE("delta " + std::to_string(delta));
    // Softmax disperses: under Lemma 2.1 at every n, falling.
    EXPECT_TRUE(stays_under_lemma_2_1(series_of(study, Escape::softmax, delta)));
    // SSMax with s delta >= 1: n^(s delta) >= n > n - 1 keeps the spike above 1/2 at every n.
    ASSERT_GE(study.settings.ssmax_s * delta, 1.0);
    EXPECT_TRUE(stays_at_least(series_of(study, Escape::scalable_softmax, delta), 0.5));
    // Mutation check: each claim fails on the other operator's numbers.
    EXPECT_FALSE(stays_under_lemma_2_1(series_of(study, Escape::scalable_softmax, delta)));
    if (delta < 10) {  // at 14.78 softmax's spike stays above 1/2 to n = 2^20
      EXPECT_FALSE(stays_at_least(series_of(study, Escape::softmax, delta), 0.5));
    }
    // Sigmoid with b = -ln n disperses too (sigma(delta - ln n) <= e^delta / n); the nearest key
    // of stick-breaking keeps sigma(delta) at every n; the farthest falls as 2^-(n - 1).
    EXPECT_TRUE(stays_under_lemma_2_1(series_of(study, Escape::sigmoid, delta)));
    const Series nearest = series_of(study, Escape::stick_breaking_nearest, delta);
    for (const auto* point : nearest) EXPECT_EQ(point->spike_weight[0], nearest.front()->spike_weight[0]);
    EXPECT_TRUE(stays_under_lemma_2_1(series_of(study, Escape::stick_breaking_farthest, delta)));
    // The summary's softmax crossing agrees with the bound's exact threshold.
    const std::uint64_t exact = bounds::smallest_n_below(delta, 1.0, 0.5);
    const auto crossing = first_size_below(study, Escape::softmax, delta, 0.5);
    if (exact <= study.settings.sizes.back()) {
      ASSERT_TRUE(crossing.has_value());
      EXPECT_EQ(*crossing, std::max<std::uint64_t>(16, std::bit_ceil(exact)));
    } else {
      EXPECT_FALSE(crossing.has_value());
    }
    // Adaptive temperature: the entropy grows with n and the correction is off beyond the
    // switch-off integer.
    const SwitchOff off = adaptive_switch_off(delta);
    EXPECT_TRUE(off.separated);
    double previous = -1;
    for (const auto& point : study.entropies) {
      if (point.delta != delta) continue;
      EXPECT_GT(point.entropy, previous);
      previous = point.entropy;
      if (point.n >= off.first_uncorrected) {
        EXPECT_FALSE(point.corrected) << point.n;
      } else if (point.entropy > 1.0) {  // above the lower root of poly(H) = 1 (about 0.85)
        EXPECT_TRUE(point.corrected) << point.n;
      }
    }
  }
  // Rounding into a narrower format never moves a weight across a representable threshold the
  // wrong way: each column is within one of its ulps of the fp64 value.
  for (const auto& point : study.points) {
    if (std::isnan(point.spike_weight[0])) continue;  // a matrix-level escape past its size limit
    for (std::size_t f = 1; f < study_format_count; ++f) {
      const auto& format = *study_formats[f];
      const double rounded = round_to_format(point.spike_weight[0], format);
      EXPECT_LE(ulp_distance(point.spike_weight[f], rounded, format), 1u)
          << escape_name(point.escape) << " " << format.name << " n " << point.n;
    }
  }
}

// Issue 19's escapes, from the study's own numbers: linear attention's spike is (delta + 1) /
// (delta + n) (normalised feature sums disperse as 1/n); Differential attention disperses like
// softmax, lying exactly lambda / n below it (the second map is uniform here); selective attention
// with every distractor selected stays above its limit e^delta / (e^delta + 1 + 1 / (1 - e^-s)) at
// every n, and the weak selection falls like softmax until n ~ 1 / s, then stops. The selective
// numbers are the matrix reference's last row.
TEST(DispersionStudy, LinearAndDifferentialDisperseSelectiveEscapes) {
  DispersionSettings settings;
  settings.sizes = {16, 32, 64, 1024, 16384, 65536};
  const DispersionStudy study = run_dispersion_study(settings);
  EXPECT_NEAR(settings.differential_lambda, reference::differential_lambda_init(12), 1e-15);
  for (const double delta : settings.spreads) {
    SCOPED_TRACE("delta " + std::to_string(delta));
    const Series linear = series_of(study, Escape::linear, delta),
                 soft = series_of(study, Escape::softmax, delta),
                 differential = series_of(study, Escape::differential, delta);
    for (std::size_t i = 0; i < linear.size(); ++i) {
      const double n = static_cast<double>(linear[i]->n);
      if (linear[i]->n > settings.matrix_size_limit) {
        EXPECT_TRUE(std::isnan(linear[i]->spike_weight[0]));
        EXPECT_TRUE(std::isnan(differential[i]->spike_weight[0]));
        continue;
      }
      EXPECT_NEAR(linear[i]->spike_weight[0], (delta + 1) / (delta + n), 1e-15);
      EXPECT_NEAR(differential[i]->spike_weight[0],
                  soft[i]->spike_weight[0] - settings.differential_lambda / n, 1e-15);
      EXPECT_LE(differential[i]->spike_weight[0], bounds::lemma_2_1(n, delta, 1.0).upper);
    }
    const double e = std::exp(delta);
    const auto limit = [&](double s) { return e / (e + 1 + 1 / (1 - std::exp(-s))); };
    EXPECT_TRUE(stays_at_least(series_of(study, Escape::selective, delta), limit(settings.selection)));
    EXPECT_TRUE(
        stays_at_least(series_of(study, Escape::selective_weak, delta), limit(settings.weak_selection)));
    // Mutation check: softmax's own numbers do not stay above the strong selection's limit.
    if (delta < 10) {
      EXPECT_FALSE(stays_at_least(soft, limit(settings.selection)));
    }
  }
  // The selective row is the matrix reference's: token k selects every distractor 1 <= j < k.
  for (const std::uint64_t n : {16u, 32u}) {
    Matrix logits(n, n, 0.0), selection(n, n, 0.0);
    logits(n - 1, 0) = settings.spreads[1];
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t j = 1; j < k; ++j) selection(k, j) = settings.selection;
    }
    const double last_row = reference::selective_attention_weights(logits, selection, fp64)(n - 1, 0);
    for (const auto* point : series_of(study, Escape::selective, settings.spreads[1])) {
      if (point->n == n) {
        EXPECT_EQ(point->spike_weight[0], last_row) << n;
      }
    }
  }
}

TEST(DispersionStudy, ResultsDoNotDependOnTheThreadCount) {
  DispersionSettings settings;
  settings.sizes = {16, 100, 1024, 4096};
  settings.threads = 1;
  const auto one = run_dispersion_study(settings);
  settings.threads = 3;
  const auto three = run_dispersion_study(settings);
  ASSERT_EQ(one.points.size(), three.points.size());
  for (std::size_t i = 0; i < one.points.size(); ++i) {
    for (std::size_t f = 0; f < study_format_count; ++f) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(one.points[i].spike_weight[f]),
                std::bit_cast<std::uint64_t>(three.points[i].spike_weight[f]));
    }
  }
}

TEST(DispersionStudy, BadSettingsAreInputErrors) {
  DispersionSettings settings;
  settings.spreads = {-1.0};
  EXPECT_THROW((void)run_dispersion_study(settings), InputError);
  settings.spreads = {1.0};
  settings.sizes = {0};
  EXPECT_THROW((void)run_dispersion_study(settings), InputError);
}

}  // namespace
}  // namespace sharpcheck::studies

namespace sharpcheck::studies {
namespace {

// The switch-off exists for every spread: integers up to 2^62, its logarithm beyond (delta 45 once
// overflowed a uint64 and exited with an internal error; delta past about 11,356 overflows e^delta).
TEST(DispersionStudy, AdaptiveSwitchOffIsFoundForEverySpread) {
  const double root = bounds::adaptive_active_interval().upper_root.upper;
  const SwitchOff small = adaptive_switch_off(10);
  ASSERT_TRUE(small.integers);
  EXPECT_TRUE(small.separated);
  // The real crossing lies between the two integers.
  EXPECT_LE(std::log(static_cast<long double>(small.last_corrected - 1)), small.log_switch_off + 1e-12L);
  EXPECT_GE(std::log(static_cast<long double>(small.first_uncorrected - 1)), small.log_switch_off - 1e-12L);
  long double previous = small.log_switch_off;
  // At delta 40 the integers are found but no longer separated (consecutive entropies differ by
  // about delta e^-delta, below the 1e-12 the flag asks for); past 2^62 only the logarithm is given.
  const SwitchOff forty = adaptive_switch_off(40);
  EXPECT_TRUE(forty.integers);
  EXPECT_FALSE(forty.separated);
  for (const double delta : {45.0, 100.0, 510.0, 2e4, 1e300}) {
    const SwitchOff off = adaptive_switch_off(delta);
    EXPECT_FALSE(off.integers) << delta;
    ASSERT_TRUE(std::isfinite(off.log_switch_off)) << delta;
    // ln x* = log_switch_off - delta lies in [ln(root / (delta + 1)), root] (H <= (delta + 1) x, H >= ln(1 +
    // x)).
    const long double log_x = off.log_switch_off - static_cast<long double>(delta);
    EXPECT_GE(log_x, std::log(root / (static_cast<long double>(delta) + 1)) - 1e-9L) << delta;
    EXPECT_LE(log_x, static_cast<long double>(root)) << delta;
    EXPECT_GT(off.log_switch_off, previous) << delta;
    previous = off.log_switch_off;
  }
}

}  // namespace
}  // namespace sharpcheck::studies
