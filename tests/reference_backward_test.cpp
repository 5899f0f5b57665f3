// The backward references against the independent 320-bit backend (tests/support), in every
// format: random rows, temperatures of both signs, masked entries, extreme spreads; the exact
// cases (zeros and rationals) and their count; bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "reference/softmax_backward.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck::reference {
namespace {

using testing::Exact;

// y (dy - <dy, y>) / theta or (dy - y sum dy) / theta at 320 bits over the unmasked entries.
std::vector<Exact> independent_backward(const std::vector<double>& logits, const std::vector<double>& dy,
                                        double theta, bool log) {
  std::vector<double> active;
  for (const double e : logits) {
    if (e != -INFINITY) active.push_back(e);
  }
  const auto y_active = testing::independent_softmax(active, theta);
  std::vector<Exact> y(logits.size(), Exact(0));
  for (std::size_t j = 0, a = 0; j < logits.size(); ++j) {
    if (logits[j] != -INFINITY) y[j] = y_active[a++];
  }
  Exact total = 0;
  for (std::size_t j = 0; j < logits.size(); ++j) total += logits[j] == -INFINITY ? Exact(0) : Exact(dy[j]);
  // dy_j - <dy, y> as sum_i y_i (dy_j - dy_i): the differences of doubles are exact at 320 bits, so
  // no cancellation of dy_j against a dot product that agrees with it to hundreds of bits.
  std::vector<Exact> result(logits.size(), Exact(0));
  for (std::size_t j = 0; j < logits.size(); ++j) {
    if (logits[j] == -INFINITY) continue;
    Exact centred = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] != -INFINITY) centred += y[i] * (Exact(dy[j]) - Exact(dy[i]));
    }
    result[j] = (log ? Exact(dy[j]) - y[j] * total : y[j] * centred) / Exact(theta);
  }
  return result;
}

std::string row_text(const std::vector<double>& logits, const std::vector<double>& dy) {
  std::string text;
  for (std::size_t j = 0; j < logits.size(); ++j) text += hex_float(logits[j]) + "/" + hex_float(dy[j]) + " ";
  return text;
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(EveryFormat, BackwardIsCorrectlyRoundedAgainstTheIndependentBackend) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(17);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = 1 + random.below(40);
    std::vector<double> logits(n), dy(n);
    const double spread = trial < 30 ? 4.0 : 300.0;  // the last rows span far beyond double's exp range
    for (std::size_t j = 0; j < n; ++j) {
      logits[j] = spread * (2 * random.uniform() - 1);
      dy[j] = 2 * random.uniform() - 1;
    }
    if (trial % 5 == 4 && n > 1) logits[n / 2] = -INFINITY;  // a masked entry
    const double theta = trial % 3 == 0 ? 1.0 : (trial % 3 == 1 ? 0.375 : -2.5);
    RowOptions options;
    options.theta = theta;
    for (const bool log : {false, true}) {
      const auto ours = log ? log_softmax_backward(logits, dy, format, options)
                            : softmax_backward(logits, dy, format, options);
      const auto exact = independent_backward(logits, dy, theta, log);
      for (std::size_t j = 0; j < n; ++j) {
        EXPECT_TRUE(testing::is_nearest_in_format(ours[j], exact[j], format))
            << (log ? "log_" : "") << "softmax_backward, trial " << trial << ", j " << j << ", row "
            << row_text(logits, dy);
      }
    }
  }
}

const auto format_name = [](const auto& param_info) { return std::string(param_info.param->name); };
INSTANTIATE_TEST_SUITE_P(Reference, EveryFormat, ::testing::ValuesIn(all_float_formats), format_name);

using Row = std::vector<double>;

