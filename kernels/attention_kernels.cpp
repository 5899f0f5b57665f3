#include "kernels/attention_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/float_arithmetic.hpp"
#include "kernels/logit_maker.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {

void attention_naive_fp32(const float* q, const float* k, const float* v, float* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores) {
  const LogitMaker logit(scores, shape.dimension);
  std::vector<std::size_t> visible;
  std::vector<float> logits(shape.keys + 1);
  std::vector<float> weights(shape.keys + 1);
  for (std::size_t i = 0; i < shape.queries; ++i) {
    scores.visible_keys(i, visible);
    float* row_out = out + i * shape.value_dimension;
    std::fill(row_out, row_out + shape.value_dimension, 0.0F);
    const std::size_t count = visible.size() + (logit.has_sink() ? 1 : 0);
    if (lse != nullptr) lse[i] = -std::numeric_limits<float>::infinity();
    if (count == 0) continue;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const float d = dot(q + i * shape.dimension, k + visible[a] * shape.dimension, shape.dimension);
      logits[a] = logit.row_value(d, i, visible[a]);
    }
    if (logit.has_sink()) logits[visible.size()] = logit.sink();
    softmax_safe3_fp32(logits.data(), weights.data(), count, logit.row_scale());
    for (std::size_t a = 0; a < visible.size(); ++a) {
      for (std::size_t c = 0; c < shape.value_dimension; ++c)
        row_out[c] += weights[a] * v[visible[a] * shape.value_dimension + c];
    }
    if (lse != nullptr) {
      const float largest =
          *std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(count));
      float sum = 0.0F;
      for (std::size_t a = 0; a < count; ++a) sum += std::exp((logits[a] - largest) * logit.row_scale());
      lse[i] = largest * logit.row_scale() + std::log(sum);
    }
  }
}

void attention_flash_fp32(const float* q, const float* k, const float* v, float* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores, std::size_t tile) {
  const LogitMaker logit(scores, shape.dimension);
  std::vector<std::size_t> visible;
  std::vector<float> tile_scores(tile);
  std::vector<float> accumulator(shape.value_dimension);
  for (std::size_t i = 0; i < shape.queries; ++i) {
    scores.visible_keys(i, visible);
    // A sink is a first entry with no value: it starts the running max and sum.
    float running_max = logit.has_sink() ? logit.sink() : -std::numeric_limits<float>::infinity();
    float running_sum = logit.has_sink() ? 1.0F : 0.0F;
    std::fill(accumulator.begin(), accumulator.end(), 0.0F);
    for (std::size_t start = 0; start < visible.size(); start += tile) {
      const std::size_t length = std::min(tile, visible.size() - start);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < length; ++j) {
        const std::size_t key = visible[start + j];
        tile_scores[j] =
            logit(dot(q + i * shape.dimension, k + key * shape.dimension, shape.dimension), i, key);
        tile_max = std::max(tile_max, tile_scores[j]);
      }
      const float new_max = std::max(running_max, tile_max);
      const float rescale = std::exp(running_max - new_max);  // exp(-inf) = 0 on the first tile
      running_sum *= rescale;
      for (float& a : accumulator) a *= rescale;
      for (std::size_t j = 0; j < length; ++j) {
        const float w = std::exp(tile_scores[j] - new_max);
        running_sum += w;
        const float* value = v + visible[start + j] * shape.value_dimension;
        for (std::size_t c = 0; c < shape.value_dimension; ++c) accumulator[c] += w * value[c];
      }
      running_max = new_max;
    }
    const bool empty = running_sum == 0.0F;
    float* row_out = out + i * shape.value_dimension;
    for (std::size_t c = 0; c < shape.value_dimension; ++c)
      row_out[c] = empty ? 0.0F : accumulator[c] / running_sum;
    if (lse != nullptr)
      lse[i] = empty ? -std::numeric_limits<float>::infinity() : running_max + std::log(running_sum);
  }
}

void attention_flash_bf16(const Bfloat16* q, const Bfloat16* k, const Bfloat16* v, Bfloat16* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores, std::size_t tile) {
  const auto widen = [](const Bfloat16* values, std::size_t count) {
    std::vector<float> wide(count);
    for (std::size_t i = 0; i < count; ++i) wide[i] = values[i].to_float();
    return wide;
  };
  const std::vector<float> q32 = widen(q, shape.queries * shape.dimension);
  const std::vector<float> k32 = widen(k, shape.keys * shape.dimension);
  const std::vector<float> v32 = widen(v, shape.keys * shape.value_dimension);
  std::vector<float> out32(shape.queries * shape.value_dimension);
  attention_flash_fp32(q32.data(), k32.data(), v32.data(), out32.data(), lse, shape, scores, tile);
  for (std::size_t i = 0; i < out32.size(); ++i) out[i] = Bfloat16::from_float(out32[i]);
}

}  // namespace sharpcheck::kernels
