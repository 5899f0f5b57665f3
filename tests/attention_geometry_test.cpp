// The forward judgement's geometry by BLAS products (metrics/attention_geometry.hpp) against the
// row-by-row sums it replaced (inside_rounding.cpp's row_rounding, RowSums::by_rows) on the same
// weights: every spread equal within the products' rounding, and never below it but by the
// outward slack the expanded centred sums carry. Heads of several blocks, masks, windows, sinks,
// soft-caps, biases that zero weights, tied weights, constant values and scores past double's range.
#include "metrics/attention_geometry.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/random.hpp"

namespace sharpcheck::metrics {
namespace {

Matrix normal_matrix(std::size_t rows, std::size_t cols, double sigma, DeterministicRandom& random) {
  Matrix m(rows, cols);
  for (double& x : m.values) x = sigma * random.normal();
  return m;
}

struct Head {
  Matrix q, k, v;
  tensor::HeadScores scores;
  std::vector<double> bias;
};

Head normal_head(std::size_t queries, std::size_t keys, std::size_t d, std::uint64_t seed) {
  DeterministicRandom random(seed);
  Head head{normal_matrix(queries, d, 1.0, random),
            normal_matrix(keys, d, 1.0, random),
            normal_matrix(keys, d, 1.0, random),
            {},
            {}};
  head.scores.queries = queries;
  head.scores.keys = keys;
  head.scores.row_stride = keys;
  return head;
}

// Within the products' rounding of the row-by-row value, and not below it by more than that:
// `scale` is what the expanded sums' slack is relative to (their sqrt(n 2^-52) of the row's size).
void expect_close(double by_products, double by_rows, double scale, const std::string& what) {
  if (by_products == by_rows || (std::isnan(by_products) && std::isnan(by_rows))) return;  // infinities too
  const double slack = 1e-6 * scale + 1e-12 * std::fabs(by_rows);
  EXPECT_LE(std::fabs(by_products - by_rows), slack) << what << ": " << by_products << " against " << by_rows;
  EXPECT_GE(by_products, by_rows - 1e-12 * std::fabs(by_rows) - 1e-300) << what;
}

void expect_same_geometry(const Head& head, double u_s) {
  const HeadGeometry fast = attention_head_geometry(head.q, head.k, head.v, head.scores, u_s);
  const HeadGeometry rows =
      attention_head_geometry(head.q, head.k, head.v, head.scores, u_s, RowSums::by_rows);
  ASSERT_EQ(fast.roundings.size(), head.q.rows);
  for (std::size_t i = 0; i < head.q.rows; ++i) {
    const RowRounding& a = fast.roundings[i];
    const RowRounding& b = rows.roundings[i];
    double size = 0;
    for (std::size_t c = 0; c < head.v.cols; ++c) size = std::max(size, fast.magnitudes(i, c));
    const std::string row = "row " + std::to_string(i);
    for (std::size_t c = 0; c < head.v.cols; ++c) {
      const std::string at = row + " column " + std::to_string(c);
      EXPECT_NEAR(a.exact[c], b.exact[c], 1e-12 * size) << at;
      expect_close(a.p_spread[c], b.p_spread[c], size, at + " P spread");
      expect_close(a.s_spread[c], b.s_spread[c], size * (1 + fast.scales[i].largest_score),
                   at + " score spread");
      expect_close(a.s_second[c], b.s_second[c], 0, at + " second order");
    }
    expect_close(a.lse_p_spread, b.lse_p_spread, 0, row + " lse P");
    expect_close(a.lse_s_spread, b.lse_s_spread, 0, row + " lse scores");
    const double weight = size * static_cast<double>(head.v.cols);
    expect_close(a.scale_p_spread, b.scale_p_spread, 1e-6 * weight, row + " scale P");
    expect_close(a.scale_s_spread, b.scale_s_spread, 1e-6 * weight * (1 + fast.scales[i].largest_score),
                 row + " scale scores");
    expect_close(a.scale_dot_spread, b.scale_dot_spread, 1e-6 * weight * fast.scales[i].logit_rounding,
                 row + " scale dots");
    expect_close(a.scale_s_second, b.scale_s_second, 0, row + " scale second order");
  }
}

TEST(AttentionGeometry, CausalHeadOfSeveralBlocks) {
  Head head = normal_head(150, 170, 40, 1);
  head.scores.causal = true;
  expect_same_geometry(head, 0x1p-8);
  expect_same_geometry(head, 0);
}

TEST(AttentionGeometry, WindowSinkAndSoftCap) {
  Head head = normal_head(70, 90, 16, 2);
  head.scores.window_left = 20;
  head.scores.window_right = 5;
  head.scores.sink = 0.75;
  head.scores.softcap = 3.0;
  expect_same_geometry(head, 0x1p-8);
}

TEST(AttentionGeometry, AMaskOfMinusABillionZeroesWeights) {
  Head head = normal_head(66, 80, 8, 3);
  head.bias.assign(66 * 80, 0.0);
  for (std::size_t i = 0; i < 66; ++i) {
    for (std::size_t j = 0; j < 80; j += 3) head.bias[i * 80 + j] = -1e9;
  }
  head.scores.bias = head.bias;
  expect_same_geometry(head, 0x1p-8);
}

// Ties (a zero query sees every key alike; repeated keys) take the row-by-row groups.
TEST(AttentionGeometry, TiedWeightsAndConstantValues) {
  Head head = normal_head(65, 40, 12, 4);
  for (double& x : head.q.row(3)) x = 0;
  for (std::size_t j = 10; j < 20; ++j) {
    for (std::size_t t = 0; t < 12; ++t) head.k(j, t) = head.k(9, t);
  }
  for (std::size_t j = 0; j < 40; ++j) head.v(j, 5) = 1.0;  // o = 1: centred sums exactly 0
  expect_same_geometry(head, 0x1p-8);
}

TEST(AttentionGeometry, ScoresPastDoublesRangeTakeLongDouble) {
  Head head = normal_head(9, 11, 4, 5);
  for (double& x : head.q.values) x *= 1e160;
  for (double& x : head.k.values) x *= 1e160;
  head.scores.theta = 1e300;
  expect_same_geometry(head, 0x1p-8);
}

}  // namespace
}  // namespace sharpcheck::metrics
