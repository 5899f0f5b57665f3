// The attention backward reference against the independent 320-bit backend (tests/support: Boost's
// cpp_bin_float, no MPFR or Arb), in every format: plain, causal, soft-capped, with a sink, a
// negative temperature and an explicit scale, a gradient through the log-sum-exp, ALiBi with an
// additive bias (and -inf entries), padded queries and keys, grouped heads each with its own slope; the exact
// zeros (dO = 0; equal value rows, which make dP - D vanish); bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "reference/attention_backward.hpp"
#include "support/independent_backward.hpp"

namespace sharpcheck::reference {
namespace {

using testing::Exact;
using testing::random_matrix;
using Problem = testing::BackwardProblem;
using testing::ExactGradients;
using testing::independent_backward;

void expect_correctly_rounded(const Problem& p, const FloatFormat& format, const char* variant) {
  const AttentionGradients got = attention_backward({p.q, p.k, p.v, p.d_out, p.d_lse, p.scores}, format);
  const ExactGradients exact = independent_backward(p);
  const auto check = [&](const char* name, const Matrix& values, const std::vector<Exact>& expected) {
    for (std::size_t e = 0; e < values.values.size(); ++e) {
      EXPECT_TRUE(testing::is_nearest_in_format(values.values[e], expected[e], format))
          << variant << " " << name << "[" << e << "] in " << format.name;
    }
  };
  check("dQ", got.d_queries, exact.dq);
  check("dK", got.d_keys, exact.dk);
  check("dV", got.d_values, exact.dv);
  ASSERT_EQ(got.d_sinks.size(), p.scores.sink ? 1u : 0u);
  if (!got.d_sinks.empty()) {
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_sinks[0], exact.d_sink, format)) << variant << " dsink";
  }
}