TEST(BackwardExactCases, ZerosAndRationalsAreExactAndCounted) {
  ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  const std::vector<double> logits{0.5, -1.0, 2.0};
  EXPECT_EQ(softmax_backward(logits, Row{0.25, 0.25, 0.25}, fp32, options), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(statistics.exact_cases, 3);
  // One distinct logit: (k dy_j - sum dy) / (k^2 theta) with k = 3, theta = 1.
  EXPECT_EQ(softmax_backward(Row{1.0, 1.0, 1.0}, Row{1.0, 2.0, 4.0}, fp64),
            (std::vector<double>{-4.0 / 9, -1.0 / 9, 5.0 / 9}));
  // log_softmax_backward with sum dy = 0 is dy / theta.
  options.theta = 2.0;
  EXPECT_EQ(log_softmax_backward(logits, Row{0.5, -0.25, -0.25}, fp32, options),
            (std::vector<double>{0.25, -0.125, -0.125}));
}

// A result that rounds to a zero carries the exact result's sign, also where the terms of
// dy_j - D (or dy_j - y_j D) cancel far below any precision the first passes use. The signs come
// from closed forms, independent of the reference:
// - log-softmax, logits (0, -g), dy (1, t): result_0 = (e^-g - t) / (1 + e^-g), result_1 its negative;
// - softmax, two logits: result_j = y_0 y_1 (dy_j - dy_other) / theta;
// - softmax, logits (0, -900, -900 - s), dy (0, 1, -2): result_0 = y_0 (2 y_2 - y_1), the sign of
//   2 e^-s - 1 (positive for s = 0.5, negative for s = 0.8: two tail terms of opposite signs),
//   result_1 = y_1 (y_0 + 3 y_2) > 0 and result_2 = -y_2 (2 y_0 + 3 y_1) < 0;
//   theta = -1 with the logits negated has the same z and the opposite sign.
// With the straddling enclosure taken as +0 (the old rule), the negative ones fail.
TEST(BackwardZeroSigns, AZeroResultHasTheSignOfTheExactResult) {
  struct Case {
    const char* what;
    bool log;
    Row logits, dy;
    double theta;
    std::vector<int> signs;  // of the exact results
  };
  const Case cases[] = {
      {"log-softmax, e^-700 < 2^-1000", true, {0, -700}, {1, 0x1p-1000}, 1, {-1, 1}},
      {"log-softmax, e^-700 > 2^-1020", true, {0, -700}, {1, 0x1p-1020}, 1, {1, -1}},
      {"softmax, a gap of 1e6", false, {0, 1e6}, {0.3, 0.11}, 1, {1, -1}},
      {"softmax, a gap of 1e6, theta -1", false, {0, 1e6}, {0.3, 0.11}, -1, {-1, 1}},
      {"softmax, tail terms of both signs, s = 0.5", false, {0, -900, -900.5}, {0, 1, -2}, 1, {1, 1, -1}},
      {"softmax, tail terms of both signs, s = 0.8", false, {0, -900, -900.8}, {0, 1, -2}, 1, {-1, 1, -1}},
      {"softmax, theta -1", false, {0, 900, 900.8}, {0, 1, -2}, -1, {1, -1, 1}},
  };
  for (const FloatFormat* format : {&fp32, &bf16, &fp8_e4m3, &fp8_e5m2}) {
    for (const Case& c : cases) {
      RowOptions options;
      options.theta = c.theta;
      const auto ours = c.log ? log_softmax_backward(c.logits, c.dy, *format, options)
                              : softmax_backward(c.logits, c.dy, *format, options);
      for (std::size_t j = 0; j < ours.size(); ++j) {
        EXPECT_EQ(ours[j], 0.0) << c.what << ", " << format->name << ", j " << j;
        EXPECT_EQ(std::signbit(ours[j]), c.signs[j] < 0)
            << c.what << ", " << format->name << ", j " << j << ": " << hex_float(ours[j]);
      }
    }
  }
}

// The fp8 outputs on the extreme-input families: e4m3 (overflow is NaN, no infinity) and e5m2
// (IEEE: overflow is infinity), with tiny temperatures (1e-17, 2^-60, -1e-17: one-hot rows whose
// gradients are exponentially small or beyond every format), logits of +-1e30 and beyond double's
// exp range, and dy at the format's largest values; each result against the independent backend,
// an exact value past the overflow threshold (half an ulp above the largest finite value) against
// the format's overflow value. Nothing may be refused.
::testing::AssertionResult is_rounded_with_overflow(double rounded, const Exact& exact,
                                                    const FloatFormat& format) {
  const double largest = format.max_finite;
  const Exact threshold = Exact(largest) + (Exact(largest) - Exact(next_down(largest, format))) / 2;
  if (abs(exact) <= threshold) return testing::is_nearest_in_format(rounded, exact, format);
  const bool overflowed =
      format.has_infinity() ? std::isinf(rounded) && (rounded > 0) == (exact > 0) : std::isnan(rounded);
  if (overflowed) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << hex_float(rounded) << " for " << exact.str(20) << ", past "
                                       << format.name << "'s overflow threshold";
}

// Where the exact value is a rounding boundary at 320 bits, the true value lies beyond it by an
// exponentially small tail (e^-1e30 is below the backend's range): it must round toward the tail.
// The tail's side, derived here from the formula: log_softmax_backward_j = (dy_j - y_j D) / theta
// with y_j just below 1/k for the top group (largest logit / theta) and just above 0 elsewhere.
int tail_side(const std::vector<double>& logits, const std::vector<double>& dy, double theta, std::size_t j) {
  Exact total = 0;
  double top = logits[0];  // by the logits: e / theta in double may tie or overflow
  for (std::size_t i = 0; i < logits.size(); ++i) {
    total += Exact(dy[i]);
    top = theta > 0 ? std::max(top, logits[i]) : std::min(top, logits[i]);
  }
  const int d_sign = total > 0 ? 1 : (total < 0 ? -1 : 0);
  return (logits[j] == top ? 1 : -1) * d_sign * (theta > 0 ? 1 : -1);
}

int ties_seen = 0;  // boundaries met: the side check below must not be vacuous

::testing::AssertionResult is_rounded_toward_the_tail(double rounded, const Exact& exact,
                                                      const FloatFormat& format, int side) {
  const ::testing::AssertionResult plain = is_rounded_with_overflow(rounded, exact, format);
  if (plain || side == 0) return plain;
  for (const double other : {next_up(rounded, format), next_down(rounded, format)}) {
    if (std::isfinite(other) && abs(exact - Exact(other)) == abs(exact - Exact(rounded))) {  // a tie
      ++ties_seen;
      return (side > 0) == (rounded > other)
                 ? ::testing::AssertionSuccess()
                 : ::testing::AssertionFailure() << "a tie rounded against its tail";
    }
  }
  return plain;
}

class Fp8Extremes : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(Fp8Extremes, BackwardOnTinyTemperaturesHugeLogitsAndHugeGradients) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(23);
  const double huge_dy = format.max_finite;
  struct Family {
    const char* name;
    double theta, logit_scale, dy_scale;
  };
  const Family families[] = {{"theta 1e-17", 1e-17, 1, 1},
                             {"theta 2^-60", 0x1p-60, 1, 1},
                             {"theta -1e-17", -1e-17, 1, 1},
                             {"logits 1e30", 1, 1e30, 1},
                             {"logits 1e300, theta 0.5", 0.5, 1e300, 1},
                             {"dy at the format's top", 1, 3, huge_dy},
                             {"dy at the top, theta 2^-20", 0x1p-20, 1, huge_dy}};
  for (const Family& family : families) {
    for (int trial = 0; trial < 6; ++trial) {
      const std::size_t n = 2 + random.below(12);
      std::vector<double> logits(n), dy(n);
      for (std::size_t j = 0; j < n; ++j) {
        logits[j] = family.logit_scale * round_to_format(random.normal(0, 1), bf16);
        dy[j] = round_to_format(family.dy_scale * (2 * random.uniform() - 1), format);
      }
      if (trial == 5) logits[n - 1] = logits[0];  // a tie at the top
      RowOptions options;
      options.theta = family.theta;
      for (const bool log : {false, true}) {
        std::vector<double> ours;
        try {
          ours = log ? log_softmax_backward(logits, dy, format, options)
                     : softmax_backward(logits, dy, format, options);
        } catch (const UndecidedRounding& refused) {
          ADD_FAILURE() << refused.what() << ": " << family.name << ", trial " << trial << ", row "
                        << row_text(logits, dy);
          continue;
        }
        const auto exact = independent_backward(logits, dy, family.theta, log);
        for (std::size_t j = 0; j < n; ++j) {
          EXPECT_TRUE(is_rounded_toward_the_tail(ours[j], exact[j], format,
                                                 log ? tail_side(logits, dy, family.theta, j) : 0))
              << (log ? "log_" : "") << "softmax_backward, " << family.name << ", trial " << trial << ", j "
              << j << ", row " << row_text(logits, dy);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, Fp8Extremes, ::testing::Values(&fp8_e4m3, &fp8_e5m2), format_name);

// Rows where double arithmetic misleads the tail decision, from a review: quotients e / theta that
// overflow (1e308 and 1.5e308 at theta 0.5) or round to one double (a and its successor over 1.5)
// although the logits differ, and a logit difference that overflows double while the gap in z is
// about 3 (theta near 1.1e308): the first must find the true top group, the last must not be
// decided by a tail that is not small. Against the independent backend, ties against the tail.
TEST(Fp8TailDecisions, TopGroupsAndGapsWhereDoubleArithmeticMisleads) {
  const double a = 0x1.e666666666667p+100, b = std::nextafter(a, INFINITY);
  struct Case {
    std::vector<double> logits, dy;
    double theta;
  };
  const Case rows[] = {{{1e308, 1.5e308, 1.5e308}, {0.25, 1.5, 0.125}, 0.5},
                       {{-1e308, -1.5e308, -1.5e308}, {0.25, 1.5, 0.125}, -0.5},
                       {{a, b, b}, {0.125, 3.5, 0}, 1.5},
                       {{1.5e308, -1.5e308}, {0x1.a6407c0ecb479p+1023, 0}, 0x1.1ccf385eee014p+1023}};
  for (const Case& row : rows) {
    RowOptions options;
    options.theta = row.theta;
    const auto ours = log_softmax_backward(row.logits, row.dy, fp8_e5m2, options);
    const auto exact = independent_backward(row.logits, row.dy, row.theta, true);
    for (std::size_t j = 0; j < row.logits.size(); ++j) {
      EXPECT_TRUE(is_rounded_toward_the_tail(ours[j], exact[j], fp8_e5m2,
                                             tail_side(row.logits, row.dy, row.theta, j)))
          << "theta " << row.theta << " j " << j << " row " << row_text(row.logits, row.dy);
    }
  }
}

// A one-hot row whose top entry's rational part is a midpoint (-0.65625 in e4m3, -0.6875 in e5m2):
// the side check is exercised (a counter, so the families' check cannot pass vacuously).
TEST(Fp8TailDecisions, AMidpointIsMetAndRoundedTowardItsTail) {
  const int before = ties_seen;
  const std::pair<const FloatFormat*, double> formats[] = {{&fp8_e4m3, 0.15625}, {&fp8_e5m2, 0.1875}};
  for (const auto& [format, last] : formats) {
    const std::vector<double> logits = {0, 1e30, 2}, dy = {0.5, 0.5, last};  // top: r = 0.5 - D
    const auto ours = log_softmax_backward(logits, dy, *format, RowOptions{});
    const auto exact = independent_backward(logits, dy, 1.0, true);
    for (std::size_t j = 0; j < 3; ++j)
      EXPECT_TRUE(is_rounded_toward_the_tail(ours[j], exact[j], *format, tail_side(logits, dy, 1.0, j))) << j;
  }
  EXPECT_GT(ties_seen, before);
}

// softmax_backward where a top group G of two equal logits lies 1e6 above a third: for j in G the
// result is r = (dy_j - m_G) / (2 theta) plus a tail of size e^-1e6 (beyond any precision the loop
// tries) whose sign, from the header's expansion X = 2 (c_h - 2 delta) w_h - delta w_h^2, is
// sign(dy_other_in_G - dy_2) sign(theta). dy = (4 + 2^-6, 0, c) puts r on bf16's midpoint
// +-(1 + 2^-8), so the tail alone picks the neighbour; the third result is e^-1e6 (c - D) / theta,
// a zero of that sign. Each row refused ("rounding undecided at 131072 bits") before the tail rule.
TEST(Fp8TailDecisions, ASoftmaxGradientOnAMidpointRoundsTowardItsTail) {
  const double a = 4 + 0x1p-6, up = 1 + 0x1p-7;
  struct Case {
    double theta, c;
    std::vector<double> expected;
  };
  const Case cases[] = {
      {1, -1, {up, -1, -0.0}}, {1, 1, {1, -1, -0.0}}, {-1, -1, {-up, 1, 0.0}}, {-1, 1, {-1, 1, 0.0}}};
  for (const Case& c : cases) {
    RowOptions options;
    options.theta = c.theta;
    const Row logits = {0, 0, -1e6 * c.theta};
    std::vector<double> got;
    ASSERT_NO_THROW(got = softmax_backward(logits, Row{a, 0, c.c}, bf16, options)) << c.theta << " " << c.c;
    for (std::size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(got[j], c.expected[j]) << "theta " << c.theta << " c " << c.c << " j " << j;
      EXPECT_EQ(std::signbit(got[j]), std::signbit(c.expected[j])) << "theta " << c.theta << " c " << c.c;
    }
  }
}

// Cases an independent audit (mpmath, its own rounding) found refused or signed wrong, with its
// values: a tail past MPFR's exponent range (e^-1e30: the enclosure's upper end underflows to -0,
// which read as "not below 0" gave +0); a rational part on the overflow threshold (e4m3's 464,
// where the tail decides between 448 and NaN); an fp64 subnormal midpoint (a quarter of 2^-1074
// underflowed double, so log(0) decided nothing).
TEST(Fp8TailDecisions, TheAuditsBoundaryCasesAreDecided) {
  struct Case {
    const char* what;
    bool log;
    Row dy, logits;
    double theta;
    const FloatFormat* format;
    std::vector<double> expected;
  };
  const double tiny = 0x0.0093445b87315p-1022;
  const Case cases[] = {
      {"a tail of e^-1e30", false, {1, 0}, {0, -1e30}, 1, &fp64, {0.0, -0.0}},
      {"a tail of e^-1e30, log", true, {1, 0}, {0, -1e30}, 1, &fp64, {0.0, -0.0}},
      {"the overflow threshold, log", true, {1, 464}, {0, -1e5}, 1, &fp8_e4m3, {-448, 448}},
      {"the overflow threshold", false, {1856, 0, 1}, {0, 0, -1e5}, 1, &fp8_e4m3, {448, -448, -0.0}},
      // A review's first form of the tail's sign summed T and sum_h w_h before combining them: the
      // group at -1e6, whose coefficient is exactly 0, cancelled against itself and hid the one at
      // -1e30 for good ("the side of a tail undecided"). Each result is e^-gap times a sign.
      {"a zero coefficient among the tail's groups",
       false,
       {1.0, 0.5, 1.0, 1.01171875},
       {0, -1e30, -1e6, -1e300},
       1,
       &bf16,
       {0.0, -0.0, 0.0, 0.0}},
      {"fp64 subnormal midpoints",
       true,
       {1e-310, 0x1p-1074, 0x1p-1022},
       {2e30, 2e30, 0},
       -2,
       &fp64,
       {-tiny, -0.0, std::nextafter(tiny, 1.0)}},
  };
  for (const Case& c : cases) {
    RowOptions options;
    options.theta = c.theta;
    std::vector<double> got;
    ASSERT_NO_THROW(got = c.log ? log_softmax_backward(c.logits, c.dy, *c.format, options)
                                : softmax_backward(c.logits, c.dy, *c.format, options))
        << c.what;
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j], c.expected[j]) << c.what << " j " << j << ": " << hex_float(got[j]);
      EXPECT_EQ(std::signbit(got[j]), std::signbit(c.expected[j])) << c.what << " j " << j;
    }
  }
}

TEST(BackwardBadInput, EachProblemIsNamed) {
  EXPECT_THROW((void)softmax_backward(Row{1.0, 2.0}, Row{1.0}, fp32), InputError);
  EXPECT_THROW((void)softmax_backward(Row{1.0, 2.0}, Row{1.0, NAN}, fp32), InputError);
  EXPECT_THROW((void)log_softmax_backward(Row{1.0, NAN}, Row{1.0, 1.0}, fp32), InputError);
  RowOptions zero;
  zero.theta = 0;
  EXPECT_THROW((void)softmax_backward(Row{1.0}, Row{1.0}, fp32, zero), InputError);
  // dy of a masked entry is not read, even when it is NaN.
  EXPECT_EQ(softmax_backward(Row{1.0, -INFINITY}, Row{1.0, NAN}, fp32), (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace sharpcheck::reference
