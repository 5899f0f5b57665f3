// SageAttention-2-style attention (INT8 Q K^T with K smoothing, FP8 P V), a kernel under test
// (issue 36), with the bugs that INT8/FP8 attention ports had as options (the registry's twins).
//
// The kernel quantises its own bf16 inputs (formats/block_scaled.hpp's integer groups, e4m3):
//   K smoothing: k~ = fp32 mean of K over every key row, K' = fl(K - k~) (softmax-invariant: each
//     row's scores move by c = q . k~ scale / theta), skipped with a soft-cap or a sink, where
//     the shift is not invariant;
//   Q in symmetric INT8 blocks of `q_block` rows, K' in blocks of `k_block` keys, scale
//     RN_fp32(amax / 127), ties to even;
//   V in e4m3 per channel (column), scale RN_fp32(amax_c / 448).
// Per query row (one head; masks and modifiers as tensor/head_scores.hpp says):
//   score   s'_j = logit(fl(i32(q8 . k8) * fl(s_q s_k))): the integer dot product exact;
//   online softmax over tiles of `tile` key positions (their visible keys), the running max moving when a
//   tile's max exceeds it by more than `rescale_threshold_log2` (log2 units; 0: whenever it grows); P =
//   RN_e4m3(min(2^8 exp(s' - m), 448)) (FlashAttention 3's offset: a stale max more than log2(448 / 256) =
//   0.807 below a score saturates P); l summed over the fp32 weights before rounding; P V per block of 32
//   keys in an FP8 MMA whose accumulator keeps 22 significant bits (truncating), each block's sums then added
//   to an fp32 buffer (two-level accumulation); the output buffer_c * s_v,c / l rounded to bf16; the
//   log-sum-exp m + ln(l / 2^8) + c, with c = fl(fl(q^ . k~) scale) / theta in fp32 (q^ the dequantised Q),
//   which undoes the smoothing.
// The exact reference is attention of the inputs the kernel computes with (declared_sage_inputs):
// dequantised Q, K'^ + k~ and dequantised V.
#pragma once

#include <cstddef>
#include <vector>

#include "core/matrix.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

enum class SageAttentionBug {
  none,
  q_scale_missing,      // Q's block scales ignored (q_scale left at 1): every score scaled
  lse_unsmoothed,       // the log-sum-exp returned without the smoothing's correction c
  row_sum_rounded,      // l summed over the rounded P where the fp32 weights are declared
  lse_correction_bf16,  // c formed in bf16, as a wrapper computing q . mean(k) in the inputs' dtype
};

struct SageAttentionOptions {
  std::size_t q_block = 64;
  std::size_t k_block = 64;
  std::size_t tile = 64;
  double rescale_threshold_log2 = 0;
  SageAttentionBug bug = SageAttentionBug::none;
};

// Whether the kernel smooths K for these scores (no soft-cap, no sink).
[[nodiscard]] bool smooths_keys(const tensor::HeadScores& scores);

// The values the kernel computes with, in place: Q dequantised, K as K'^ + k~ (in double), V
// dequantised. `smoothed` as smooths_keys says. InputError for a non-finite entry or mismatched
// shapes.
void declared_sage_inputs(Matrix& queries, Matrix& keys, Matrix& values, bool smoothed,
                          const SageAttentionOptions& options = {});

// out: queries x dv, values of bf16; lse (optional): one fp32 value per query, natural log. A query
// that sees no key and has no sink gets zeros and -inf. InputError for non-finite inputs, a block
// or tile of 0 or mismatched shapes.
void attention_sage(const Matrix& queries, const Matrix& keys, const Matrix& values,
                    const tensor::HeadScores& scores, const SageAttentionOptions& options, Matrix& out,
                    std::vector<double>* lse);

}  // namespace sharpcheck::kernels