// Grouped-query attention: two query heads share K and V; dK and dV are the sums over both heads,
// correctly rounded once (not the sum of two rounded per-head gradients), each head its own sink.
TEST(AttentionBackwardReference, GroupedQueryHeadsSumIntoOneCorrectlyRoundedDkAndDv) {
  DeterministicRandom random(41);
  const std::size_t m = 5, n = 7, d = 4, dv = 3;
  Problem heads[2];
  const Matrix k = random_matrix(n, d, 1.5, fp32, random), v = random_matrix(n, dv, 1, fp32, random);
  Matrix q(2 * m, d), d_out(2 * m, dv);
  const double sinks[2] = {0.5, -1.0};
  for (std::size_t h = 0; h < 2; ++h) {
    heads[h] =
        Problem{random_matrix(m, d, 1.5, fp32, random), k, v, random_matrix(m, dv, 1, fp32, random), {}, {}};
    heads[h].scores.causal = true;
    heads[h].scores.alignment = tensor::DiagonalAlignment::bottom_right;
    heads[h].scores.sink = sinks[h];
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t t = 0; t < d; ++t) q(h * m + i, t) = heads[h].q(i, t);
      for (std::size_t c = 0; c < dv; ++c) d_out(h * m + i, c) = heads[h].d_out(i, c);
    }
  }
  tensor::HeadScores causal;
  causal.causal = true;
  causal.alignment = tensor::DiagonalAlignment::bottom_right;
  for (const FloatFormat* format : {&fp32, &bf16}) {
    const AttentionGradients got = attention_backward({q, k, v, d_out, {}, causal, 2, sinks}, *format);
    const ExactGradients first = independent_backward(heads[0]), second = independent_backward(heads[1]);
    for (std::size_t e = 0; e < n * d; ++e)
      EXPECT_TRUE(testing::is_nearest_in_format(got.d_keys.values[e], first.dk[e] + second.dk[e], *format))
          << e;
    for (std::size_t e = 0; e < n * dv; ++e)
      EXPECT_TRUE(testing::is_nearest_in_format(got.d_values.values[e], first.dv[e] + second.dv[e], *format))
          << e;
    for (std::size_t e = 0; e < m * d; ++e) {
      EXPECT_TRUE(testing::is_nearest_in_format(got.d_queries.values[e], first.dq[e], *format)) << e;
      EXPECT_TRUE(testing::is_nearest_in_format(got.d_queries.values[m * d + e], second.dq[e], *format)) << e;
    }
    ASSERT_EQ(got.d_sinks.size(), 2u);
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_sinks[0], first.d_sink, *format));
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_sinks[1], second.d_sink, *format));
  }
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(EveryFormat, GradientsAreCorrectlyRoundedAgainstTheIndependentBackend) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(29);
  for (int trial = 0; trial < 6; ++trial) {
    const std::size_t m = 2 + random.below(4), n = 3 + random.below(12), d = 2 + random.below(6),
                      dv = 1 + random.below(4);
    Problem p{random_matrix(m, d, 1.5, fp32, random),
              random_matrix(n, d, 1.5, fp32, random),
              random_matrix(n, dv, 1, fp32, random),
              random_matrix(m, dv, 1, fp32, random),
              {},
              {}};
    expect_correctly_rounded(p, format, "plain");
    p.scores.causal = true;
    p.scores.alignment = tensor::DiagonalAlignment::bottom_right;
    expect_correctly_rounded(p, format, "causal");
    p.scores = {};
    p.scores.softcap = 1.5;
    expect_correctly_rounded(p, format, "soft-cap");
    p.scores = {};
    p.scores.sink = 0.75;
    p.d_lse.assign(m, 0.0);
    for (double& x : p.d_lse) x = round_to_format(random.normal(0, 1), fp32);
    expect_correctly_rounded(p, format, "sink and dLSE");
    p.scores = {};
    p.scores.theta = -0.7;
    p.scores.scale = 0.3;
    expect_correctly_rounded(p, format, "theta -0.7, scale 0.3");
    p.scores = {};
    p.d_lse.clear();
    std::vector<double> bias(m * n);
    for (double& x : bias) x = round_to_format(random.normal(0, 2), fp32);
    bias[n - 1] = -INFINITY;  // an additive mask's hidden key
    p.scores.bias = bias;
    p.scores.alibi_slope = 0.375;
    p.scores.causal = true;
    p.scores.alignment = tensor::DiagonalAlignment::bottom_right;
    expect_correctly_rounded(p, format, "ALiBi, additive bias, causal");
    p.scores = {};
    p.scores.queries = m - 1;  // the last query and the last two keys are padding
    p.scores.keys = n - 2;
    p.scores.row_stride = n;
    expect_correctly_rounded(p, format, "padded queries and keys");
    // Rational results, found by the exact stage: q = 0 and a zero sink make every probability
    // 1/(keys + 1); dO, V and dLSE of a few bits make many results ties of the narrow formats.
    p.scores = {};
    p.q = Matrix(m, d);
    p.scores.sink = 0.0;
    p.scores.scale = 0.25;
    p.scores.softcap = 2;  // at q . k = 0 its slope is the scale's
    for (double& x : p.d_out.values) x = static_cast<double>(random.below(33)) / 8 - 2;
    for (double& x : p.v.values) x = static_cast<double>(random.below(17)) / 4 - 2;
    p.d_lse.assign(m, 0.0);
    for (double& x : p.d_lse) x = static_cast<double>(random.below(9)) / 4 - 1;
    expect_correctly_rounded(p, format, "zero queries, zero sink, soft-cap, dLSE");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryFormat,
                         ::testing::Values(&fp64, &fp32, &bf16, &fp16, &fp8_e4m3, &fp8_e5m2),
                         [](const auto& parameter) { return std::string(parameter.param->name); });

