#include "kernels/registry.hpp"

#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.hpp"
#include "kernels/escape_kernels.hpp"
#include "kernels/quantized_softmax.hpp"
#include "kernels/registry_adapters.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
namespace {

using namespace adapters;  // NOLINT(google-build-using-namespace): the rows name the adapters

// Derivation (Blanchard, Higham & Higham, "Accurately computing the log-sum-exp and softmax
// functions", IMA J. Numer. Anal. 41, 2021, section 3, adapted to what each kernel does):
//
// A shifted kernel forms a_j = fl(fl(e_j - m) * fl(1/theta)): three roundings, so
// a_j = z_j (1 + d), |d| <= 3u + O(u^2), and exp(a_j) = exp(z_j) exp(z_j d): relative error
// 3u|z_j| from the argument ("argument 3"). Every exp is within 2u relative: the SIMD cores'
// ExpOfNonpositive by an exhaustive check (tests/nonpositive_exp_test.cpp: 1.33u measured with
// FMA, 1.75u without), Highway's Exp (naive) and glibc's expf by their documented 1 ulp. The
// denominator sum_i w_i(1 + eps_i) carries the weighted mean of the terms' errors, at most 3u max|z| + 2u
// ("spread 3"), and its own summation error: recursive summation of n positive terms is within (n - 1)u (per
// SIMD lane fewer, but the scalar target must be covered, so "per_item 1"). Normalising by a reciprocal and a
// product adds 2u. Constants collect these 2u terms with room for the O(u^2) remainders (4 terms of 2u, plus
// 2). An online normaliser also rescales its running sum by exp(m_old - m_new) at each growth of the max:
// every rescale is an exp (2u) of a rounded argument, and the arguments telescope to at most the spread, so
// the sum gains 2u per item and 3u max|z| twice more ("per_item 3, spread 9"). online2 stores each exp
// against the running max m_s current at its tile and multiplies it later by exp(m_s - m) / sum: the argument
// splits into (e_j - m_s) and (m_s - m), both <= 0, so their rounding errors still total 3u|z_j|, but the
// element now carries two exps and one more product (3u more than safe3's 4u: "constant 15"). The output
// rounding to bf16/fp16 is added by allowed_error as 2 u_out.
const SoftmaxKernel softmax_table[] = {
    {.name = "naive",
     .description =
         "fp32, no max shift: exp overflows once logits pass ~88 (kept to prove the gate catches it)",
     .operation = Operation::softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = true,
     .run = run_rows<float, softmax_naive_fp32>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .unshifted = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: BHH 2021 section 3 without the shift",
                   .reason =
                       "exp(e/theta) is formed unshifted, so the argument error is u|e/theta|, not u|z|"}},
    {.name = "safe3",
     .description = "fp32, three passes: max, exp and sum, normalise (Highway SIMD)",
     .operation = Operation::softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<float, softmax_safe3_fp32>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: BHH 2021 shifted softmax",
                   .reason =
                       "3 roundings in the argument, 1-ulp exp, recursive sum, reciprocal and product"}},
    {.name = "online2",
     .description = "fp32, Milakov-Gimelshein online normaliser: one pass for max and sum, one to normalise",
     .operation = Operation::softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<float, softmax_online2_fp32>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 3,
                   .constant = 15,
                   .basis = "analysis: BHH 2021 shifted softmax plus online rescaling",
                   .reason = "each growth of the running max rescales the sum by a rounded exp; arguments "
                             "telescope to the spread"}},
    {.name = "blocked",
     .description = "fp32, per-tile max and sum over tiles of 256 merged online, as FlashAttention does",
     .operation = Operation::softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<float, blocked>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 3,
                   .constant = 12,
                   .basis = "analysis: BHH 2021 shifted softmax plus per-tile rescaling",
                   .reason = "tiles are merged by the online rule, then each tile is rescaled once more"}},
    {.name = "safe3_bf16",
     .description = "bf16 in and out, fp32 accumulation (safe3)",
     .operation = Operation::softmax,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<Bfloat16, softmax_safe3_bf16>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: as safe3 in fp32, plus one rounding to bf16",
                   .reason = "fp32 accumulation; the output rounding (2 u_out) dominates"}},
    {.name = "online2_bf16",
     .description = "bf16 in and out, fp32 accumulation (online2)",
     .operation = Operation::softmax,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<Bfloat16, softmax_online2_bf16>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 3,
                   .constant = 15,
                   .basis = "analysis: as online2 in fp32, plus one rounding to bf16",
                   .reason = "fp32 accumulation; the output rounding (2 u_out) dominates"}},
    {.name = "safe3_fp16",
     .description = "fp16 in and out, fp32 accumulation (safe3)",
     .operation = Operation::softmax,
     .input = &fp16,
     .output = &fp16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<Float16, softmax_safe3_fp16>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: as safe3 in fp32, plus one rounding to fp16",
                   .reason = "fp32 accumulation; the output rounding (2 u_out) dominates"}},
    {.name = "online2_fp16",
     .description = "fp16 in and out, fp32 accumulation (online2)",
     .operation = Operation::softmax,
     .input = &fp16,
     .output = &fp16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_rows<Float16, softmax_online2_fp16>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .per_item = 3,
                   .constant = 15,
                   .basis = "analysis: as online2 in fp32, plus one rounding to fp16",
                   .reason = "fp32 accumulation; the output rounding (2 u_out) dominates"}},
    {.name = "bf16acc",
     .description = "bf16 with a bf16 running sum that stalls at 256 (kept to prove the gate catches it)",
     .operation = Operation::softmax,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &bf16,
     .deliberately_broken = true,
     .run = run_rows<Bfloat16, softmax_bf16_accumulator>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: the bf16 contract (fp32 accumulation), which this kernel breaks",
                   .reason =
                       "judged by what a bf16 kernel must deliver; its bf16 running sum cannot meet it"}},
    // Quantized kernels: the float lookup table and sum carry about (n + 4) u_fp32 relative error,
    // under a quarter of an output step for n <= 16,384; what remains is the output grid itself
    // (TFLite rounds half away from zero, the reference ties to even): one step of 1/256, which
    // allowed_error's floor (one output subnormal = one grid step) grants.
    {.name = "int8",
     .description = "TFLite-style int8 softmax: exp lookup table over 256 code differences, float sum, out "
                    "scale 1/256, zp -128",
     .operation = Operation::softmax,
     .input = &q8_logits,
     .output = &q8_probabilities,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_quantized<std::int8_t, softmax_int8, -128>,
     .tolerance =
         {.accumulation = &fp32,
          .argument = 3,
          .spread = 3,
          .per_item = 1,
          .constant = 10,
          .basis = "analysis: float LUT and sum (BHH 2021) plus one grid step",
          .reason =
              "outputs are codes of 1/256; a kernel within one code of the correctly rounded code passes"}},
    {.name = "uint8",
     .description =
         "TFLite-style softmax to uint8: exp lookup table, float sum, out scale 1/256, zero point 0",
     .operation = Operation::softmax,
     .input = &q8_logits,
     .output = &q8_probabilities,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .simd_dispatched = true,
     .run = run_quantized<std::uint8_t, softmax_uint8, 0>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: as int8",
                   .reason = "the same computation with zero point 0"}},
    // The entropy H is a sum of n terms p log(p + 1e-9), each with error about u(2 + |log p|),
    // |log p| <= ln n + max|z|; beta = poly(H) has |poly'| <= 3.3 on (0.5, 6] and is clamped
    // elsewhere, so |d beta| <= 5 u n (2 + ln n + max|z|); a change d beta moves log p_j by at
    // most d beta (|z_j| + max|z|). The second softmax then adds safe3's error.
    {.name = "adaptive",
     .description =
         "fp32 adaptive temperature exactly as the paper's code (entropy, polynomial beta, re-softmax)",
     .operation = Operation::adaptive_temperature,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, softmax_adaptive_fp32>,
     .tolerance =
         {.accumulation = &fp32,
          .argument = 3,
          .spread = 3,
          .per_item = 1,
          .constant = 10,
          .beta_sensitivity = 5,
          .basis = "analysis: BHH 2021 for both softmaxes plus the entropy's error through beta",
          .reason = "beta from an fp32 entropy; beta(H) is continuous (poly(0.5) < 1), so no row is exempt"}},
    // The streaming kernel forms t = e * scale before any shift, so t and its running max each
    // carry u |m / theta| of rounding: pass 2's argument beta (t - m) errs by up to
    // 2 beta_max u |m / theta| with beta_max = max(poly) = 2.43 over h >= 0.5 ("unshifted 5"), and
    // the entropy log Z - A / Z by as much, which beta carries on (entropy_unshifted). Found by the
    // stressing-rows property at logits {82, 81.999}, theta 0.3 (ratio 2.1 without either).
    {.name = "adaptive_streaming",
     .description = "fp32 adaptive temperature with the entropy from the online pass (logits read twice)",
     .operation = Operation::adaptive_temperature,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, softmax_adaptive_streaming_fp32>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 9,
                   .unshifted = 5,
                   .per_item = 3,
                   .constant = 12,
                   .beta_sensitivity = 5,
                   .basis = "analysis: as adaptive, with the online normaliser's rescaling in the first pass",
                   .reason =
                       "entropy from log Z - sum p e (no 1e-9 term): within the same beta bound plus 1e-9 n",
                   .entropy_unshifted = true}},
    {.name = "adaptive_bf16",
     .description = "bf16 in and out, the fp32 adaptive kernel inside",
     .operation = Operation::adaptive_temperature,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<Bfloat16, narrow_through_fp32<Bfloat16, softmax_adaptive_fp32>>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .spread = 3,
                   .per_item = 1,
                   .constant = 10,
                   .beta_sensitivity = 5,
                   .basis = "analysis: as adaptive, plus one rounding to bf16",
                   .reason = "bf16 inputs are exact in fp32; the output rounding dominates"}},
    // The escapes (z_j below is what the operator exponentiates: (e_j - m) ln(n) / theta for SSMax,
    // (e_j - m) f / theta for length-scaled logits, e_j / theta for sigmoid and stick-breaking).
    // SSMax runs safe3 at scale fl(fl(1/theta) fl(ln n)): the multiplier carries 3u more (logf is
    // within 1 ulp), which scales every argument: safe3's entry with argument and spread 3 + 3.
    {.name = "ssmax",
     .description = "fp32 scalable softmax (SSMax): safe3 at scale s ln n, s = 1/theta",
     .operation = Operation::scalable_softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, scalable_softmax_fp32>,
     .tolerance =
         {.accumulation = &fp32,
          .argument = 6,
          .spread = 6,
          .per_item = 1,
          .constant = 10,
          .basis = "analysis: BHH 2021 shifted softmax, multiplier rounded",
          .reason = "safe3 at scale s ln n; the rounded multiplier perturbs each argument by 3u relative"}},
    {.name = "ssmax_bf16",
     .description = "bf16 in and out, the fp32 SSMax kernel inside",
     .operation = Operation::scalable_softmax,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<Bfloat16, narrow_through_fp32<Bfloat16, scalable_softmax_fp32>>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 6,
                   .spread = 6,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: as ssmax, plus one rounding to bf16",
                   .reason = "fp32 inside; the output rounding dominates"}},
    // f = fl(fl(ln n) / fl(ln 16)) is within 5u, times the scale 6u: safe3 with 3 + 6.
    {.name = "length_scaled",
     .description = "fp32 softmax with logits scaled by max(1, ln n / ln 16) (Qwen's logn attention)",
     .operation = Operation::length_scaled_softmax,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, length_scaled_softmax_fp32>,
     .tolerance =
         {.accumulation = &fp32,
          .argument = 9,
          .spread = 9,
          .per_item = 1,
          .constant = 10,
          .basis = "analysis: BHH 2021 shifted softmax, factor rounded",
          .reason =
              "safe3 at scale f / theta; f's two logs and quotient perturb each argument by 6u relative"}},
    {.name = "length_scaled_bf16",
     .description = "bf16 in and out, the fp32 length-scaled kernel inside",
     .operation = Operation::length_scaled_softmax,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<Bfloat16, narrow_through_fp32<Bfloat16, length_scaled_softmax_fp32>>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 9,
                   .spread = 9,
                   .per_item = 1,
                   .constant = 10,
                   .basis = "analysis: as length_scaled, plus one rounding to bf16",
                   .reason = "fp32 inside; the output rounding dominates"}},
    // x = fl(fl(e s) + fl(-ln n)) is within 3u|z| + 3u ln n of z - ln n; sigma'(x)/sigma(x) =
    // 1 - sigma(x) <= 1 passes that on as relative error; exp, one add and one division add 6u.
    {.name = "sigmoid",
     .description = "fp32 sigmoid attention weights sigmoid(e/theta - ln n), stable for both signs",
     .operation = Operation::sigmoid_attention,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, sigmoid_attention_fp32>,
     .tolerance =
         {.accumulation = &fp32,
          .argument = 3,
          .constant = 8,
          .basis = "analysis: first-order error of the stable sigmoid form",
          .reason = "argument error 3u|z| + 3u ln n passed on with factor 1 - sigma <= 1; exp, add, divide",
          .log_length = 4}},
    {.name = "sigmoid_bf16",
     .description = "bf16 in and out, the fp32 sigmoid kernel inside",
     .operation = Operation::sigmoid_attention,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<Bfloat16, narrow_through_fp32<Bfloat16, sigmoid_attention_fp32>>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .constant = 8,
                   .basis = "analysis: as sigmoid, plus one rounding to bf16",
                   .reason = "fp32 inside; the output rounding dominates",
                   .log_length = 4}},
    // log A_j = -softplus(-z_j) - T_j with T_j a recursive sum of m <= n - 1 softplus terms; the
    // sum's error is (m + 6)u T_j plus 2u sum |z_k| sigma(z_k) <= 2u (T_j + 0.28 m); with
    // T_j + softplus(-z_j) = |ln A_j| the exponent is within u((n + 6)|ln A_j| + 0.6 n + 2|z_j| + 2)
    // ("logarithm 4": 4(n + 1) >= n + 6), and exp turns it into relative error.
    {.name = "stick_breaking",
     .description = "fp32 stick-breaking weights in log space (running softplus sum from the nearest key)",
     .operation = Operation::stick_breaking,
     .input = &fp32,
     .output = &fp32,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<float, stick_breaking_fp32>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .per_item = 1,
                   .constant = 12,
                   .basis = "analysis: recursive summation of the softplus exponent",
                   .reason =
                       "the exponent's absolute error grows with n |ln A_j| and becomes A_j's relative error",
                   .logarithm = 4}},
    {.name = "stick_breaking_bf16",
     .description = "bf16 in and out, the fp32 stick-breaking kernel inside",
     .operation = Operation::stick_breaking,
     .input = &bf16,
     .output = &bf16,
     .accumulation = &fp32,
     .deliberately_broken = false,
     .run = run_rows<Bfloat16, narrow_through_fp32<Bfloat16, stick_breaking_fp32>>,
     .tolerance = {.accumulation = &fp32,
                   .argument = 3,
                   .per_item = 1,
                   .constant = 12,
                   .basis = "analysis: as stick_breaking, plus one rounding to bf16",
                   .reason = "fp32 inside; the output rounding dominates",
                   .logarithm = 4}},
};

}  // namespace

std::span<const SoftmaxKernel> softmax_kernels() { return softmax_table; }

const SoftmaxKernel* find_softmax_kernel(std::string_view name) {
  return find_named(softmax_kernels(), name);
}

}  // namespace sharpcheck::kernels
