// Attention kernels written the way ports are written, one per precision recipe
// (metrics/recipes.hpp) they must pass under, and broken twins that each carry one bug class real
// ports shipped. They are what makes the recipes' verdicts testable in the gate: an honest kernel
// of each design must pass its recipe (and the default judgement, which tries every recipe), and
// no recipe may fit a twin.
//
//   flash: FlashAttention 2/3's forward. Tiles of 64 keys, a running max and fp32 row sum of the
//          unrounded exponentials w = exp(z - max), each w rounded to the input format before it
//          multiplies V (the P V product runs on the tensor cores in bf16/fp16), the fp32
//          accumulator divided by the sum and rounded to the output format; the log-sum-exp in fp32.
//   math:  PyTorch's math path on bf16/fp16 tensors: q.k accumulated in fp32 and rounded, the
//          scaled (capped, biased) score rounded again, an fp32 softmax of those scores with P
//          rounded, P V accumulated in fp32 and rounded. It returns no log-sum-exp.
//
// The bugs (each in the flash design):
//   row_sum_in_bf16:          the denominator accumulated in bf16 (every row mis-normalised by
//                             up to ~1%); with or without the log-sum-exp handed over;
//   skipped_late_rescale:     the accumulator not rescaled when a later tile raises the max;
//   lse_off_by_1e-3:          the log-sum-exp 1e-3 too large (a bias in a split-KV merge);
//   lse_in_log2:              the log-sum-exp left in base 2 (an exp2 kernel's convention);
//   swapped_causal_alignment: top-left causal where bottom-right is asked, and the reverse;
//   softcap_after_bias:       cap tanh((s + bias) / cap) instead of cap tanh(s / cap) + bias;
//   window_off_by_one:        one key too many on the left of the sliding window;
//   alibi_sign_flipped:       + slope distance instead of - slope distance;
//   sink_in_log2_units:       the sink logit read as a base-2 logit (times log2 e);
//   nan_key_tail:             keys past the last full block of 128 read as NaN (an unmasked tail);
//   p_in_e4m3:                P rounded to fp8 e4m3 before P V where the design says bf16 (an FP8
//                             port's P wired into a bf16 kernel), with no log-sum-exp to judge.
#pragma once

#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

enum class ForwardBug {
  none,
  row_sum_in_bf16,
  skipped_late_rescale,
  lse_off_by_1e_3,
  lse_in_log2,
  swapped_causal_alignment,
  softcap_after_bias,
  window_off_by_one,
  alibi_sign_flipped,
  sink_in_log2_units,
  nan_key_tail,
  p_in_e4m3,
};

struct AttentionDesign {
  const FloatFormat* input = &bf16;   // Q, K, V are values of it; P is rounded to it
  const FloatFormat* output = &bf16;  // the output's format
  bool math_path = false;             // PyTorch's math path instead of FlashAttention's loop
  ForwardBug bug = ForwardBug::none;
};

// One head (shapes as kernels/registry.hpp's AttentionKernel::run). Throws InputError when an
// input is not a value of design.input. The log-sum-exp is written only by the flash design.
void attention_by_design(const AttentionDesign& design, const Matrix& queries, const Matrix& keys,
                         const Matrix& values, const tensor::HeadScores& scores, Matrix& out,
                         std::vector<double>* lse);

// The registry's entry point for one design.
template <const AttentionDesign& Design>
void run_design(const Matrix& queries, const Matrix& keys, const Matrix& values,
                const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse) {
  attention_by_design(Design, queries, keys, values, scores, out, lse);
}

}  // namespace sharpcheck::kernels
