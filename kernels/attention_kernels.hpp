// The fast attention kernels under test (one head), on native storage, row-major:
// Q is queries x dimension, K keys x dimension, V keys x value_dimension, out queries x
// value_dimension, lse (optional) one float per query. Scores, masks and modifiers are as
// tensor/head_scores.hpp defines them. Without soft-cap or bias the logit is
// fl(q . k) * fl(scale / theta) (one multiplier, as fused kernels fold it); with them (or a
// sink) it is
// ((cap tanh(fl(q . k) fl(scale) / cap)) + fl(bias)) * fl(1 / theta). A query that sees no key
// and has no sink gets zeros and log-sum-exp -inf, as FlashAttention does.
#pragma once

#include <cstddef>

#include "formats/storage.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

struct AttentionShape {
  std::size_t queries = 0;
  std::size_t keys = 0;
  std::size_t dimension = 0;
  std::size_t value_dimension = 0;
};

// Materialises the row of scores, then the fp32 three-pass softmax, then the weighted sum.
void attention_naive_fp32(const float* q, const float* k, const float* v, float* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores);
// FlashAttention's loop: tiles of `tile` visible keys, a running max, sum and output accumulator
// rescaled per tile (a sink starts the running max and sum); the score row is never stored.
void attention_flash_fp32(const float* q, const float* k, const float* v, float* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores,
                          std::size_t tile = 64);
// The same with bf16 inputs and output, fp32 accumulation and an fp32 log-sum-exp.
void attention_flash_bf16(const Bfloat16* q, const Bfloat16* k, const Bfloat16* v, Bfloat16* out, float* lse,
                          const AttentionShape& shape, const tensor::HeadScores& scores,
                          std::size_t tile = 64);

}  // namespace sharpcheck::kernels
