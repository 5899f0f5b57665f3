// MXFP8 attention as cuDNN's and Transformer Engine's MXFP8 forward computes it, a kernel under test
// (issue 36), with the bugs that MXFP8 and FP8 attention ports had as options (the registry's twins).
//
// The kernel quantises its own bf16 inputs to MXFP8 (formats/block_scaled.hpp: e4m3 elements, an
// E8M0 scale per block of 32) under its scale rule: Q and K in blocks along the head dimension, V
// in blocks along the sequence (per column, 32 keys at a time), as the MMAs consume them. Per query
// row (one head; masks and modifiers as tensor/head_scores.hpp says):
//   score   s_j = logit(sum_b fl(sum_{t in b} q_t k_t) 2^(e_q,b + e_k,b)): each block's products of
//           e4m3 codes exact, summed in fp32, times the blocks' power-of-two scales, in fp32;
//   online softmax over tiles of `tile` key positions (their visible keys) with lazy rescaling: the running
//   max moves only when a tile's max exceeds it by more than `rescale_threshold_log2` (log2 units); P =
//   RN_e4m3(2^p_offset_log2 exp(s - m)), saturating at 448: the largest weight is 16 and a stale max lets
//   weights grow to 16 * 2^threshold, which must stay within 448, so a threshold above log2(448 / 16) = 4.807
//   saturates P (the bug class of FlashAttention 4's FP8 path); l summed from the quantised P, the P that P V
//   uses; P V per block of 32 keys and column: fl(sum_j p_j v_j) of e4m3 products, times 2^e_v, in fp32; the
//   output acc / l rounded once to bf16; the log-sum-exp m + log(l / 2^offset) in fp32.
// The exact reference is attention of the inputs as the declared rule quantises them
// (declared_mx_inputs), so a kernel whose quantiser departs from its declared rule is judged on
// the values it should have computed with.
#pragma once

#include <cstddef>
#include <vector>

#include "core/matrix.hpp"
#include "formats/block_scaled.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

// The bugs MXFP8 and FP8 attention ports had (issue 36), one per twin. The last two fit the
// worst-case charge of e4m3 P; the emulated weights (metrics/quantized_weights.hpp) catch them.
enum class MxAttentionBug {
  none,
  v_scale_dropped,    // V's block scales ignored: the output scaled by 2^-e_v (invisible to cosine)
  q_scale_missing,    // Q's block scales ignored: every score scaled, the softmax sharpened or flattened
  ceil_rule,          // the inputs quantised under the ceil rule where the floor rule is declared
  row_sum_unrounded,  // l summed over the fp32 weights before rounding, P V over the rounded ones
};

struct MxAttentionOptions {
  ScaleRule rule = ScaleRule::ocp_floor;  // the declared rule
  int p_offset_log2 = 4;                  // P = 2^offset exp(s - m)
  double rescale_threshold_log2 = 4;      // lazy rescaling; 0: rescale whenever the max grows
  std::size_t tile = 128;
  MxAttentionBug bug = MxAttentionBug::none;
  // An honest variant of the same design, for tests that an allowance does not depend on the
  // arithmetic's order: each score's blocks summed last to first, and the weights formed as a GPU
  // kernel forms them, exp2f((s - m) * log2(e)) with log2(e) in fp32.
  bool reordered_arithmetic = false;
};

// The values a kernel declaring `rule` computes with: Q and K (rows x d) quantised in blocks of 32
// along each row, V (keys x dv) in blocks of 32 keys down each column, each decoded exactly.
// InputError for a non-finite entry (an MX block would be NaN).
void declared_mx_inputs(Matrix& queries, Matrix& keys, Matrix& values, ScaleRule rule);

// out: queries x dv, values of bf16; lse (optional): one fp32 value per query, natural log. A query
// that sees no key and has no sink gets zeros and -inf. InputError for non-finite inputs, a tile of
// 0 keys or mismatched shapes.
void attention_mxfp8(const Matrix& queries, const Matrix& keys, const Matrix& values,
                     const tensor::HeadScores& scores, const MxAttentionOptions& options, Matrix& out,
                     std::vector<double>* lse);

}  // namespace sharpcheck::kernels
