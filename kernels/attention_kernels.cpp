#include "kernels/attention_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
namespace {

float dot(const float* a, const float* b, std::size_t length) {
  float sum = 0.0F;
  for (std::size_t t = 0; t < length; ++t) sum += a[t] * b[t];
  return sum;
}

std::size_t visible_keys(const AttentionShape& shape, std::size_t query, bool causal) {
  return causal ? std::min(shape.keys, query + 1) : shape.keys;
}

}  // namespace

void attention_naive_fp32(const float* q, const float* k, const float* v, float* out,
                          const AttentionShape& shape, float scale, bool causal) {
  std::vector<float> scores(shape.keys);
  std::vector<float> weights(shape.keys);
  for (std::size_t i = 0; i < shape.queries; ++i) {
    const std::size_t visible = visible_keys(shape, i, causal);
    float* row_out = out + i * shape.value_dimension;
    std::fill(row_out, row_out + shape.value_dimension, 0.0F);
    if (visible == 0) continue;
    for (std::size_t j = 0; j < visible; ++j)
      scores[j] = dot(q + i * shape.dimension, k + j * shape.dimension, shape.dimension);
    softmax_safe3_fp32(scores.data(), weights.data(), visible, scale);
    for (std::size_t j = 0; j < visible; ++j) {
      for (std::size_t c = 0; c < shape.value_dimension; ++c)
        row_out[c] += weights[j] * v[j * shape.value_dimension + c];
    }
  }
}

void attention_flash_fp32(const float* q, const float* k, const float* v, float* out,
                          const AttentionShape& shape, float scale, bool causal, std::size_t tile) {
  std::vector<float> scores(tile);
  std::vector<float> accumulator(shape.value_dimension);
  for (std::size_t i = 0; i < shape.queries; ++i) {
    const std::size_t visible = visible_keys(shape, i, causal);
    float running_max = -std::numeric_limits<float>::infinity();
    float running_sum = 0.0F;
    std::fill(accumulator.begin(), accumulator.end(), 0.0F);
    for (std::size_t start = 0; start < visible; start += tile) {
      const std::size_t length = std::min(tile, visible - start);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < length; ++j) {
        scores[j] = dot(q + i * shape.dimension, k + (start + j) * shape.dimension, shape.dimension) * scale;
        tile_max = std::max(tile_max, scores[j]);
      }
      const float new_max = std::max(running_max, tile_max);
      const float rescale = std::exp(running_max - new_max);  // exp(-inf) = 0 on the first tile
      running_sum *= rescale;
      for (float& a : accumulator) a *= rescale;
      for (std::size_t j = 0; j < length; ++j) {
        const float w = std::exp(scores[j] - new_max);
        running_sum += w;
        const float* value = v + (start + j) * shape.value_dimension;
        for (std::size_t c = 0; c < shape.value_dimension; ++c) accumulator[c] += w * value[c];
      }
      running_max = new_max;
    }
    float* row_out = out + i * shape.value_dimension;
    for (std::size_t c = 0; c < shape.value_dimension; ++c) {
      row_out[c] = visible == 0 ? 0.0F : accumulator[c] / running_sum;
    }
  }
}

void attention_flash_bf16(const Bfloat16* q, const Bfloat16* k, const Bfloat16* v, Bfloat16* out,
                          const AttentionShape& shape, float scale, bool causal, std::size_t tile) {
  const auto widen = [](const Bfloat16* values, std::size_t count) {
    std::vector<float> wide(count);
    for (std::size_t i = 0; i < count; ++i) wide[i] = values[i].to_float();
    return wide;
  };
  const std::vector<float> q32 = widen(q, shape.queries * shape.dimension);
  const std::vector<float> k32 = widen(k, shape.keys * shape.dimension);
  const std::vector<float> v32 = widen(v, shape.keys * shape.value_dimension);
  std::vector<float> out32(shape.queries * shape.value_dimension);
  attention_flash_fp32(q32.data(), k32.data(), v32.data(), out32.data(), shape, scale, causal, tile);
  for (std::size_t i = 0; i < out32.size(); ++i) out[i] = Bfloat16::from_float(out32[i]);
}

}  // namespace sharpcheck::kernels
