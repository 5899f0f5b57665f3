#include "metrics/tolerance_table.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace sharpcheck::metrics {
namespace {

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
constexpr Tolerance table[] = {
    {"naive", &fp32, 3, 3, 3, 1, 10, 0, 0, "analysis: BHH 2021 section 3 without the shift",
     "exp(e/theta) is formed unshifted, so the argument error is u|e/theta|, not u|z|"},
    {"safe3", &fp32, 3, 3, 0, 1, 10, 0, 0, "analysis: BHH 2021 shifted softmax",
     "3 roundings in the argument, 1-ulp exp, recursive sum, reciprocal and product"},
    {"online2", &fp32, 3, 9, 0, 3, 15, 0, 0, "analysis: BHH 2021 shifted softmax plus online rescaling",
     "each growth of the running max rescales the sum by a rounded exp; arguments telescope to the spread"},
    {"blocked", &fp32, 3, 9, 0, 3, 12, 0, 0, "analysis: BHH 2021 shifted softmax plus per-tile rescaling",
     "tiles are merged by the online rule, then each tile is rescaled once more"},
    {"safe3_bf16", &fp32, 3, 3, 0, 1, 10, 0, 0, "analysis: as safe3 in fp32, plus one rounding to bf16",
     "fp32 accumulation; the output rounding (2 u_out) dominates"},
    {"online2_bf16", &fp32, 3, 9, 0, 3, 15, 0, 0, "analysis: as online2 in fp32, plus one rounding to bf16",
     "fp32 accumulation; the output rounding (2 u_out) dominates"},
    {"safe3_fp16", &fp32, 3, 3, 0, 1, 10, 0, 0, "analysis: as safe3 in fp32, plus one rounding to fp16",
     "fp32 accumulation; the output rounding (2 u_out) dominates"},
    {"online2_fp16", &fp32, 3, 9, 0, 3, 15, 0, 0, "analysis: as online2 in fp32, plus one rounding to fp16",
     "fp32 accumulation; the output rounding (2 u_out) dominates"},
    {"bf16acc", &fp32, 3, 3, 0, 1, 10, 0, 0,
     "analysis: the bf16 contract (fp32 accumulation), which this kernel breaks",
     "judged by what a bf16 kernel must deliver; its bf16 running sum cannot meet it"},
    // Quantized kernels: the float lookup table and sum carry about (n + 4) u_fp32 relative error,
    // under a quarter of an output step for n <= 16,384; what remains is the output grid itself
    // (TFLite rounds half away from zero, the reference ties to even): one step of 1/256, which
    // allowed_error's floor (one output subnormal = one grid step) grants.
    {"int8", &fp32, 3, 3, 0, 1, 10, 0, 0, "analysis: float LUT and sum (BHH 2021) plus one grid step",
     "outputs are codes of 1/256; a kernel within one code of the correctly rounded code passes"},
    {"uint8", &fp32, 3, 3, 0, 1, 10, 0, 0, "analysis: as int8", "the same computation with zero point 0"},
    // A plugin's softmax is judged by the contract of any shifted fp32-accumulating softmax; the
    // online normaliser's entry covers the three-pass one, so it is the one used.
    {"plugin_softmax", &fp32, 3, 9, 0, 3, 12, 0, 0, "analysis: as online2 (covers safe3 and blocked)",
     "an unknown kernel is held to what any correct fp32-accumulating softmax achieves"},
    // The entropy H is a sum of n terms p log(p + 1e-9), each with error about u(2 + |log p|),
    // |log p| <= ln n + max|z|; beta = poly(H) has |poly'| <= 3.3 on (0.5, 6] and is clamped
    // elsewhere, so |d beta| <= 5 u n (2 + ln n + max|z|); a change d beta moves log p_j by at
    // most d beta (|z_j| + max|z|). The second softmax then adds safe3's error.
    {"adaptive", &fp32, 3, 3, 0, 1, 10, 5, 0,
     "analysis: BHH 2021 for both softmaxes plus the entropy's error through beta",
     "beta from an fp32 entropy; beta(H) is continuous (poly(0.5) < 1), so no row is exempt"},
    {"adaptive_streaming", &fp32, 3, 9, 0, 3, 12, 5, 0,
     "analysis: as adaptive, with the online normaliser's rescaling in the first pass",
     "entropy from log Z - sum p e (no 1e-9 term): within the same beta bound plus 1e-9 n"},
    {"adaptive_bf16", &fp32, 3, 3, 0, 1, 10, 5, 0, "analysis: as adaptive, plus one rounding to bf16",
     "bf16 inputs are exact in fp32; the output rounding dominates"},
    // The escapes (z_j below is what the operator exponentiates: (e_j - m) ln(n) / theta for SSMax,
    // (e_j - m) f / theta for length-scaled logits, e_j / theta for sigmoid and stick-breaking).
    // SSMax runs safe3 at scale fl(fl(1/theta) fl(ln n)): the multiplier carries 3u more (logf is
    // within 1 ulp), which scales every argument: safe3's entry with argument and spread 3 + 3.
    {"ssmax", &fp32, 6, 6, 0, 1, 10, 0, 0, "analysis: BHH 2021 shifted softmax, multiplier rounded",
     "safe3 at scale s ln n; the rounded multiplier perturbs each argument by 3u relative"},
    {"ssmax_bf16", &fp32, 6, 6, 0, 1, 10, 0, 0, "analysis: as ssmax, plus one rounding to bf16",
     "fp32 inside; the output rounding dominates"},
    // f = fl(fl(ln n) / fl(ln 16)) is within 5u, times the scale 6u: safe3 with 3 + 6.
    {"length_scaled", &fp32, 9, 9, 0, 1, 10, 0, 0, "analysis: BHH 2021 shifted softmax, factor rounded",
     "safe3 at scale f / theta; f's two logs and quotient perturb each argument by 6u relative"},
    {"length_scaled_bf16", &fp32, 9, 9, 0, 1, 10, 0, 0,
     "analysis: as length_scaled, plus one rounding to bf16", "fp32 inside; the output rounding dominates"},
    // x = fl(fl(e s) + fl(-ln n)) is within 3u|z| + 3u ln n of z - ln n; sigma'(x)/sigma(x) =
    // 1 - sigma(x) <= 1 passes that on as relative error; exp, one add and one division add 6u.
    {"sigmoid", &fp32, 3, 0, 0, 0, 8, 0, 0, "analysis: first-order error of the stable sigmoid form",
     "argument error 3u|z| + 3u ln n passed on with factor 1 - sigma <= 1; exp, add, divide", 4, 0},
    {"sigmoid_bf16", &fp32, 3, 0, 0, 0, 8, 0, 0, "analysis: as sigmoid, plus one rounding to bf16",
     "fp32 inside; the output rounding dominates", 4, 0},
    // log A_j = -softplus(-z_j) - T_j with T_j a recursive sum of m <= n - 1 softplus terms; the
    // sum's error is (m + 6)u T_j plus 2u sum |z_k| sigma(z_k) <= 2u (T_j + 0.28 m); with
    // T_j + softplus(-z_j) = |ln A_j| the exponent is within u((n + 6)|ln A_j| + 0.6 n + 2|z_j| + 2)
    // ("logarithm 4": 4(n + 1) >= n + 6), and exp turns it into relative error.
    {"stick_breaking", &fp32, 3, 0, 0, 1, 12, 0, 0, "analysis: recursive summation of the softplus exponent",
     "the exponent's absolute error grows with n |ln A_j| and becomes A_j's relative error", 0, 4},
    {"stick_breaking_bf16", &fp32, 3, 0, 0, 1, 12, 0, 0,
     "analysis: as stick_breaking, plus one rounding to bf16", "fp32 inside; the output rounding dominates",
     0, 4},
    // Attention: a logit formed as an fp32 dot product of length d is within d u sum_t|q_t k_t|
    // |scale/theta| of the exact one (absolute); that error moves numerator and denominator, so
    // "dot_product 2". The output o = sum_j p_j v_j is judged relative to sum_j p_j |v_j|, not
    // |o| (which may cancel to 0); its recursive sum over n keys adds n u, hence "per_item 2".
    {"attention_naive", &fp32, 3, 3, 0, 2, 16, 0, 2, "analysis: BHH 2021 softmax plus the weighted sum (n u)",
     "score dot products, three-pass softmax, a recursive weighted sum over n keys"},
    {"attention_flash", &fp32, 3, 9, 0, 4, 18, 0, 2, "analysis: as attention_naive plus per-tile rescaling",
     "the accumulator is rescaled by a rounded exp at each tile whose max grows"},
    {"attention_flash_bf16", &fp32, 3, 9, 0, 4, 18, 0, 2,
     "analysis: as attention_flash, plus one rounding to bf16",
     "bf16 inputs are exact in fp32; the output rounding dominates"},
};

}  // namespace

