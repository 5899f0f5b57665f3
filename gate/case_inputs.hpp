// The inputs of the gate's cases, made the same way for built-in kernels and plugins: one row of
// generated logits (inputs/rows.hpp), or attention over normal Q, K, V of a fixed shape.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::gate {

inline constexpr const char* attention_input = "attention_normal";
inline constexpr std::size_t attention_queries = 4;
inline constexpr std::size_t attention_dimension = 64;
// A backward case's input: this prefix and an inputs::BackwardKind's name.
inline constexpr std::string_view backward_input_prefix = "backward_";

[[nodiscard]] inline Matrix one_row(const std::vector<double>& row) {
  Matrix matrix(1, row.size());
  std::copy(row.begin(), row.end(), matrix.values.begin());
  return matrix;
}

[[nodiscard]] inline Matrix normal_matrix(std::size_t rows, std::size_t cols, DeterministicRandom& random,
                                          const FloatFormat& format) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = round_to_format(random.normal(0, 1), format);
  return matrix;
}

// Q (4 x 64), K and V (n x 64) in this order from one stream: the case's seed fixes all three.
struct AttentionInputs {
  Matrix q, k, v;
};
[[nodiscard]] inline AttentionInputs attention_inputs(std::size_t n, std::uint64_t seed,
                                                      const FloatFormat& format) {
  DeterministicRandom random(seed);
  Matrix q = normal_matrix(attention_queries, attention_dimension, random, format);
  Matrix k = normal_matrix(n, attention_dimension, random, format);
  Matrix v = normal_matrix(n, attention_dimension, random, format);
  return {std::move(q), std::move(k), std::move(v)};
}

}  // namespace sharpcheck::gate
