// The registry's attention rows (kernels/registry.hpp), each with the derivation of its tolerance.
#include "kernels/attention_designs.hpp"
#include "kernels/registry.hpp"
#include "kernels/registry_adapters.hpp"

namespace sharpcheck::kernels {
namespace {

using namespace adapters;  // NOLINT(google-build-using-namespace): the rows name the adapters

constexpr Tolerance fp8_attention_tolerance{
    .accumulation = &fp32,
    .argument = 3,
    .spread = 9,
    .per_item = 4,
    .constant = 20,
    .dot_product = 6,
    .basis = "analysis: attention_flash plus descales, e4m3 P (relative and subnormal)",
    .reason = "P rounded to e4m3 (u = 2^-4) dominates; tiny weights err absolutely",
    .probabilities_in_output = 2,
    .probability_floor = 0x1.004p-18,
    .probability_format = &fp8_e4m3,
    .floor_over_row_sum = true};

// MXFP8 attention (kernels/mx_attention.hpp), judged against the exact attention of its inputs as
// its declared OCP floor rule quantises them (declared_inputs). On attention_fp8's entry: each dot
// product is of exact e4m3 products summed in fp32 per block of 32, times power-of-two scales, so
// no more rounding than attention_fp8's "dot_product 6"; V's scale multiplies each block's fp32 sum,
// one rounding per block of keys, within "constant 20". P = RN_e4m3(16 exp(s - m)), l summed from
// the same P: a weight >= 2^-6 moves by at most u_e4m3 = 2^-4 relative, "probabilities_in_output 2"
// in e4m3's unit as for attention_fp8 (covering a row sum of either P). A weight below 2^-6 moves by
// at most 2^-10 absolute; the weight of the running max is 16 and a stale max only makes weights
// larger, so l >= 16 Z and the output moves by at most 2^-14 |v_j| / Z per such weight:
// "probability_floor 2^-14" charged against sum_j |v_j| / Z (floor_over_row_sum; 2^-10 margin).
// How the MXFP8 kernel rounds its weights (kernels/mx_attention.hpp): e4m3 at offset 2^4, lazy
// rescaling at 2^4 over tiles of 128 key positions, the row sum over the rounded P. The statistical tier
// is judged around these weights emulated from the exact scores (metrics/quantized_weights.hpp),
// charging only the codes an honest kernel's fp32 scores could round the other way; the proven
// tier keeps the worst case below.
constexpr QuantizedWeights mxfp8_weights{.format = &fp8_e4m3,
                                         .offset_log2 = 4,
                                         .rescale_threshold_log2 = 4,
                                         .tile = 128,
                                         .row_sum_of_rounded = true};

constexpr Tolerance mxfp8_attention_tolerance{
    .accumulation = &fp32,
    .argument = 3,
    .spread = 9,
    .per_item = 4,
    .constant = 20,
    .dot_product = 6,
    .basis = "analysis: attention_fp8 with MX block scales, e4m3 P offset 16 (relative and subnormal)",
    .reason = "P rounded to e4m3 (u = 2^-4) dominates; tiny weights err absolutely",
    .probabilities_in_output = 2,
    .probability_floor = 0x1.004p-14,
    .probability_format = &fp8_e4m3,
    .floor_over_row_sum = true,
    .quantized_weights = &mxfp8_weights};

// SageAttention-2-style attention (kernels/sage_attention.hpp), judged against the exact attention
// of the inputs it computes with (declared_inputs: dequantised Q, K'^ + k~ and dequantised V). On
// attention_fp8's entry: each logit is an exact integer dot product times fl(s_q s_k) and the
// logit's scaling, a few roundings of |s'| <= |z| + |c| within "dot_product 6" (c <= max |z| of
// the keys' mean); V's per-channel scale multiplies each fp32 sum once, within "constant 20"; the
// FP8 MMA's accumulator keeps 22 bits, truncating, so each key's product-add errs by up to
// 2^-21 = 8 u: "per_item 12" (attention_fp8's 4, plus 8). P = RN_e4m3(2^8 exp(s' - m)) and the
// row sum over the fp32 weights: P V alone sees P's rounding, "probabilities_in_output 1" in
// e4m3's unit, with attention_fp8's subnormal floor 2^-18 over Z; the log-sum-exp is charged no P
// rounding (row_sum_of_rounded_probabilities false) but the fp32 error of the correction c it adds
// back (smoothed_keys). The statistical tier is judged around the emulated weights.
constexpr QuantizedWeights sage_weights{.format = &fp8_e4m3,
                                        .offset_log2 = 8,
                                        .rescale_threshold_log2 = 0,
                                        .tile = 64,
                                        .row_sum_of_rounded = false,
                                        .smoothed_keys = true,
                                        .exact_dot_product = true};

constexpr Tolerance sage_attention_tolerance{
    .accumulation = &fp32,
    .argument = 3,
    .spread = 9,
    .per_item = 12,
    .constant = 20,
    .dot_product = 6,
    .basis = "analysis: attention_fp8 with INT8 Q K^T, K smoothing, a 22-bit P V accumulator",
    .reason = "P rounded to e4m3 (u = 2^-4) dominates; tiny weights err absolutely",
    .probabilities_in_output = 1,
    .probability_floor = 0x1.004p-18,
    .probability_format = &fp8_e4m3,
    .row_sum_of_rounded_probabilities = false,
    .floor_over_row_sum = true,
    .quantized_weights = &sage_weights};

template <SageAttentionBug Bug, int ThresholdLog2 = 0>
constexpr AttentionKernel sage_kernel(std::string_view name, std::string_view description) {
  return {.name = name,
          .description = description,
          .input = &bf16,
          .output = &bf16,
          .accumulation = &fp32,
          .deliberately_broken = Bug != SageAttentionBug::none || ThresholdLog2 > 0,
          .run = attention_sage_inputs<Bug, ThresholdLog2>,
          .tolerance = sage_attention_tolerance,
          .declared_inputs = sage_inputs};
}

template <MxAttentionBug Bug, int ThresholdLog2 = 4>
constexpr AttentionKernel mxfp8_kernel(std::string_view name, std::string_view description) {
  return {.name = name,
          .description = description,
          .input = &bf16,
          .output = &bf16,
          .accumulation = &fp32,
          .deliberately_broken = Bug != MxAttentionBug::none || ThresholdLog2 > 4,
          .run = attention_mxfp8_inputs<Bug, ThresholdLog2>,
          .tolerance = mxfp8_attention_tolerance,
          .declared_inputs = mxfp8_floor_inputs};
}

// Kernels written as ports are (kernels/attention_designs.hpp), each judged under the recipe its
// design implies: the recipe is the whole allowance (metrics/recipes.cpp derives it), so these rows
// carry no tolerance of their own.
constexpr AttentionDesign flash2_bf16{.input = &bf16, .output = &bf16};
constexpr AttentionDesign flash2_bf16_fp32_out{.input = &bf16, .output = &fp32};
constexpr AttentionDesign flash2_fp16{.input = &fp16, .output = &fp16};
constexpr AttentionDesign flash2_fp16_fp32_out{.input = &fp16, .output = &fp32};
constexpr AttentionDesign math_bf16{.input = &bf16, .output = &bf16, .math_path = true};
constexpr AttentionDesign math_fp16{.input = &fp16, .output = &fp16, .math_path = true};
template <ForwardBug Bug>
constexpr AttentionDesign flash2_bf16_with{.input = &bf16, .output = &bf16, .bug = Bug};

template <ForwardBug Bug>
constexpr AttentionKernel flash2_twin(std::string_view name, std::string_view description,
                                      bool writes_lse = true) {
  return {.name = name,
          .description = description,
          .input = &bf16,
          .output = &bf16,
          .accumulation = &fp32,
          .deliberately_broken = true,
          .run = run_design<flash2_bf16_with<Bug>>,
          .tolerance = {},
          .recipe = "flash_bf16",
          .writes_lse = writes_lse};
}

constexpr AttentionKernel designed(std::string_view name, std::string_view description,
                                   const AttentionDesign& design,
                                   void (*run)(const Matrix&, const Matrix&, const Matrix&,
                                               const tensor::HeadScores&, Matrix&, std::vector<double>*),
                                   std::string_view recipe) {
  return {.name = name,
          .description = description,
          .input = design.input,
          .output = design.output,
          .accumulation = &fp32,
          .deliberately_broken = false,
          .run = run,
          .tolerance = {},
          .recipe = recipe,
          .writes_lse = !design.math_path};
}

const AttentionKernel attention_table[] = {
    // Attention: a logit formed as an fp32 dot product of length d is within d u sum_t|q_t k_t|
    // |scale/theta| of the exact one (absolute); that error moves numerator and denominator, so
    // "dot_product 2". The output o = sum_j p_j v_j is judged relative to sum_j p_j |v_j|, not
    // |o| (which may cancel to 0); its recursive sum over n keys adds n u, hence "per_item 2".
    {.name = "attention_naive",
     .description = "fp32, materialises the score row, three-pass softmax, weighted sum",
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = attention_naive,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 2,
                   .constant = 16,
                   .dot_product = 2,
                   .basis = "analysis: BHH 2021 softmax plus the weighted sum (n u)",
                   .reason = "score dot products, three-pass softmax, a recursive weighted sum over n keys"}},
    {.name = "attention_flash",
     .description = "fp32, FlashAttention tiles of 64 keys with online softmax; no score row",
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = attention_flash,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 4,
                   .constant = 18,
                   .dot_product = 2,
                   .basis = "analysis: as attention_naive plus per-tile rescaling",
                   .reason = "the accumulator is rescaled by a rounded exp at each tile whose max grows"}},
    {.name = "attention_flash_bf16",
     .description = "bf16 Q, K, V and output, fp32 accumulation, FlashAttention tiles",
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = attention_flash_bf16_inputs,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 4,
                   .constant = 18,
                   .dot_product = 2,
                   .basis = "analysis: as attention_flash, plus one rounding to bf16",
                   .reason = "bf16 inputs are exact in fp32; the output rounding dominates"}},
    // FP8 attention (kernels/fp8_attention.hpp), judged against the exact attention of its
    // dequantised inputs payload * descale. On attention_flash's entry: the logit's dot product of
    // e4m3 payloads is an fp32 dot product whose products are exact; multiplying by fl(qd kd)
    // adds two roundings, 2u |s| <= (2/d) logit_rounding u, so "dot_product 6" covers d >= 1.
    // V dequantised per key, fl(v8 vd), is one more rounding per term: "constant 20". P scaled by
    // 2^8 (exact) and rounded to e4m3: a weight w >= 2^-6 (e4m3's least normal) moves by at most
    // u_e4m3 = 2^-4 relative, which is 16 u_bf16; l is summed from the unrounded weights, and a
    // kernel summing the rounded ones moves l by as much again: "probabilities_in_output 2" in
    // e4m3's unit (probability_format; 32 u_bf16 as before). A weight below 2^-6 moves by at most 2^-10
    // absolute (half of
    // e4m3's subnormal step 2^-9, or the whole of it when it flushes to 0); the largest weight is
    // 256 and rescaling only shrinks earlier tiles' errors, so l >= 256 and the probability moves
    // by at most 2^-18 absolute: "probability_floor 2^-18" (times sum_j |v_j|; 2^-10 margin).
    {.name = "attention_fp8",
     .description = "FlashAttention 3 FP8: e4m3 Q, K, V with per-tensor descales, P in e4m3, bf16 out",
     .input = &fp8_e4m3,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = attention_fp8_inputs<0, 0>,
     .tolerance = fp8_attention_tolerance},
    {.name = "attention_fp8_block",
     .description = "as attention_fp8 with one descale per block of 64 rows of Q, K and V",
     .input = &fp8_e4m3,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = attention_fp8_inputs<64, 0>,
     .tolerance = fp8_attention_tolerance},
    // FlashAttention 4's conditional rescaling (the running max moves only when a tile's max
    // exceeds it by more than 8 in log2 units) is sound with fp32 or bf16 P; with e4m3 P scaled
    // by 2^8 a score 0.807 (log2) above the stale max saturates at 448.
    {.name = "attention_fp8_lazy_rescale",
     .description = "as attention_fp8 with FlashAttention 4's lazy rescaling (P saturates at 448)",
     .input = &fp8_e4m3,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = true,
     .run = attention_fp8_inputs<0, 8>,
     .tolerance = fp8_attention_tolerance},
    // MXFP8 attention as cuDNN and Transformer Engine run it (bf16 in, quantised by the kernel, the
    // OCP floor rule declared), and the bugs of MXFP8 and FP8 ports as twins. The ceil rule where
    // floor is declared and a row sum of the unrounded P fit the worst-case charge for e4m3 P
    // (2^-3 of sum_j p_j |v_j|, bound ratios 0.996 and 0.28); the emulated weights catch them.
    mxfp8_kernel<MxAttentionBug::none>(
        "attention_mxfp8",
        "MXFP8 forward: bf16 Q, K, V quantised to MXFP8 (E8M0 scale per 32, OCP "
        "floor rule), P in e4m3 at offset 16, lazy rescale at 2^4, bf16 out"),
    mxfp8_kernel<MxAttentionBug::none, 6>("attention_mxfp8_lazy_rescale_6",
                                          "as attention_mxfp8 with the lazy-rescale threshold at 2^6, above "
                                          "log2(448/16) = 4.81: P saturates at 448"),
    mxfp8_kernel<MxAttentionBug::v_scale_dropped>("attention_mxfp8_v_scale_dropped",
                                                  "as attention_mxfp8 with V's block scales ignored"),
    mxfp8_kernel<MxAttentionBug::ceil_rule>(
        "attention_mxfp8_ceil_rule",
        "as attention_mxfp8 with its inputs quantised under the ceil "
        "rule (Transformer Engine's) where the OCP floor rule is declared"),
    mxfp8_kernel<MxAttentionBug::row_sum_unrounded>(
        "attention_mxfp8_row_sum_unrounded",
        "as attention_mxfp8 with the row sum over the fp32 "
        "weights before rounding, where the rounded P is declared"),
    mxfp8_kernel<MxAttentionBug::q_scale_missing>("attention_mxfp8_q_scale_missing",
                                                  "as attention_mxfp8 with Q's block scales ignored (q_scale "
                                                  "missing)"),
    // SageAttention 2's design (INT8 Q K^T with K smoothing, FP8 P V with a 22-bit accumulator)
    // and the bugs of INT8/FP8 ports as twins.
    sage_kernel<SageAttentionBug::none>(
        "attention_sage",
        "SageAttention 2 style: bf16 in, INT8 Q K^T per block with K smoothed "
        "by its mean, e4m3 P at offset 2^8 and V per channel, a 22-bit P V "
        "accumulator, fp32 row sum, LSE corrected, bf16 out"),
    sage_kernel<SageAttentionBug::q_scale_missing>("attention_sage_q_scale_missing",
                                                   "as attention_sage with Q's INT8 block scales ignored"),
    sage_kernel<SageAttentionBug::lse_unsmoothed>("attention_sage_lse_unsmoothed",
                                                  "as attention_sage with the log-sum-exp returned without "
                                                  "undoing K's smoothing (q . mean(k) scale missing)"),
    sage_kernel<SageAttentionBug::lse_correction_bf16>("attention_sage_lse_correction_bf16",
                                                       "as attention_sage with the log-sum-exp's correction "
                                                       "q . mean(k) scale formed in bf16"),
    sage_kernel<SageAttentionBug::row_sum_rounded>("attention_sage_row_sum_rounded",
                                                   "as attention_sage with the row sum over the rounded P "
                                                   "where the fp32 weights are declared"),
    sage_kernel<SageAttentionBug::none, 1>("attention_sage_lazy_rescale_1",
                                           "as attention_sage with lazy rescaling at 2^1, above "
                                           "log2(448/256) = 0.807: P saturates at 448"),
    designed("flash2_bf16", "FlashAttention 2/3 forward: bf16 in and out, P in bf16 before P V, fp32 sums",
             flash2_bf16, run_design<flash2_bf16>, "flash_bf16"),
    designed("flash2_bf16_fp32_out", "as flash2_bf16 with the output left in fp32", flash2_bf16_fp32_out,
             run_design<flash2_bf16_fp32_out>, "flash_bf16"),
    designed("flash2_fp16", "FlashAttention 2/3 forward: fp16 in and out, P in fp16 before P V, fp32 sums",
             flash2_fp16, run_design<flash2_fp16>, "flash_fp16"),
    designed("flash2_fp16_fp32_out", "as flash2_fp16 with the output left in fp32", flash2_fp16_fp32_out,
             run_design<flash2_fp16_fp32_out>, "flash_fp16"),
    designed("math_bf16", "PyTorch's math path on bf16: scores rounded twice, fp32 softmax, P in bf16",
             math_bf16, run_design<math_bf16>, "math_bf16"),
    designed("math_fp16", "PyTorch's math path on fp16: scores rounded twice, fp32 softmax, P in fp16",
             math_fp16, run_design<math_fp16>, "math_fp16"),
    flash2_twin<ForwardBug::row_sum_in_bf16>("flash2_bf16_row_sum_bf16",
                                             "broken: the softmax denominator summed in bf16"),
    flash2_twin<ForwardBug::row_sum_in_bf16>(
        "flash2_bf16_row_sum_bf16_no_lse", "broken: the denominator summed in bf16, no LSE to judge", false),
    flash2_twin<ForwardBug::skipped_late_rescale>(
        "flash2_bf16_skipped_rescale",
        "broken: the accumulator not rescaled when a later tile raises the max"),
    flash2_twin<ForwardBug::lse_off_by_1e_3>("flash2_bf16_lse_off", "broken: the log-sum-exp 1e-3 too large"),
    flash2_twin<ForwardBug::lse_in_log2>("flash2_bf16_lse_log2", "broken: the log-sum-exp left in base 2"),
    flash2_twin<ForwardBug::swapped_causal_alignment>("flash2_bf16_swapped_causal",
                                                      "broken: top-left and bottom-right causal swapped"),
    flash2_twin<ForwardBug::softcap_after_bias>("flash2_bf16_softcap_after_bias",
                                                "broken: the soft-cap applied after the bias"),
    flash2_twin<ForwardBug::window_off_by_one>("flash2_bf16_window_off_by_one",
                                               "broken: one key too many left of the sliding window"),
    flash2_twin<ForwardBug::alibi_sign_flipped>("flash2_bf16_alibi_sign",
                                                "broken: the ALiBi bias added with the wrong sign"),
    flash2_twin<ForwardBug::sink_in_log2_units>("flash2_bf16_sink_log2",
                                                "broken: the sink logit read in base-2 units"),
    flash2_twin<ForwardBug::nan_key_tail>("flash2_bf16_nan_tail",
                                          "broken: keys past the last full block of 128 read as NaN"),
    flash2_twin<ForwardBug::p_in_e4m3>("flash2_bf16_p_e4m3_no_lse",
                                       "broken: P rounded to e4m3 where the design says bf16, no LSE", false),
};

}  // namespace

std::span<const AttentionKernel> attention_kernels() { return attention_table; }

const AttentionKernel* find_attention_kernel(std::string_view name) {
  return find_named(attention_kernels(), name);
}

}  // namespace sharpcheck::kernels