// Negligible entries (RowScale::negligible). An additive mask (-1e4 as in BERT, -1e9, or
// torch.finfo(float32).min as Hugging Face models add) gives z_j = (e_j - m) / theta of enormous
// magnitude; taken into max|z| and n it made every element's allowance grow with the mask value
// (infinite at finfo.min: a false FAIL; 40x loose at -1e4: false PASSes). Derivation that such an
// entry matters only through its own tiny size: let z_k < -200. The kernel computes the exponent's
// argument with relative error at most kappa u, kappa u <= 9 * 2^-24 for every entry here
// (spread <= 9, fp32 accumulation; 1/4 would do), so the argument is below -150 and the computed
// exponential w^_k <= e^-150 (1 + 2u) < 2^-216, while the exact w_k = e^z_k < 2^-288. Every term
// of the shifted sum S satisfies S >= 1 (the maximum contributes exactly 1), so entry k changes S,
// and each rescaled partial sum holding it, by less than 2^-200 relative, and an addition with such
// a term errs by at most its size (the nearest float to a + b lies within |b| of a + b), which
// contributes no u-relative error: the rounding analysis of the other entries holds with n and
// max|z| taken over them alone, plus 2^-190 relative per negligible entry (the margin covers
// tiles of up to 2^10 entries rescaled together). Entry k's own output is below 2^-200 and so is
// its exact value: it is judged against the absolute floor (which includes 2^-190), never against
// its logit's size. A row of masked entries whose output is not ~0 therefore fails.
double Tolerance::allowed_error(double magnitude, double z_magnitude, const RowScale& row,
                                const FloatFormat& output) const {
  const double u = accumulation->unit_roundoff();
  const double u_out = output.unit_roundoff();
  const auto n = static_cast<double>(row.n);
  const double z = row.largest_magnitude;
  const double units =
      argument * z_magnitude + spread * z + unshifted * row.shift_magnitude + per_item * n + constant +
      beta_sensitivity * n * (2 + std::log(std::max(n, 1.0)) + z) * (z_magnitude + z) +
      dot_product * row.logit_rounding + log_length * std::log(std::max(n, 1.0)) +
      (magnitude != 0 ? logarithm * (n + 1) * std::fabs(std::log(std::fabs(magnitude))) : 0.0);
  const double negligible = static_cast<double>(row.negligible) * negligible_contribution;
  const double relative = std::expm1(units * u) + 2 * u_out + negligible;
  const double floor = std::ldexp(1.0, output.min_subnormal_exponent()) +
                       4 * std::ldexp(1.0, accumulation->min_subnormal_exponent()) +
                       (row.negligible > 0 ? negligible_contribution : 0.0);
  // The bound is evaluated in double; 2^-40 relative headroom covers its own rounding errors. An
  // element of magnitude 0 has no relative allowance (only the floor), also where `relative` is
  // infinite (a temperature so small that exp(units u) overflows), which gave NaN before.
  const double relative_part = magnitude != 0 ? relative * (1 + 4 * u_out) * std::fabs(magnitude) : 0.0;
  return (relative_part + floor) * (1 + 0x1p-40);
}

const Tolerance& tolerance_for(std::string_view kernel) {
  for (const Tolerance& entry : table) {
    if (entry.kernel == kernel) return entry;
  }
  throw std::out_of_range("no tolerance-table entry for kernel '" + std::string(kernel) + "'");
}

std::span<const Tolerance> tolerance_table() { return table; }

}  // namespace sharpcheck::metrics