// fp8 outputs on the extreme-input families: a temperature of 1e-17 (one-hot rows), scores of
// about 1e30 (q and k of 1e15), and dO at the format's largest values; against the independent
// backend, an exact value past the overflow threshold against the format's overflow value.
// Nothing may be refused.
TEST(AttentionBackwardReference, Fp8OutputsOnExtremeInputs) {
  DeterministicRandom random(43);
  for (const FloatFormat* format : {&fp8_e4m3, &fp8_e5m2}) {
    for (int family = 0; family < 3; ++family) {
      for (int trial = 0; trial < 3; ++trial) {
        const std::size_t m = 2 + random.below(3), n = 3 + random.below(6), d = 2 + random.below(4), dv = 2;
        const double qk = family == 1 ? 1e15 : 1.0, out = family == 2 ? format->max_finite / 4 : 1.0;
        Problem p{random_matrix(m, d, qk, bf16, random),
                  random_matrix(n, d, qk, bf16, random),
                  random_matrix(n, dv, 1, *format, random),
                  random_matrix(m, dv, out, *format, random),
                  {},
                  {}};
        if (family == 0) p.scores.theta = 1e-17;
        const char* name = family == 0 ? "theta 1e-17" : (family == 1 ? "scores near 1e30" : "dO at the top");
        try {
          const AttentionGradients got =
              attention_backward({p.q, p.k, p.v, p.d_out, p.d_lse, p.scores}, *format);
          const ExactGradients exact = independent_backward(p);
          const auto check = [&](const char* tensor, const Matrix& values,
                                 const std::vector<Exact>& expected) {
            for (std::size_t e = 0; e < values.values.size(); ++e) {
              const Exact threshold =
                  Exact(format->max_finite) +
                  (Exact(format->max_finite) - Exact(next_down(format->max_finite, *format))) / 2;
              if (abs(expected[e]) > threshold) {
                EXPECT_TRUE(format->has_infinity() ? std::isinf(values.values[e])
                                                   : std::isnan(values.values[e]))
                    << name << " " << tensor << "[" << e << "] in " << format->name;
              } else {
                EXPECT_TRUE(testing::is_nearest_in_format(values.values[e], expected[e], *format))
                    << name << " " << tensor << "[" << e << "] in " << format->name;
              }
            }
          };
          check("dQ", got.d_queries, exact.dq);
          check("dK", got.d_keys, exact.dk);
          check("dV", got.d_values, exact.dv);
        } catch (const UndecidedRounding& refused) {
          ADD_FAILURE() << refused.what() << ": " << name << " in " << format->name << ", trial " << trial;
        }
      }
    }
  }
}

// Exact zeros are found (the loop reaches the zero band) and returned as 0, not refused.
TEST(AttentionBackwardReference, ExactZerosAreReturnedAsZero) {
  DeterministicRandom random(31);
  Problem p{random_matrix(3, 4, 1, fp32, random),
            random_matrix(5, 4, 1, fp32, random),
            random_matrix(5, 2, 1, fp32, random),
            Matrix(3, 2),
            {},
            {}};
  const AttentionGradients zero = attention_backward({p.q, p.k, p.v, p.d_out, {}, p.scores}, fp32);
  for (const Matrix* m : {&zero.d_queries, &zero.d_keys, &zero.d_values}) {
    for (const double x : m->values) EXPECT_EQ(x, 0.0);
  }
  // Equal value rows: dP_ij = dO_i . v is the same for every key, so dP - D = 0 and dQ = dK = 0,
  // while dV = sum_i P_ij dO_i is not.
  for (std::size_t j = 0; j < 5; ++j) {
    p.v(j, 0) = 0.5;
    p.v(j, 1) = -1.25;
  }
  p.d_out = random_matrix(3, 2, 1, fp32, random);
  ZivStatistics statistics;
  const AttentionGradients equal =
      attention_backward({p.q, p.k, p.v, p.d_out, {}, p.scores}, fp32, &statistics);
  // Every dP of a row is equal, so D is that value and dP - D = 0 exactly: the exact stage
  // (reference/attention_backward_exact.hpp) returns dQ = dK = 0 after the first pass.
  EXPECT_EQ(statistics.escalations, 0);
  for (const double x : equal.d_queries.values) EXPECT_EQ(x, 0.0);
  for (const double x : equal.d_keys.values) EXPECT_EQ(x, 0.0);
  double dv_mass = 0;
  for (const double x : equal.d_values.values) dv_mass += std::fabs(x);
  EXPECT_GT(dv_mass, 0.1);
  expect_correctly_rounded(p, fp32, "equal value rows");
}

