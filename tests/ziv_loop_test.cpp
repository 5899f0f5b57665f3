// The one Ziv driver (reference/ziv_loop.hpp): the precisions it tries, how it counts, and that it
// refuses (UndecidedRounding naming what is left) past the cap instead of returning a guess.
#include "reference/ziv_loop.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace sharpcheck::reference {
namespace {

TEST(ZivLoop, TriesDoublingPrecisionsFromTheGuardedStartAndCountsEveryPassAfterTheFirst) {
  const ZivSchedule schedule = ZivSchedule::for_format(fp32);
  std::vector<mpfr_prec_t> tried;
  ZivStatistics statistics;
  bool asked = false;
  run_ziv_passes(
      schedule, 10, &statistics,
      [&](mpfr_prec_t precision) {
        tried.push_back(precision);
        return tried.size() == 3;
      },
      [&] {
        asked = true;
        return std::string("never");
      });
  const mpfr_prec_t first = schedule.initial + 10;
  EXPECT_EQ(tried, (std::vector<mpfr_prec_t>{first, 2 * first, 4 * first}));
  EXPECT_EQ(statistics.escalations, 2);
  EXPECT_EQ(statistics.highest_precision, 4 * first);
  EXPECT_FALSE(asked) << "what is undecided is asked only when the loop gives up";
}

TEST(ZivLoop, AFirstPassThatDecidesEverythingIsNoEscalation) {
  ZivStatistics statistics;
  run_ziv_passes(
      ZivSchedule::for_format(bf16), 0, &statistics, [](mpfr_prec_t) { return true; },
      [] { return std::string(); });
  EXPECT_EQ(statistics.escalations, 0);
  EXPECT_EQ(statistics.highest_precision, ZivSchedule::for_format(bf16).initial);
}

TEST(ZivLoop, RefusesPastTheCapNamingWhatIsLeftAfterTryingEveryPrecisionUpToIt) {
  const ZivSchedule schedule = ZivSchedule::for_format(fp64);
  std::vector<mpfr_prec_t> tried;
  ZivStatistics statistics;
  try {
    run_ziv_passes(
        schedule, 0, &statistics,
        [&](mpfr_prec_t precision) {
          tried.push_back(precision);
          return false;
        },
        [] { return std::string("element 7"); });
    FAIL() << "an undecidable loop returned";
  } catch (const UndecidedRounding& error) {
    EXPECT_EQ(std::string(error.what()), "element 7 undecided at " + std::to_string(schedule.cap) + " bits");
  }
  ASSERT_FALSE(tried.empty());
  EXPECT_LE(tried.back(), schedule.cap);
  EXPECT_GT(ZivSchedule::next(tried.back()), schedule.cap);
  EXPECT_EQ(statistics.escalations, static_cast<long>(tried.size()) - 1);
}

}  // namespace
}  // namespace sharpcheck::reference
