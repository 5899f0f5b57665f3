// Linear, selective and Differential attention's references (reference/attention_escapes.hpp)
// against the independent 320-bit backend (Boost cpp_bin_float: the definitions term by term) in
// every format, their closed forms decided by the exact branch (rational results: a single key,
// positive features, equal logits, (1 - lambda) / n), and bad input named.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <cmath>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "reference/attention_escapes.hpp"
#include "support/independent_reference.hpp"

namespace sharpcheck::reference {
namespace {

using testing::Exact;

Matrix random_matrix(std::size_t rows, std::size_t cols, double sigma, DeterministicRandom& random) {
  Matrix m(rows, cols);
  for (double& x : m.values) x = round_to_format(random.normal(0, sigma), fp32);
  return m;
}

Matrix matrix_of(std::size_t rows, std::size_t cols, std::vector<double> values) {
  Matrix m(rows, cols);
  m.values = std::move(values);
  return m;
}

Exact feature(double x) { return x > 0 ? Exact(x) + 1 : exp(Exact(x)); }

// Weights (m x n) then outputs (m x dv), row-major, at 320 bits.
std::vector<Exact> independent_linear(const Matrix& q, const Matrix& k, const Matrix& v, bool causal) {
  std::vector<Exact> weights(q.rows * k.rows, Exact(0)), outputs(q.rows * v.cols, Exact(0));
  for (std::size_t i = 0; i < q.rows; ++i) {
    std::vector<Exact> s(k.rows, Exact(0));
    Exact total = 0;
    for (std::size_t j = 0; j < k.rows && (!causal || j <= i); ++j) {
      for (std::size_t t = 0; t < q.cols; ++t) s[j] += feature(q(i, t)) * feature(k(j, t));
      total += s[j];
    }
    for (std::size_t j = 0; j < k.rows && (!causal || j <= i); ++j) {
      weights[i * k.rows + j] = s[j] / total;
      for (std::size_t c = 0; c < v.cols; ++c) outputs[i * v.cols + c] += s[j] / total * Exact(v(j, c));
    }
  }
  weights.insert(weights.end(), outputs.begin(), outputs.end());
  return weights;
}

std::vector<Exact> independent_softmax_row(const std::vector<Exact>& z, const std::vector<bool>& seen) {
  Exact total = 0;
  std::vector<Exact> w(z.size(), Exact(0));
  for (std::size_t j = 0; j < z.size(); ++j) total += seen[j] ? exp(z[j]) : Exact(0);
  for (std::size_t j = 0; j < z.size(); ++j) w[j] = seen[j] ? exp(z[j]) / total : Exact(0);
  return w;
}

std::vector<Exact> independent_selective(const Matrix& logits, const Matrix& selection) {
  const std::size_t n = logits.rows;
  std::vector<Exact> result;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Exact> z(n, Exact(0));
    std::vector<bool> seen(n, false);
    for (std::size_t j = 0; j <= i; ++j) {
      Exact penalty = 0;  // F_ij = sum_{k < i} ReLU(selection_kj) for 1 <= j < k
      for (std::size_t k = 0; k < i; ++k) {
        if (j >= 1 && j < k && selection(k, j) > 0) penalty += Exact(selection(k, j));
      }
      seen[j] = logits(i, j) != -INFINITY;
      if (seen[j]) z[j] = Exact(logits(i, j)) - penalty;
    }
    const auto w = independent_softmax_row(z, seen);
    result.insert(result.end(), w.begin(), w.end());
  }
  return result;
}

std::vector<Exact> independent_differential(const Matrix& z1, const Matrix& z2, double lambda) {
  std::vector<Exact> result;
  for (std::size_t i = 0; i < z1.rows; ++i) {
    std::vector<Exact> a(z1.cols), b(z1.cols);
    std::vector<bool> sa(z1.cols), sb(z1.cols);
    for (std::size_t j = 0; j < z1.cols; ++j) {
      sa[j] = z1(i, j) != -INFINITY;
      sb[j] = z2(i, j) != -INFINITY;
      a[j] = sa[j] ? Exact(z1(i, j)) : Exact(0);
      b[j] = sb[j] ? Exact(z2(i, j)) : Exact(0);
    }
    const auto p1 = independent_softmax_row(a, sa), p2 = independent_softmax_row(b, sb);
    for (std::size_t j = 0; j < z1.cols; ++j) result.push_back(p1[j] - Exact(lambda) * p2[j]);
  }
  return result;
}

void expect_nearest(const std::vector<double>& got, const std::vector<Exact>& exact,
                    const FloatFormat& format, const char* what) {
  ASSERT_EQ(got.size(), exact.size());
  for (std::size_t e = 0; e < got.size(); ++e)
    EXPECT_TRUE(testing::is_nearest_in_format(got[e], exact[e], format)) << what << " element " << e;
}

class EveryFormat : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(EveryFormat, LinearAttentionIsCorrectlyRounded) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(61);
  for (const bool causal : {false, true}) {
    const Matrix q = random_matrix(5, 4, 1.2, random), k = random_matrix(7, 4, 1.2, random),
                 v = random_matrix(7, 3, 1, random);
    const LinearAttention got = linear_attention(q, k, v, causal, format);
    std::vector<double> all = got.weights.values;
    all.insert(all.end(), got.outputs.values.begin(), got.outputs.values.end());
    expect_nearest(all, independent_linear(q, k, v, causal), format, causal ? "causal" : "full");
  }
}

