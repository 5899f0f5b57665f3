#include "inputs/attention_backward_cases.hpp"

#include <cmath>

#include "core/random.hpp"

namespace sharpcheck::inputs {
namespace {

Matrix normal_matrix(std::size_t rows, std::size_t cols, double sigma, DeterministicRandom& random) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = random.normal(0, sigma);
  return matrix;
}

// A rank-4 matrix sum_r s_r u_r w^T_r with s_r = 8, 4, 2, 1 (times sqrt(d) / sqrt(rows)), plus a
// little noise: the few large singular values trained attention heads show.
Matrix low_rank(std::size_t rows, std::size_t cols, const Matrix& basis, DeterministicRandom& random) {
  Matrix matrix = normal_matrix(rows, cols, 0.05, random);
  for (std::size_t r = 0; r < basis.rows; ++r) {
    const double strength = std::ldexp(8.0, -static_cast<int>(r));
    for (std::size_t i = 0; i < rows; ++i) {
      const double u = random.normal(0, 1) * strength;
      for (std::size_t c = 0; c < cols; ++c) matrix(i, c) += u * basis(r, c);
    }
  }
  return matrix;
}

void add_outliers(Matrix& matrix, DeterministicRandom& random) {
  for (double& x : matrix.values) {
    if (random.uniform() < 1e-3) x *= random.uniform(10, 100);
  }
}

void round_all(BackwardInputs& in, const FloatFormat& format) {
  for (Matrix* m : {&in.queries, &in.keys, &in.values, &in.d_out}) {
    for (double& x : m->values) x = round_to_format(x, format);
  }
  for (double& x : in.d_lse) x = round_to_format(x, format);
}

BackwardInputs shaped(const BackwardShape& shape, DeterministicRandom& random) {
  return {normal_matrix(shape.queries, shape.dim, 1, random),
          normal_matrix(shape.keys, shape.dim, 1, random),
          normal_matrix(shape.keys, shape.dim, 1, random),
          normal_matrix(shape.queries, shape.dim, 1, random),
          {},
          {}};
}

}  // namespace

std::string_view backward_kind_name(BackwardKind kind) {
  switch (kind) {
    case BackwardKind::normal_causal:
      return "normal_causal";
    case BackwardKind::low_rank:
      return "low_rank";
    case BackwardKind::outliers:
      return "outliers";
    case BackwardKind::repeated_maxima:
      return "repeated_maxima";
    case BackwardKind::near_softcap:
      return "near_softcap";
    case BackwardKind::one_dominant_key:
      return "one_dominant_key";
    case BackwardKind::fully_masked_rows:
      return "fully_masked_rows";
    case BackwardKind::sink_and_lse:
      return "sink_and_lse";
    case BackwardKind::alibi_window:
      return "alibi_window";
  }
  return "?";
}

BackwardShape backward_shape(BackwardKind kind) {
  switch (kind) {
    case BackwardKind::normal_causal:
      return {96, 96, 64};
    case BackwardKind::low_rank:
    case BackwardKind::outliers:
      return {64, 256, 64};
    case BackwardKind::repeated_maxima:
      return {48, 192, 32};
    case BackwardKind::one_dominant_key:
      return {8, 1024, 64};
    case BackwardKind::fully_masked_rows:
      return {40, 24, 32};
    case BackwardKind::alibi_window:
      return {64, 160, 32};
    case BackwardKind::near_softcap:
    case BackwardKind::sink_and_lse:
      break;
  }
  return {64, 128, 32};
}

BackwardInputs make_backward_inputs(BackwardKind kind, const FloatFormat& format, std::uint64_t seed) {
  DeterministicRandom random(seed);
  const BackwardShape shape = backward_shape(kind);
  BackwardInputs in = shaped(shape, random);
  switch (kind) {
    case BackwardKind::normal_causal:
      in.scores.causal = true;
      break;
    case BackwardKind::low_rank: {
      const Matrix basis = normal_matrix(4, shape.dim, 1.0 / 8, random);  // rows of norm ~1
      in.queries = low_rank(shape.queries, shape.dim, basis, random);
      in.keys = low_rank(shape.keys, shape.dim, basis, random);
      break;
    }
    case BackwardKind::outliers:
      add_outliers(in.queries, random);
      add_outliers(in.keys, random);
      break;
    case BackwardKind::repeated_maxima:  // every key repeated four times
      for (std::size_t j = shape.keys / 4; j < shape.keys; ++j) {
        for (std::size_t t = 0; t < shape.dim; ++t) in.keys(j, t) = in.keys(j % (shape.keys / 4), t);
      }
      break;
    case BackwardKind::near_softcap:
      for (double& x : in.queries.values) x *= 2.5;  // raw scores of size ~5 against the cap 5
      in.scores.softcap = 5;
      break;
    case BackwardKind::one_dominant_key:
      for (std::size_t i = 0; i < shape.queries; ++i) {  // key 900 + 13 i: q_i times 0.75, a score of about 6
        for (std::size_t t = 0; t < shape.dim; ++t) in.keys(900 + 13 * i, t) = 0.75 * in.queries(i, t);
      }
      break;
    case BackwardKind::fully_masked_rows:  // 16 of the 40 queries see no key
      in.scores.causal = true;
      in.scores.alignment = tensor::DiagonalAlignment::bottom_right;
      break;
    case BackwardKind::sink_and_lse:
      in.scores.sink = 1.0;
      for (std::size_t i = 0; i < shape.queries; ++i) in.d_lse.push_back(random.normal(0, 1));
      break;
    case BackwardKind::alibi_window:
      in.scores.alibi_slope = 0.25;
      in.scores.window_left = 48;
      in.scores.window_right = 0;
      in.scores.alignment = tensor::DiagonalAlignment::bottom_right;
      break;
  }
  round_all(in, format);
  return in;
}

}  // namespace sharpcheck::inputs
