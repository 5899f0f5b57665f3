// Properties of linear, selective and Differential attention (reference/attention_escapes.hpp)
// that hold whatever the inputs, checked on the correctly rounded references with no slack beyond
// the rounding itself: linear attention's weights are a distribution and its outputs a convex
// combination of the values; selective attention with no positive selection is softmax; the
// Differential weights sum to 1 - lambda and disperse: |w_j| <= (e^delta1 + |lambda| e^delta2) / n.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "properties/generators.hpp"
#include "reference/attention_escapes.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::properties {
namespace {

// A rows x cols matrix of fp32 logits within [-limit, limit], 1..8 rows, 1..12 columns.
rc::Gen<Matrix> a_matrix_of_logits_within(int limit, std::size_t rows, std::size_t cols) {
  return rc::gen::map(rc::gen::container<std::vector<double>>(rows * cols, a_logit_within(limit)),
                      [rows, cols](const std::vector<double>& values) {
                        Matrix m(rows, cols);
                        m.values = values;
                        return m;
                      });
}

// Each fp32 result is within u of its value (or half the least subnormal): a sum of k of them is
// within u sum |w| + k 2^-150 of the exact sum, plus the long double sum's own error.
double rounding_slack(const std::vector<double>& weights) {
  double mass = 0;
  for (const double w : weights) mass += std::fabs(w);
  return fp32.unit_roundoff() * mass + static_cast<double>(weights.size()) * 0x1p-150 + 0x1p-60;
}

double sum_of(std::span<const double> values) {
  return static_cast<double>(std::accumulate(values.begin(), values.end(), 0.0L));
}

RC_GTEST_PROP(AttentionEscapes, LinearAttentionWeightsAreADistributionAndOutputsAConvexCombination, ()) {
  const auto m = *rc::gen::inRange<std::size_t>(1, 6), n = *rc::gen::inRange<std::size_t>(1, 10),
             d = *rc::gen::inRange<std::size_t>(1, 5);
  const Matrix q = *a_matrix_of_logits_within(4, m, d), k = *a_matrix_of_logits_within(4, n, d),
               v = *a_matrix_of_logits_within(8, n, 1);
  const bool causal = *rc::gen::arbitrary<bool>();
  const auto result = reference::linear_attention(q, k, v, causal, fp32);
  for (std::size_t i = 0; i < m; ++i) {
    const std::vector<double> row(result.weights.row(i).begin(), result.weights.row(i).end());
    for (const double w : row) RC_ASSERT(w >= 0.0);
    RC_ASSERT(std::fabs(sum_of(row) - 1) <= rounding_slack(row));
    const std::size_t seen = causal ? std::min(i + 1, n) : n;
    const auto [low, high] =
        std::minmax_element(v.values.begin(), v.values.begin() + static_cast<long>(seen));
    RC_ASSERT(result.outputs(i, 0) >= *low && result.outputs(i, 0) <= *high);  // rounding is monotone
  }
}

RC_GTEST_PROP(AttentionEscapes, SelectiveAttentionWithoutPositiveSelectionIsSoftmax, ()) {
  const auto n = *rc::gen::inRange<std::size_t>(1, 10);
  Matrix logits = *a_matrix_of_logits_within(6, n, n), selection = *a_matrix_of_logits_within(6, n, n);
  for (double& x : selection.values) x = -std::fabs(x);  // ReLU gives 0 everywhere
  const Matrix weights = reference::selective_attention_weights(logits, selection, fp32);
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<double> visible(logits.row(i).begin(),
                                      logits.row(i).begin() + static_cast<long>(i + 1));
    const auto expected = reference::softmax(visible, fp32);
    for (std::size_t j = 0; j <= i; ++j) RC_ASSERT(weights(i, j) == expected[j]);
    for (std::size_t j = i + 1; j < n; ++j) RC_ASSERT(weights(i, j) == 0.0);
  }
}

RC_GTEST_PROP(AttentionEscapes, DifferentialWeightsSumToOneMinusLambdaAndDisperse, ()) {
  const auto m = *rc::gen::inRange<std::size_t>(1, 4), n = *rc::gen::inRange<std::size_t>(1, 12);
  const Matrix z1 = *a_matrix_of_logits_within(5, m, n), z2 = *a_matrix_of_logits_within(5, m, n);
  const double lambda = static_cast<double>(static_cast<float>(*rc::gen::inRange(-20, 40) / 16.0));
  const Matrix w = reference::differential_attention_weights(z1, z2, lambda, fp32);
  for (std::size_t i = 0; i < m; ++i) {
    const std::vector<double> row(w.row(i).begin(), w.row(i).end());
    RC_ASSERT(std::fabs(sum_of(row) - (1 - lambda)) <= rounding_slack(row));
    const auto spread = [&](const Matrix& z) {
      const auto [low, high] = std::minmax_element(z.row(i).begin(), z.row(i).end());
      return *high - *low;
    };
    const double bound =
        (std::exp(spread(z1)) + std::fabs(lambda) * std::exp(spread(z2))) / static_cast<double>(n);
    for (const double x : row) RC_ASSERT(std::fabs(x) <= bound * (1 + 1e-6) + 0x1p-149);
  }
}

}  // namespace
}  // namespace sharpcheck::properties
