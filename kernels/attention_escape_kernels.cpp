#include "kernels/attention_escape_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/registry.hpp"

namespace sharpcheck::kernels {
namespace {

using tensor::EscapeOperation;
using tensor::EscapeProblem;

constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

float at(const Matrix& m, std::size_t r, std::size_t c) { return static_cast<float>(m(r, c)); }

// phi = elu + 1 (x + 1 or e^x); the broken twin's plain elu (x or e^x - 1) can be negative or
// zero, so its denominators cancel.
float feature(float x, bool plain_elu) {
  if (plain_elu) return x > 0 ? x : std::expm1(x);
  return x > 0 ? x + 1.0F : std::exp(x);
}

Matrix linear_fp32(const EscapeProblem& p, bool plain_elu) {
  const std::size_t m = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  std::vector<float> fk(n * d), s(n);
  for (std::size_t e = 0; e < n * d; ++e) fk[e] = feature(static_cast<float>(p.keys.values[e]), plain_elu);
  Matrix out(m, dv);
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t seen = p.causal ? std::min(i + 1, n) : n;
    float total = 0;
    for (std::size_t j = 0; j < seen; ++j) {
      float dot = 0;
      for (std::size_t t = 0; t < d; ++t) dot += feature(at(p.queries, i, t), plain_elu) * fk[j * d + t];
      total += s[j] = dot;
    }
    for (std::size_t c = 0; c < dv; ++c) {
      float sum = 0;
      for (std::size_t j = 0; j < seen; ++j) sum += s[j] * at(p.values, j, c);
      out(i, c) = sum / total;
    }
  }
  return out;
}

// Safe softmax of z over its finite entries (three passes, fp32), into w (masked: 0).
void softmax_row(const std::vector<float>& z, std::vector<float>& w) {
  float top = minus_infinity, total = 0;
  for (const float x : z) top = std::max(top, x);
  w.assign(z.size(), 0.0F);
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (z[j] != minus_infinity) total += w[j] = std::exp(z[j] - top);
  }
  for (float& x : w) x /= total;
}

// F accumulates down the rows in fp32. Row i sees token k < i's selection (the shift); the broken
// twin also applies row i's own selection to itself (no shift).
Matrix selective_fp32(const EscapeProblem& p, bool unshifted) {
  const std::size_t n = p.logits.rows;
  std::vector<float> penalty(n, 0.0F), z, w;
  Matrix out(n, n);
  const auto select_row = [&](std::size_t k) {
    for (std::size_t j = 1; j < k; ++j) penalty[j] += std::max(0.0F, at(p.selection, k, j));
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && !unshifted) select_row(i - 1);
    if (unshifted) select_row(i);
    z.assign(n, minus_infinity);
    for (std::size_t j = 0; j <= i; ++j) {
      if (p.logits(i, j) != -INFINITY) z[j] = at(p.logits, i, j) - penalty[j];
    }
    softmax_row(z, w);
    for (std::size_t j = 0; j < n; ++j) out(i, j) = w[j];
  }
  return out;
}

// w = softmax(z1) - lambda softmax(z2); the broken twin renormalises to sum 1 (divides by 1 - lambda).
Matrix differential_fp32(const EscapeProblem& p, bool renormalised) {
  const std::size_t m = p.logits.rows, n = p.logits.cols;
  const auto lambda = static_cast<float>(p.lambda);
  std::vector<float> z1(n), z2(n), p1, p2;
  Matrix out(m, n);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      z1[j] = at(p.logits, i, j);
      z2[j] = at(p.logits2, i, j);
    }
    softmax_row(z1, p1);
    softmax_row(z2, p2);
    for (std::size_t j = 0; j < n; ++j) {
      const float w = p1[j] - lambda * p2[j];
      out(i, j) = renormalised ? w / (1.0F - lambda) : w;
    }
  }
  return out;
}

// The bf16 forms: inputs are bf16 values (exact in fp32), each result rounded once.
template <Matrix (*Kernel)(const EscapeProblem&, bool)>
Matrix rounded_to_bf16(const EscapeProblem& p) {
  Matrix out = Kernel(p, false);
  for (double& x : out.values) x = round_to_format(x, bf16);
  return out;
}

template <Matrix (*Kernel)(const EscapeProblem&, bool), bool Broken>
Matrix in_fp32(const EscapeProblem& p) {
  return Kernel(p, Broken);
}

const AttentionEscapeKernel registry[] = {
    {"linear_attention", "fp32 linear attention, phi = elu + 1, normalised by sum_j phi(q) . phi(k_j)",
     EscapeOperation::linear, &fp32, false, in_fp32<linear_fp32, false>},
    {"linear_attention_bf16", "bf16 in and out, the fp32 linear attention inside", EscapeOperation::linear,
     &bf16, false, rounded_to_bf16<linear_fp32>},
    {"linear_attention_elu", "broken: phi = elu without the + 1 (features can be negative, sums cancel)",
     EscapeOperation::linear, &fp32, true, in_fp32<linear_fp32, true>},
    {"selective_attention", "fp32 selective attention: F accumulated down the rows in fp32, safe softmax",
     EscapeOperation::selective, &fp32, false, in_fp32<selective_fp32, false>},
    {"selective_attention_bf16", "bf16 in and out, the fp32 selective attention inside",
     EscapeOperation::selective, &bf16, false, rounded_to_bf16<selective_fp32>},
    {"selective_attention_unshifted", "broken: no row shift, a token's selection masks keys for itself too",
     EscapeOperation::selective, &fp32, true, in_fp32<selective_fp32, true>},
    {"differential_attention", "fp32 Differential attention weights softmax(z1) - lambda softmax(z2)",
     EscapeOperation::differential, &fp32, false, in_fp32<differential_fp32, false>},
    {"differential_attention_bf16", "bf16 in and out, the fp32 Differential weights inside",
     EscapeOperation::differential, &bf16, false, rounded_to_bf16<differential_fp32>},
    {"differential_attention_renormalised", "broken: the weights divided by 1 - lambda so they sum to 1",
     EscapeOperation::differential, &fp32, true, in_fp32<differential_fp32, true>},
};

}  // namespace

std::span<const AttentionEscapeKernel> attention_escape_kernels() { return registry; }

const AttentionEscapeKernel* find_attention_escape_kernel(std::string_view name) {
  return find_named(attention_escape_kernels(), name);
}

}  // namespace sharpcheck::kernels
