// The backward references against the independent 320-bit backend (tests/support), in every
// format: random rows, temperatures of both signs, masked entries, extreme spreads; the exact
// cases (zeros and rationals) and their count; bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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
