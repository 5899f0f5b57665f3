#include "metrics/judge_attention_escapes.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "metrics/tolerance_table.hpp"
#include "reference/attention_escapes.hpp"

// The allowances, to first order in u = 2^-24 (fp32) with a 1% margin for the second-order terms
// (every count below times u is under 1e-3 for the sizes judged) and for evaluating them in double.
// glibc's expf and expm1f are within 1 ulp (relative 2u); each other operation rounds once (u).
//
// Linear attention, O_ic = sum_j s_j v_jc / D, s_j = sum_t phi(q_t) phi(k_jt), D = sum_j s_j:
//   phi: u (x + 1) or 2u (e^x); a product: u; s_j, d positive terms summed: (d + 2) u relative;
//   D, n positive terms: (n + d + 1) u relative; N_c = sum_j s_j v_jc: (n + d + 2) u sum_j |s_j v_jc|;
//   the quotient: u |O|. With |N| <= sum |s v| and |O| <= sum_j A_j |v_jc| (A_j = s_j / D):
//   |error| <= (2n + 2d + 4) u sum_j A_j |v_jc|.
// Selective attention, w_j = softmax over j <= i of z_j = logits_ij - F_ij:
//   F_ij, i positive terms accumulated in fp32: i u F_ij; z = logits - F: u |z|. So
//   E_j = u (|z_j| + i F_ij) bounds |z_j computed - z_j|, and softmax moves by at most
//   E_j + max_k E_k relative (log w_j = z_j - LSE, LSE 1-Lipschitz in the max norm). The safe
//   softmax on the computed z: u |z_j - m| + 2u (exp) + (n - 1) u (sum) + u (quotient) + the
//   largest term's u |z_k - m| + 2u through the sum: R_j = E_j + max E + u (|z_j - m| +
//   max_k |z_k - m|) + (n + 4) u relative, allowed w_j (e^R_j - 1).
// Differential attention, w = p1 - lambda p2 (lambda an fp32 value, exact): each softmax as above
//   with E = 0 (R1_j, R2_j), the product u |lambda p2_j|, the difference u |w_j|:
//   p1_j R1_j + |lambda| p2_j (R2_j + u) + u |w_j|.
// A bf16 kernel rounds the fp32 result once: 2 u_out |expected| (the comparison's own term) plus
// u_out times the fp32 allowance, charged as the factor 1 + 2 u_out.

namespace sharpcheck::metrics {
namespace {

constexpr double u = 0x1p-24;
constexpr double margin = 1.01;

double feature(double x) { return x > 0 ? x + 1 : std::exp(x); }

Matrix linear_allowance(const tensor::EscapeProblem& p) {
  const std::size_t m = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  Matrix allowed(m, dv);
  std::vector<double> s(n);
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t seen = p.causal ? std::min(i + 1, n) : n;
    double total = 0;
    for (std::size_t j = 0; j < seen; ++j) {
      s[j] = 0;
      for (std::size_t t = 0; t < d; ++t) s[j] += feature(p.queries(i, t)) * feature(p.keys(j, t));
      total += s[j];
    }
    for (std::size_t c = 0; c < dv; ++c) {
      double mass = 0;
      for (std::size_t j = 0; j < seen; ++j) mass += s[j] / total * std::fabs(p.values(j, c));
      allowed(i, c) = margin * static_cast<double>(2 * seen + 2 * d + 4) * u * mass;
    }
  }
  return allowed;
}

// Relative allowances R_j of a safe softmax over finite z with logit errors E (may be empty).
std::vector<double> softmax_relative(const std::vector<double>& z, const std::vector<double>& error) {
  double top = -INFINITY, worst_error = 0, widest = 0;
  std::size_t n = 0;
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (z[j] == -INFINITY) continue;
    top = std::max(top, z[j]);
    ++n;
  }
  // The worst argument error over the entries that weigh (an entry negligible_below under the top
  // weighs under e^-200 whatever its own error: a -1e9 mask's u 1e9 must not widen every allowance).
  for (std::size_t j = 0; j < z.size() && !error.empty(); ++j) {
    if (z[j] != -INFINITY && top - z[j] <= negligible_below) worst_error = std::max(worst_error, error[j]);
  }
  // The denominator's error is the weighted mean of its terms' argument errors: entries more than
  // negligible_below under the top (an additive mask of -1e9, say) weigh under e^-200 and add at
  // most negligible_contribution each (metrics/tolerance_table.cpp), not their spread.
  std::size_t negligible = 0;
  for (const double x : z) {
    if (x == -INFINITY) continue;
    if (top - x > negligible_below) {
      ++negligible;
    } else {
      widest = std::max(widest, top - x);
    }
  }
  std::vector<double> relative(z.size(), 0.0);
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (z[j] == -INFINITY) continue;
    const double own = error.empty() ? 0.0 : error[j];
    relative[j] = own + worst_error + u * ((top - z[j]) + widest) + static_cast<double>(n + 4) * u +
                  static_cast<double>(negligible) * negligible_contribution;
  }
  return relative;
}

