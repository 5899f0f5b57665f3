// The attention backward by its definitions (reference/attention_backward.hpp), term by term at
// 320 bits with Boost's cpp_bin_float (no MPFR or Arb): the independent value every backward test
// checks the reference and its stages against.
#pragma once

#include <cstddef>
#include <vector>

#include "core/matrix.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "independent_reference.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::testing {

struct BackwardProblem {
  Matrix q, k, v, d_out;
  std::vector<double> d_lse;
  tensor::HeadScores scores;
};

struct ExactGradients {
  std::vector<Exact> dq, dk, dv;
  Exact d_sink = 0;
  std::vector<Exact> d_rows;  // D_i per query row
};

// The header's definitions, term by term, at 320 bits.
// A rows x cols matrix of normal(0, sigma) values rounded to `format`.
inline Matrix random_matrix(std::size_t rows, std::size_t cols, double sigma, const FloatFormat& format,
                            DeterministicRandom& random) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = round_to_format(random.normal(0, sigma), format);
  return matrix;
}

inline ExactGradients independent_backward(const BackwardProblem& p) {
  const std::size_t m = p.q.rows, n = p.k.rows, d = p.q.cols, dv = p.v.cols;
  tensor::HeadScores head = p.scores;
  if (head.queries == 0) head.queries = m;
  if (head.keys == 0) head.keys = n;
  if (head.row_stride == 0) head.row_stride = n;
  const Exact scale = head.scale ? Exact(*head.scale) : Exact(1) / sqrt(Exact(d));
  const Exact theta(head.theta), cap(head.softcap);
  ExactGradients g{std::vector<Exact>(m * d, Exact(0)), std::vector<Exact>(n * d, Exact(0)),
                   std::vector<Exact>(n * dv, Exact(0)), Exact(0), std::vector<Exact>(m, Exact(0))};
  std::vector<std::size_t> visible;
  for (std::size_t i = 0; i < m; ++i) {
    head.visible_keys(i, visible);
    std::vector<Exact> z, slope, weight, dp;
    for (const std::size_t j : visible) {
      Exact raw = 0;
      for (std::size_t t = 0; t < d; ++t) raw += Exact(p.q(i, t)) * Exact(p.k(j, t));
      Exact s = scale * raw, ds = scale;
      if (head.softcap != 0) {
        const Exact t = tanh(s / cap);
        s = cap * t;
        ds = scale * (1 - t * t);
      }
      const tensor::HeadScores::BiasTerms bias = head.bias_terms(i, j);
      s += Exact(bias.additive) - Exact(bias.slope) * Exact(static_cast<double>(bias.distance));
      z.push_back(s / theta);
      slope.push_back(ds / theta);
    }
    Exact total = 0;
    for (const Exact& x : z) total += exp(x);
    const Exact sink = head.sink ? exp(Exact(*head.sink) / theta) : Exact(0);
    total += sink;
    Exact big_d = 0;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      weight.push_back(exp(z[a]) / total);
      Exact dot = 0;
      for (std::size_t c = 0; c < dv; ++c) dot += Exact(p.d_out(i, c)) * Exact(p.v(visible[a], c));
      dp.push_back(dot);
      big_d += weight[a] * dot;
    }
    g.d_rows[i] = big_d;
    const Exact lse_gradient = p.d_lse.empty() ? Exact(0) : Exact(p.d_lse[i]);
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const std::size_t j = visible[a];
      const Exact dr = weight[a] * (dp[a] - big_d + lse_gradient) * slope[a];
      for (std::size_t t = 0; t < d; ++t) {
        g.dq[i * d + t] += dr * Exact(p.k(j, t));
        g.dk[j * d + t] += dr * Exact(p.q(i, t));
      }
      for (std::size_t c = 0; c < dv; ++c) g.dv[j * dv + c] += weight[a] * Exact(p.d_out(i, c));
    }
    if (head.sink) g.d_sink += sink / total * (lse_gradient - big_d) / theta;
  }
  return g;
}

}  // namespace sharpcheck::testing