// A gradient below every format's range carries its exact sign where the reference can show it.
// One query q = 1, keys k = (0, -800), values v = (0, 1), dO = +-1 (so dP = (0, +-1)): with P_1 =
// e^-800 / (1 + e^-800), dS_0 = -+P_0 P_1 and dS_1 = +-P_0 P_1, so dQ = -800 dS_1 and dK_j = dS_j:
// for dO = 1, dQ < 0, dK_0 < 0 < dK_1 (all of about e^-800, which underflows double, so the double
// stage's interval holds both signs and D - dP_0 cancels below 1,150 bits).
TEST(AttentionBackwardReference, AGradientBelowTheFormatsRangeHasItsExactSign) {
  Matrix q(1, 1), k(2, 1), v(2, 1), d_out(1, 1);
  q(0, 0) = 1;
  k(1, 0) = -800;
  v(1, 0) = 1;
  const tensor::HeadScores plain;
  for (const FloatFormat* format : {&fp32, &bf16, &fp8_e4m3}) {
    for (const double sign : {1.0, -1.0}) {
      d_out(0, 0) = sign;
      const AttentionGradients g = attention_backward({q, k, v, d_out, {}, plain}, *format);
      const double got[] = {g.d_queries(0, 0), g.d_keys(0, 0), g.d_keys(1, 0)};
      const bool negative[] = {sign > 0, sign > 0, sign < 0};
      for (std::size_t e = 0; e < 3; ++e) {
        EXPECT_EQ(got[e], 0.0) << format->name << " dO " << sign << " result " << e;
        EXPECT_EQ(std::signbit(got[e]), negative[e])
            << format->name << " dO " << sign << " result " << e << " (dQ, dK_0, dK_1)";
      }
    }
  }
}

// A D no precision decides (two groups of equal logits whose dP means are both 1 + 2^-24, an fp32
// midpoint: D is exactly that) refuses a call that returns D, but not one that asks for the
// gradients only (Python's reference), whose dQ (exactly 0), dK and dV are decided.
TEST(AttentionBackwardReference, AnUndecidableDRefusesOnlyTheCallsThatReturnIt) {
  Problem p{Matrix(1, 1), Matrix(4, 1), Matrix(4, 1), Matrix(1, 1), {}, {}};
  p.q(0, 0) = 1;
  p.d_out(0, 0) = 1;
  const double keys[] = {0.5, 0.5, -0.25, -0.25},
               values[] = {1, 1 + 0x1p-23, 1 + 0x1p-24 - 0x1p-30, 1 + 0x1p-24 + 0x1p-30};
  for (std::size_t j = 0; j < 4; ++j) {
    p.k(j, 0) = keys[j];
    p.v(j, 0) = values[j];
  }
  p.scores.scale = 1.0;
  const AttentionBackwardInputs in{p.q, p.k, p.v, p.d_out, {}, p.scores};
  EXPECT_THROW((void)attention_backward(in, fp32), UndecidedRounding);
  const AttentionGradients got = attention_backward(in, fp32, nullptr, RowsOfD::not_needed);
  EXPECT_TRUE(std::isnan(got.d_rows[0]));
  const ExactGradients exact = independent_backward(p);
  EXPECT_EQ(got.d_queries(0, 0), 0.0);
  for (std::size_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_keys(j, 0), exact.dk[j], fp32)) << "dK " << j;
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_values(j, 0), exact.dv[j], fp32)) << "dV " << j;
  }
}