std::vector<double> softmax_of(const std::vector<double>& z) {
  double top = -INFINITY, total = 0;
  for (const double x : z) top = std::max(top, x);
  std::vector<double> w(z.size(), 0.0);
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (z[j] != -INFINITY) total += w[j] = std::exp(z[j] - top);
  }
  for (double& x : w) x /= total;
  return w;
}

Matrix selective_allowance(const tensor::EscapeProblem& p) {
  const std::size_t n = p.logits.rows;
  Matrix allowed(n, n);
  std::vector<double> penalty(n, 0.0), z, error;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 1; i > 0 && j + 1 < i; ++j) penalty[j] += std::max(0.0, p.selection(i - 1, j));
    z.assign(n, -INFINITY);
    error.assign(n, 0.0);
    for (std::size_t j = 0; j <= i; ++j) {
      if (p.logits(i, j) == -INFINITY) continue;
      z[j] = p.logits(i, j) - penalty[j];
      error[j] = u * (std::fabs(z[j]) + static_cast<double>(i) * penalty[j]);
    }
    const auto w = softmax_of(z);
    const auto relative = softmax_relative(z, error);
    for (std::size_t j = 0; j < n; ++j) allowed(i, j) = margin * w[j] * std::expm1(relative[j]);
  }
  return allowed;
}

Matrix differential_allowance(const tensor::EscapeProblem& p) {
  const std::size_t m = p.logits.rows, n = p.logits.cols;
  Matrix allowed(m, n);
  std::vector<double> z1(n), z2(n);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      z1[j] = p.logits(i, j);
      z2[j] = p.logits2(i, j);
    }
    const auto p1 = softmax_of(z1), p2 = softmax_of(z2);
    const auto r1 = softmax_relative(z1, {}), r2 = softmax_relative(z2, {});
    const double lambda = std::fabs(p.lambda);
    for (std::size_t j = 0; j < n; ++j) {
      const double w = std::fabs(p1[j] - p.lambda * p2[j]);
      allowed(i, j) = margin * (p1[j] * r1[j] + lambda * p2[j] * (r2[j] + u) + u * w);
    }
  }
  return allowed;
}

Matrix reference_result(const tensor::EscapeProblem& p, const FloatFormat& output) {
  switch (p.operation) {
    case tensor::EscapeOperation::linear:
      return reference::linear_attention(p.queries, p.keys, p.values, p.causal, output).outputs;
    case tensor::EscapeOperation::selective:
      return reference::selective_attention_weights(p.logits, p.selection, output);
    case tensor::EscapeOperation::differential:
      return reference::differential_attention_weights(p.logits, p.logits2, p.lambda, output);
  }
  return {};
}

}  // namespace

Matrix escape_arithmetic_allowance(const tensor::EscapeProblem& p) {
  switch (p.operation) {
    case tensor::EscapeOperation::linear:
      return linear_allowance(p);
    case tensor::EscapeOperation::selective:
      return selective_allowance(p);
    case tensor::EscapeOperation::differential:
      return differential_allowance(p);
  }
  return {};
}

EscapeJudgement judge_attention_escape(const tensor::EscapeProblem& p, const FloatFormat& output,
                                       const Matrix& actual) {
  EscapeJudgement judgement{reference_result(p, output), {}};
  const Matrix& expected = judgement.expected;
  if (actual.rows != expected.rows || actual.cols != expected.cols)
    throw InputError(InputProblem::shape_mismatch,
                     std::string(tensor::escape_operation_name(p.operation)) + ": the result is " +
                         std::to_string(actual.rows) + "x" + std::to_string(actual.cols) + ", expected " +
                         std::to_string(expected.rows) + "x" + std::to_string(expected.cols));
  Matrix additional = escape_arithmetic_allowance(p);
  for (double& x : additional.values) x *= 1 + 2 * output.unit_roundoff();
  Matrix magnitudes = expected, zeros(expected.rows, expected.cols);
  for (double& x : magnitudes.values) x = std::fabs(x);
  RowScale scale;
  scale.n = expected.cols;
  Tolerance none;  // every unit is in `additional`; the comparison adds the output rounding
  ComparisonInput input{&expected, &actual, &magnitudes, &zeros, std::vector<RowScale>(expected.rows, scale),
                        false};
  input.output_rounding_of_expected = true;
  input.additional = &additional;
  judgement.comparison = compare(input, none, output);
  return judgement;
}

}  // namespace sharpcheck::metrics
