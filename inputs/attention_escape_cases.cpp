#include "inputs/attention_escape_cases.hpp"

#include <cmath>

#include "core/random.hpp"

namespace sharpcheck::inputs {
namespace {

using tensor::EscapeOperation;
using tensor::EscapeProblem;

Matrix normal_matrix(std::size_t rows, std::size_t cols, double sigma, const FloatFormat& format,
                     DeterministicRandom& random) {
  Matrix m(rows, cols);
  for (double& x : m.values) x = round_to_format(random.normal(0, sigma), format);
  return m;
}

void add_outliers(Matrix& m, const FloatFormat& format, DeterministicRandom& random) {
  for (double& x : m.values) {
    if (random.uniform() < 0.01) x = round_to_format(x * (10 + 90 * random.uniform()), format);
  }
}

// Causal self-attention logits 2 q_i . k_j / sqrt(d), -inf above the diagonal.
Matrix causal_logits(std::size_t n, const FloatFormat& format, DeterministicRandom& random) {
  const Matrix q = normal_matrix(n, 16, 1, fp64, random), k = normal_matrix(n, 16, 1, fp64, random);
  Matrix logits(n, n, -INFINITY);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < 16; ++t) dot += q(i, t) * k(j, t);
      logits(i, j) = round_to_format(2 * dot / 4, format);
    }
  }
  return logits;
}

}  // namespace

std::string_view escape_kind_name(EscapeKind kind) {
  switch (kind) {
    case EscapeKind::linear_normal:
      return "linear_normal";
    case EscapeKind::linear_causal_outliers:
      return "linear_causal_outliers";
    case EscapeKind::selective_head0:
      return "selective_head0";
    case EscapeKind::selective_strong:
      return "selective_strong";
    case EscapeKind::differential_normal:
      return "differential_normal";
    case EscapeKind::differential_cancelling:
      return "differential_cancelling";
  }
  return "?";
}

EscapeOperation escape_kind_operation(EscapeKind kind) {
  switch (kind) {
    case EscapeKind::linear_normal:
    case EscapeKind::linear_causal_outliers:
      return EscapeOperation::linear;
    case EscapeKind::selective_head0:
    case EscapeKind::selective_strong:
      return EscapeOperation::selective;
    default:
      return EscapeOperation::differential;
  }
}

std::size_t escape_kind_keys(EscapeKind) { return 64; }

EscapeProblem make_escape_problem(EscapeKind kind, const FloatFormat& format, std::uint64_t seed) {
  DeterministicRandom random(seed);
  EscapeProblem p;
  p.operation = escape_kind_operation(kind);
  switch (kind) {
    case EscapeKind::linear_normal:
    case EscapeKind::linear_causal_outliers: {
      const std::size_t m = kind == EscapeKind::linear_normal ? 32 : 64;
      p.queries = normal_matrix(m, 16, 1, format, random);
      p.keys = normal_matrix(64, 16, 1, format, random);
      p.values = normal_matrix(64, 16, 1, format, random);
      p.causal = kind == EscapeKind::linear_causal_outliers;
      if (p.causal) {
        add_outliers(p.queries, format, random);
        add_outliers(p.keys, format, random);
      }
      break;
    }
    case EscapeKind::selective_head0:
      p.logits = causal_logits(64, format, random);
      p.selection = p.logits;
      break;
    case EscapeKind::selective_strong:
      p.logits = causal_logits(64, format, random);
      p.selection = Matrix(64, 64, -1.0);
      for (double& x : p.selection.values) {
        if (random.uniform() < 0.05) x = round_to_format(2 + 4 * random.uniform(), format);
      }
      break;
    case EscapeKind::differential_normal:
    case EscapeKind::differential_cancelling: {
      p.logits = normal_matrix(32, 64, 2, format, random);
      const bool cancelling = kind == EscapeKind::differential_cancelling;
      p.logits2 = cancelling ? p.logits : normal_matrix(32, 64, 2, format, random);
      if (cancelling) {
        for (double& x : p.logits2.values) x = round_to_format(x + random.normal(0, 0.1), format);
      }
      p.lambda = round_to_format(cancelling ? 1.25 : 0.35, fp32);
      break;
    }
  }
  return p;
}

}  // namespace sharpcheck::inputs