// Results that are exactly a rounding boundary (ties), which no precision decides: with q = 0
// every probability of a row is 1/(keys), and dV = sum_i dO_i / (keys) can be a midpoint; with a
// constant value row every dP is dO . v, and D (rounded to fp64) can be one. Each is decided by
// the exact stage, ties to even, where the loop refused before ("dV(0, 0) undecided at 131072 bits").
TEST(AttentionBackwardReference, ExactTiesAreDecidedNotRefused) {
  Matrix q(2, 1), k(2, 1), v(2, 1), d_out(2, 1);
  k(0, 0) = 1;
  k(1, 0) = 2;
  v(0, 0) = 1;
  v(1, 0) = 3;
  d_out(0, 0) = 1;
  d_out(1, 0) = 0x1p-53;  // dV = (1 + 2^-53) / 2 = 0.5 + 2^-54: halfway, to the even 0.5
  const tensor::HeadScores plain;
  AttentionGradients g = attention_backward({q, k, v, d_out, {}, plain}, fp64);
  EXPECT_EQ(g.d_values(0, 0), 0.5);
  EXPECT_EQ(g.d_values(1, 0), 0.5);
  // dz = (dP - D) / 2 = -+dO / 2 and dQ = sum_j dz_j k_j = dO / 2; dK = 0 since q = 0.
  EXPECT_EQ(g.d_queries(0, 0), 0.5);
  EXPECT_EQ(g.d_queries(1, 0), 0x1p-54);
  EXPECT_EQ(g.d_keys(0, 0), 0.0);
  d_out(1, 0) = 3 * 0x1p-53;  // 0.5 + 3 2^-54: halfway between 0.5 + 2^-53 and the even 0.5 + 2^-52
  g = attention_backward({q, k, v, d_out, {}, plain}, fp64);
  EXPECT_EQ(g.d_values(0, 0), 0.5 + 0x1p-52);
  d_out(1, 0) = 0x1p-24;  // in fp32: 0.5 + 2^-25, halfway, to 0.5
  g = attention_backward({q, k, v, d_out, {}, plain}, fp32);
  EXPECT_EQ(g.d_values(0, 0), 0.5);

  // Three keys, P = 1/3 (no finite ball is exact): dV = (1.5 + 3 2^-54) / 3 = 0.5 + 2^-54.
  Matrix q3(3, 1), k3(3, 1), v3(3, 1), d_out3(3, 1);
  for (std::size_t j = 0; j < 3; ++j) k3(j, 0) = v3(j, 0) = static_cast<double>(j) + 1;
  d_out3(0, 0) = 1.5;
  d_out3(1, 0) = 3 * 0x1p-54;
  g = attention_backward({q3, k3, v3, d_out3, {}, plain}, fp64);
  for (std::size_t j = 0; j < 3; ++j) EXPECT_EQ(g.d_values(j, 0), 0.5) << j;

  // D on a midpoint: every value row (1.5), dO = 1 + 2^-52, so D = 1.5 + 3 2^-53, halfway
  // between 1.5 + 2^-52 and the even 1.5 + 2^-51; the keys differ, so P is not rational.
  Matrix q1(1, 1), k1(2, 1), v1(2, 1), d_out1(1, 1);
  q1(0, 0) = 0.75;
  k1(0, 0) = -1;
  k1(1, 0) = 0.5;
  v1(0, 0) = v1(1, 0) = 1.5;
  d_out1(0, 0) = 1 + 0x1p-52;
  g = attention_backward({q1, k1, v1, d_out1, {}, plain}, fp64);
  EXPECT_EQ(g.d_rows[0], 1.5 + 0x1p-51);
  EXPECT_EQ(g.d_queries(0, 0), 0.0);  // dP - D = 0 for every key

  // Scale 0 under a soft-cap: every logit is cap tanh(0) = 0 whatever q . k, so P = 1/2 and
  // dV = (2 + 2^-52) / 2 = 1 + 2^-53, to the even 1 (the audit's case, refused before).
  Matrix q0(2, 2), k0(2, 2), v0(2, 1), d_out0(2, 1);
  q0(0, 0) = q0(1, 0) = 1;
  k0(0, 0) = 1;
  k0(1, 0) = 2;
  d_out0(0, 0) = 2;
  d_out0(1, 0) = 0x1p-52;
  tensor::HeadScores capped;
  capped.scale = 0.0;
  capped.softcap = 1.0;
  g = attention_backward({q0, k0, v0, d_out0, {}, capped}, fp64);
  EXPECT_EQ(g.d_values(0, 0), 1.0);
  EXPECT_EQ(g.d_values(1, 0), 1.0);
}

