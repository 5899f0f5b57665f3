// The staged reference (Arb balls, then MPFR's Ziv loop) against the MPFR loop alone, and inputs
// built to sit next to a rounding boundary, which must force escalation and still round right.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "reference/softmax.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck {
namespace {

using reference::RowOptions;

// 10^6 random elements per format: 1,000 rows of 1,000 logits, N(0, 3^2) and N(0, 12^2) mixed.
TEST(Stages, BallsThenMpfrEqualMpfrAloneOnAMillionElementsPerFormat) {
  for (const FloatFormat* format : all_float_formats) {
    DeterministicRandom random(format->precision());
    reference::ZivStatistics staged;
    std::size_t elements = 0;
    for (int row_index = 0; row_index < 1000; ++row_index) {
      std::vector<double> row(1000);
      const double sigma = row_index % 2 == 0 ? 3.0 : 12.0;
      for (double& e : row) e = static_cast<float>(random.normal(0, sigma));
      RowOptions both;
      both.statistics = &staged;
      RowOptions alone;
      alone.mpfr_only = true;
      ASSERT_EQ(reference::softmax(row, *format, both), reference::softmax(row, *format, alone))
          << format->name << " row " << row_index;
      elements += row.size();
    }
    EXPECT_EQ(elements, 1000000u);
    // The fast stage carries the load: it decides all but a handful of the million.
    EXPECT_GT(static_cast<double>(staged.decided_by_balls), 0.9999 * 1e6) << format->name;
  }
}

// 1,023 logits at 0 and one at -2^-70: the sum is 1,024 - 2^-70 (nearly), so each of the 1,023
// coefficients is 2^-10 (1 + 2^-80), a hair above 2^-10, which is exactly half of fp8 e4m3's
// smallest subnormal: a rounding boundary (whose tie would go down, to 0). At 64 bits neither the
// balls nor MPFR can tell the sum from 1,024; at 128 bits MPFR decides: up, to 2^-9. The last
// coefficient, a hair below the boundary, rounds to 0.
TEST(Stages, ARowAHairFromARoundingBoundaryForcesEscalationAndRoundsCorrectly) {
  std::vector<double> row(1024, 0.0);
  row[1023] = -0x1p-70;
  reference::ZivStatistics statistics;
  RowOptions options;
  options.statistics = &statistics;
  const auto probabilities = reference::softmax(row, fp8_e4m3, options);
  EXPECT_GT(statistics.escalations + (statistics.highest_precision > 64 ? 1 : 0), 0);
  EXPECT_GE(statistics.highest_precision, 128);
  EXPECT_LT(statistics.decided_by_balls, 1024);
  const auto exact = testing::independent_softmax(row, 1.0);
  EXPECT_EQ(probabilities[0], std::ldexp(1.0, -9));
  EXPECT_EQ(probabilities[1023], 0.0);
  for (const std::size_t j : {std::size_t{0}, std::size_t{500}, std::size_t{1023}}) {
    EXPECT_TRUE(testing::is_nearest_in_format(probabilities[j], exact[j], fp8_e4m3)) << j;
  }
  // Exactly on the boundary (1,024 equal logits: 2^-10 exactly) the exact branch rounds the tie
  // to the even neighbour, 0.
  row[1023] = 0.0;
  EXPECT_EQ(reference::softmax(row, fp8_e4m3)[0], 0.0);
}

}  // namespace
}  // namespace sharpcheck
