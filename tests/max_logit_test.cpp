// reference/max_logit.hpp against an independent computation: the dot product summed exactly in
// MPFR at 4,000 bits (every product of two doubles and every partial sum fits), times 1/sqrt(d)
// from mpfr_rec_sqrt at 4,000 bits, rounded once to the target; over head dims whose scale is
// irrational (64 is a square; 96 and 128 are not), a given scale, fp32 and bf16 targets, and heads
// with a causal mask and a window, where the maximum is also taken by brute force over the pairs.
#include "reference/max_logit.hpp"

#include <gtest/gtest.h>
#include <mpfr.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/mpfr_number.hpp"
#include "core/random.hpp"

namespace sharpcheck {
namespace {

double independent_score(std::span<const double> q, std::span<const double> k, std::optional<double> scale,
                         const FloatFormat& target) {
  constexpr mpfr_prec_t wide = 4000;
  MpfrNumber dot(wide), product(wide), factor(wide);
  mpfr_set_zero(dot.get(), 1);
  for (std::size_t t = 0; t < q.size(); ++t) {
    mpfr_set_d(product.get(), q[t], MPFR_RNDN);
    mpfr_mul_d(product.get(), product.get(), k[t], MPFR_RNDN);  // exact at 4,000 bits
    mpfr_add(dot.get(), dot.get(), product.get(), MPFR_RNDN);   // exact too
  }
  if (scale) {
    mpfr_set_d(factor.get(), *scale, MPFR_RNDN);
  } else {
    mpfr_set_ui(factor.get(), static_cast<unsigned long>(q.size()), MPFR_RNDN);
    mpfr_rec_sqrt(factor.get(), factor.get(), MPFR_RNDN);
  }
  mpfr_mul(dot.get(), dot.get(), factor.get(), MPFR_RNDN);
  MpfrNumber rounded(target.precision());
  mpfr_set(rounded.get(), dot.get(), MPFR_RNDN);
  return mpfr_get_d(rounded.get(), MPFR_RNDN);
}

Matrix values_of(std::size_t rows, std::size_t cols, DeterministicRandom& random, const FloatFormat& format) {
  Matrix m(rows, cols);
  for (double& x : m.values) x = round_to_format(random.normal(), format);
  return m;
}

TEST(MaxLogit, EachScoreIsRoundedAsAnIndependentMpfrComputationRoundsIt) {
  DeterministicRandom random(11);
  for (const std::size_t dim : {64UL, 96UL, 128UL}) {
    for (const FloatFormat* target : {&fp32, &bf16}) {
      for (const std::optional<double> scale : {std::optional<double>{}, std::optional<double>{0.1}}) {
        tensor::HeadScores head;
        head.scale = scale;
        const Matrix q = values_of(8, dim, random, bf16), k = values_of(8, dim, random, bf16);
        for (std::size_t i = 0; i < 8; ++i) {
          for (std::size_t j = 0; j < 8; ++j) {
            EXPECT_EQ(reference::rounded_score(q.row(i), k.row(j), head, *target),
                      independent_score(q.row(i), k.row(j), scale, *target))
                << "d " << dim << " " << target->name << " pair " << i << ", " << j;
          }
        }
      }
    }
  }
}

TEST(MaxLogit, TheMaximumIsTheLargestRoundedScoreAmongThePairsAHeadSees) {
  DeterministicRandom random(12);
  for (const bool causal : {false, true}) {
    const std::size_t m = 40, n = 56, dim = 96;
    Matrix q = values_of(m, dim, random, bf16);
    const Matrix k = values_of(n, dim, random, bf16);
    for (std::size_t c = 0; c < dim; ++c) q(0, c) = k(n - 1, c) * 3;  // a large score causal hides from row 0
    tensor::HeadScores head;
    head.queries = m;
    head.keys = head.row_stride = n;
    head.causal = causal;
    head.window_left = 20;
    double brute = -std::numeric_limits<double>::infinity();
    std::vector<std::size_t> seen;
    for (std::size_t i = 0; i < m; ++i) {
      head.visible_keys(i, seen);
      for (const std::size_t j : seen)
        brute = std::max(brute, independent_score(q.row(i), k.row(j), std::nullopt, fp32));
    }
    EXPECT_EQ(reference::max_logit(q, k, head, fp32), brute) << (causal ? "causal" : "window only");
  }
}

TEST(MaxLogit, AHeadThatSeesNothingHasMinusInfinity) {
  DeterministicRandom random(13);
  const Matrix q = values_of(2, 16, random, bf16), k = values_of(3, 16, random, bf16);
  tensor::HeadScores head;
  head.queries = 2;
  head.keys = head.row_stride = 3;
  const std::vector<std::uint8_t> keep(6, 0);
  head.keep = keep;
  EXPECT_EQ(reference::max_logit(q, k, head, fp32), -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace sharpcheck