// Grouped heads that score differently (each its own ALiBi slope and bias, one with a sink): each
// head's dQ is its own, dK and dV the sums, all against the independent backend per head.
TEST(AttentionBackwardReference, GroupedHeadsEachScoreWithTheirOwnSlopeAndBias) {
  DeterministicRandom random(43);
  const std::size_t m = 4, n = 6, d = 3, dv = 2;
  const Matrix k = random_matrix(n, d, 1.5, fp32, random), v = random_matrix(n, dv, 1, fp32, random);
  Matrix q(2 * m, d), d_out(2 * m, dv);
  std::vector<double> bias(m * n);
  for (double& x : bias) x = round_to_format(random.normal(0, 1), fp32);
  Problem heads[2];
  std::vector<tensor::HeadScores> scores(2);
  for (std::size_t h = 0; h < 2; ++h) {
    heads[h] =
        Problem{random_matrix(m, d, 1.5, fp32, random), k, v, random_matrix(m, dv, 1, fp32, random), {}, {}};
    scores[h].alibi_slope = h == 0 ? 0.5 : 0.0625;
    scores[h].bias = h == 0 ? std::span<const double>() : std::span<const double>(bias);
    if (h == 1) scores[h].sink = 0.25;
    heads[h].scores = scores[h];
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t t = 0; t < d; ++t) q(h * m + i, t) = heads[h].q(i, t);
      for (std::size_t c = 0; c < dv; ++c) d_out(h * m + i, c) = heads[h].d_out(i, c);
    }
  }
  const AttentionGradients got = attention_backward({q, k, v, d_out, {}, scores[0], 2, {}, scores}, bf16);
  const ExactGradients first = independent_backward(heads[0]), second = independent_backward(heads[1]);
  for (std::size_t e = 0; e < n * d; ++e)
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_keys.values[e], first.dk[e] + second.dk[e], bf16)) << e;
  for (std::size_t e = 0; e < n * dv; ++e)
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_values.values[e], first.dv[e] + second.dv[e], bf16)) << e;
  for (std::size_t e = 0; e < m * d; ++e) {
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_queries.values[e], first.dq[e], bf16)) << e;
    EXPECT_TRUE(testing::is_nearest_in_format(got.d_queries.values[m * d + e], second.dq[e], bf16)) << e;
  }
  ASSERT_EQ(got.d_sinks.size(), 2u);
  EXPECT_EQ(got.d_sinks[0], 0.0);  // the first head has no sink
  EXPECT_TRUE(testing::is_nearest_in_format(got.d_sinks[1], second.d_sink, bf16));
  // Swapping the heads' scores must change dQ: each head is read with its own.
  std::vector<tensor::HeadScores> swapped{scores[1], scores[0]};
  const AttentionGradients wrong = attention_backward({q, k, v, d_out, {}, scores[0], 2, {}, swapped}, bf16);
  EXPECT_NE(wrong.d_queries.values, got.d_queries.values);
}

TEST(AttentionBackwardReference, BadInputIsNamed) {
  DeterministicRandom random(37);
  const Matrix q = random_matrix(2, 3, 1, fp32, random), k = random_matrix(4, 3, 1, fp32, random),
               v = random_matrix(4, 2, 1, fp32, random);
  Matrix d_out = random_matrix(2, 2, 1, fp32, random);
  const tensor::HeadScores plain;
  const auto call = [&](const Matrix& dO, const tensor::HeadScores& scores,
                        std::span<const double> d_lse = {}) {
    return attention_backward({q, k, v, dO, d_lse, scores}, fp32);
  };
  EXPECT_THROW((void)call(Matrix(2, 3), plain), InputError);  // dO's shape
  const std::vector<double> short_lse(1, 0.0);
  EXPECT_THROW((void)call(d_out, plain, short_lse), InputError);
  d_out(1, 1) = NAN;
  try {
    (void)call(d_out, plain);
    FAIL() << "NaN accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("dO entry (1, 1)"), std::string::npos) << error.what();
  }
  d_out(1, 1) = 0;
  tensor::HeadScores zero_theta;
  zero_theta.theta = 0;
  EXPECT_THROW((void)call(d_out, zero_theta), InputError);
  const std::vector<double> nan_bias{0, 0, 0, NAN, 0, 0, 0, 0};
  tensor::HeadScores biased;
  biased.bias = nan_bias;
  try {
    (void)call(d_out, biased);
    FAIL() << "NaN bias accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("bias[0][3] is NaN"), std::string::npos) << error.what();
  }
  biased.bias = std::span(nan_bias).first(5);  // does not cover 2 x 4
  EXPECT_THROW((void)call(d_out, biased), InputError);
  tensor::HeadScores too_long;
  too_long.queries = 3;  // more than Q's 2 rows
  EXPECT_THROW((void)call(d_out, too_long), InputError);
}

}  // namespace
}  // namespace sharpcheck::reference
