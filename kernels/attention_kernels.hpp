// The fast attention kernels under test (one head), on native storage, row-major:
// Q is queries x dimension, K keys x dimension, V keys x value_dimension, out queries x
// value_dimension. logits = (q . k) * scale, where scale already folds in 1/theta. With
// `causal`, query i sees keys j <= i (top-left aligned, as the reference). A query that sees no
// key gets zeros.
#pragma once

#include <cstddef>

#include "formats/storage.hpp"

namespace sharpcheck::kernels {

struct AttentionShape {
  std::size_t queries = 0;
  std::size_t keys = 0;
  std::size_t dimension = 0;
  std::size_t value_dimension = 0;
};

// Materialises the row of scores, then the fp32 three-pass softmax, then the weighted sum.
void attention_naive_fp32(const float* q, const float* k, const float* v, float* out,
                          const AttentionShape& shape, float scale, bool causal);
// FlashAttention's loop: tiles of `tile` keys, a running max, sum and output accumulator
// rescaled per tile; the score row is never stored.
void attention_flash_fp32(const float* q, const float* k, const float* v, float* out,
                          const AttentionShape& shape, float scale, bool causal, std::size_t tile = 64);
// The same with bf16 inputs and output and fp32 accumulation.
void attention_flash_bf16(const Bfloat16* q, const Bfloat16* k, const Bfloat16* v, Bfloat16* out,
                          const AttentionShape& shape, float scale, bool causal, std::size_t tile = 64);

}  // namespace sharpcheck::kernels