TEST_P(EveryFormat, SelectiveAttentionIsCorrectlyRounded) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(67);
  Matrix logits = random_matrix(9, 9, 2, random);
  for (std::size_t i = 0; i < 9; ++i) {
    for (std::size_t j = i + 1; j < 9; ++j) logits(i, j) = -INFINITY;
  }
  logits(6, 2) = -INFINITY;  // a masked key inside the causal band
  const Matrix other = random_matrix(9, 9, 2, random);
  expect_nearest(selective_attention_weights(logits, logits, format).values,
                 independent_selective(logits, logits), format, "head 0 selects");
  expect_nearest(selective_attention_weights(logits, other, format).values,
                 independent_selective(logits, other), format, "another head selects");
}

TEST_P(EveryFormat, DifferentialAttentionIsCorrectlyRounded) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(71);
  Matrix z1 = random_matrix(4, 11, 2, random), z2 = random_matrix(4, 11, 2, random);
  z1(1, 3) = -INFINITY;
  z2(2, 5) = -INFINITY;
  for (const double lambda : {0.2, 0.8, 1.75, -0.3}) {
    expect_nearest(differential_attention_weights(z1, z2, lambda, format).values,
                   independent_differential(z1, z2, lambda), format, "random rows");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryFormat, ::testing::Values(&fp64, &fp32, &bf16, &fp16, &fp8_e4m3),
                         [](const auto& parameter) { return std::string(parameter.param->name); });

// Rational results are found by the exact branch and rounded exactly (a ball never decides a
// result that is itself a rounding boundary or 0).
TEST(AttentionEscapesReference, ClosedFormsAreExact) {
  // Linear: the first causal query sees one key: weight 1, output v_0; positive features make
  // every result rational: s_ij = sum_t (q + 1)(k + 1).
  const Matrix q = matrix_of(2, 2, {1, 3, 0.5, 1}), k = matrix_of(2, 2, {1, 1, 3, 0}),
               v = matrix_of(2, 1, {0.25, -1});
  const LinearAttention linear = linear_attention(q, k, v, true, fp32);
  EXPECT_EQ(linear.weights(0, 0), 1.0);
  EXPECT_EQ(linear.weights(0, 1), 0.0);
  EXPECT_EQ(linear.outputs(0, 0), 0.25);
  // Row 1: s_10 = 1.5*2 + 2*2 = 7, s_11 = 1.5*4 + 2*exp(0)... k = 0 is not > 0: phi(0) = e^0 = 1.
  // s_11 = 1.5 * 4 + 2 * 1 = 8: weights 7/15 and 8/15, output (7/4 - 8)/15 = -0.41666...
  EXPECT_EQ(linear.weights(1, 0), static_cast<double>(static_cast<float>(7.0 / 15)));
  EXPECT_EQ(linear.outputs(1, 0), static_cast<double>(static_cast<float>((7.0 * 0.25 - 8.0) / 15)));
  // Selective: every logit equal and no positive selection: uniform 1/(i + 1) per row.
  Matrix equal(4, 4, 0.5), quiet(4, 4, -1.0);
  const Matrix uniform = selective_attention_weights(equal, quiet, fp32);
  EXPECT_EQ(uniform(2, 0), static_cast<double>(1.0F / 3));
  EXPECT_EQ(uniform(3, 3), 0.25);
  // Differential: equal rows give (1 - lambda) / n exactly, negative when lambda > 1; a tie:
  // (1 - 0.5) / 3 = 1/6 is no tie, but lambda = 1 gives exactly 0.
  const Matrix flat(1, 4, 1.0);
  EXPECT_EQ(differential_attention_weights(flat, flat, 0.2, fp32)(0, 1), static_cast<double>(0.8F / 4));
  EXPECT_EQ(differential_attention_weights(flat, flat, 1.5, bf16)(0, 0), -0.125);
  DeterministicRandom random(3);
  const Matrix same = random_matrix(2, 6, 2, random);
  ZivStatistics statistics;  // 0 is a ball's boundary: only the exact branch decides it
  for (const double w : differential_attention_weights(same, same, 1.0, fp32, &statistics).values)
    EXPECT_EQ(w, 0.0);
  EXPECT_EQ(statistics.exact_cases, 12);
}

// Selective attention differs from softmax exactly where a positive selection reaches a later
// row: the mutation check that F is applied (a reference without F would equal softmax).
TEST(AttentionEscapesReference, SelectionChangesOnlyTheRowsItReaches) {
  DeterministicRandom random(73);
  Matrix logits = random_matrix(6, 6, 1, random), none(6, 6, -1.0), strong(6, 6, -1.0);
  strong(2, 1) = 3.0;  // token 2 masks token 1 for rows 3..5
  const Matrix plain = selective_attention_weights(logits, none, fp32),
               selected = selective_attention_weights(logits, strong, fp32);
  for (std::size_t i = 0; i < 6; ++i) {
    for (std::size_t j = 0; j <= i; ++j) {
      if (i <= 2) {
        EXPECT_EQ(plain(i, j), selected(i, j)) << i << "," << j;
      }
    }
  }
  EXPECT_LT(selected(4, 1), plain(4, 1) * 0.1);  // e^-3 of its weight, give or take renormalising
}

TEST(AttentionEscapesReference, BadInputIsNamed) {
  const Matrix q(2, 3, 0.5), k(4, 3, 0.5), v(4, 2, 1.0);
  EXPECT_THROW((void)linear_attention(q, Matrix(4, 2), v, false, fp32), InputError);
  Matrix bad = k;
  bad(2, 1) = NAN;
  try {
    (void)linear_attention(q, bad, v, false, fp32);
    FAIL() << "NaN accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("K entry (2, 1) is NaN"), std::string::npos) << error.what();
  }
  Matrix masked(3, 3, 1.0);
  masked(1, 0) = masked(1, 1) = -INFINITY;
  EXPECT_THROW((void)selective_attention_weights(masked, masked, fp32), InputError);  // row 1 sees nothing
  EXPECT_THROW((void)selective_attention_weights(Matrix(3, 2), Matrix(3, 2), fp32), InputError);
  EXPECT_THROW((void)differential_attention_weights(Matrix(2, 3), Matrix(2, 4), 0.2, fp32), InputError);
  EXPECT_THROW((void)differential_attention_weights(Matrix(2, 3), Matrix(2, 3), NAN, fp32), InputError);
}

}  // namespace
}  // namespace sharpcheck::reference

namespace sharpcheck {
namespace {

// A weight 2^-732 under an fp64 midpoint: the spike row (510, 0, ..., 0) of 16 against a uniform
// second softmax gives w_0 = 1 / (1 + 15 e^-510) - lambda / 16, and 1 - lambda / 16 is a midpoint.
// The ball stage once took the enclosure's ends at 128 bits, which straddled the midpoint at every
// precision: UndecidedRounding for a value more precision decides. Checked against MPFR at 4096 bits.
TEST(AttentionEscapesReference, AWeightWithinTwoToTheMinus700OfAMidpointIsDecided) {
  const double lambda = 0.777870099559256;
  Matrix spike(1, 16), uniform(1, 16);
  spike(0, 0) = 510;
  const double got = reference::differential_attention_weights(spike, uniform, lambda, fp64)(0, 0);
  mpfr_t e, w;
  mpfr_inits2(4096, e, w, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_si(e, -510, MPFR_RNDN);
  mpfr_exp(e, e, MPFR_RNDN);
  mpfr_mul_ui(e, e, 15, MPFR_RNDN);
  mpfr_add_ui(e, e, 1, MPFR_RNDN);
  mpfr_ui_div(w, 1, e, MPFR_RNDN);
  mpfr_set_d(e, lambda, MPFR_RNDN);
  mpfr_div_ui(e, e, 16, MPFR_RNDN);
  mpfr_sub(w, w, e, MPFR_RNDN);
  const double expected = mpfr_get_d(w, MPFR_RNDN);
  mpfr_clears(e, w, static_cast<mpfr_ptr>(nullptr));
  EXPECT_EQ(got, expected);  // 4096 bits: each rounding is ~2^-4096, far under the 2^-732 gap
}

}  // namespace
}  // namespace sharpcheck
