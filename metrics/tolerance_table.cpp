#include "metrics/tolerance_table.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/errors.hpp"
#include "kernels/registry.hpp"

namespace sharpcheck::metrics {
namespace {

// A plugin's softmax is judged by the contract of any shifted fp32-accumulating softmax (the
// derivation is online2's in kernels/registry.cpp); the online normaliser's entry covers the
// three-pass one, so it is the one used.
//
// Attention precision models: which computation a kernel port claims to do, each a named entry
// (`compare --tolerance-of`, Python's tolerance=). They differ in what is rounded to the output's
// format (bf16 or fp16; for fp32 outputs the three coincide up to a few u) inside the computation:
//
// attention_fp32: scores S and probabilities P kept in fp32, only the output rounded (FlashAttention
//   with fp32 P, PyTorch's math path on fp32 tensors): attention_flash's entry (kernels/registry.cpp),
//   which the other two models extend.
//
// attention_p_rounded: FlashAttention 2/3 round P to the output's format before the P V matmul,
//   while the normaliser l = sum_j p~_j is summed from the fp32 p~_j. With p^_j = p~_j (1 + d_j),
//   |d_j| <= u_out: sum_j p^_j v_j = sum_j p~_j v_j + sum_j d_j p~_j v_j, and the added term is at
//   most u_out sum_j p~_j |v_j|, i.e. u_out relative to the element's magnitude. A kernel that sums
//   l from the rounded p^_j instead moves l by at most u_out relative, one u_out more; so
//   probabilities_in_output = 2 covers both, on top of attention_fp32's entry.
//
// attention_math_lowp: PyTorch's math path on bf16/fp16 tensors (q @ k^T rounded to the format,
//   divided by sqrt(d) and rounded again, softmax computed in fp32 from those scores and rounded,
//   P @ V accumulated in fp32 and rounded): each score s_j carries two roundings,
//   |s^_j - s_j| <= (2 u_out + u_out^2) |s_j|, so every z_j moves by at most
//   eps = 2.0001 u_out max_j |s_j / theta| (RowScale::largest_score). A softmax weight
//   p_j = exp(z_j) / sum_i exp(z_i) moves relatively by at most exp(2 eps) - 1 (numerator and
//   denominator each by exp(eps)), so the output moves by that times sum_j p_j |v_j|:
//   scores_in_output = 2 (two roundings; allowed_error multiplies by 2 for numerator and
//   denominator, and the exp form absorbs the u_out^2). P is rounded once before P V:
//   probabilities_in_output = 2 as above. The fp32 parts (dot products, the fp32 softmax, the
//   P V accumulation) keep attention_fp32's coefficients. Note the score term is relative to the
//   scores' size, not their spread: bf16 scores of size 100 are off by up to 0.4 in the logit,
//   which no kernel computing that way can avoid.
//
// Each model is looser than the one before it; a failing attention report names the first looser
// model under which the output would pass (gate/judge_arrays.cpp).
constexpr kernels::Tolerance with_output_roundings(kernels::Tolerance entry, double scores,
                                                   double probabilities, std::string_view basis,
                                                   std::string_view reason) {
  entry.scores_in_output = scores;
  entry.probabilities_in_output = probabilities;
  entry.basis = basis;
  entry.reason = reason;
  return entry;
}

constexpr ContractEntry contracts[] = {
    {"plugin_softmax",
     {.accumulation = &fp32,
      .argument = 3,
      .spread = 9,
      .per_item = 3,
      .constant = 12,
      .basis = "analysis: as online2 (covers safe3 and blocked)",
      .reason = "an unknown kernel is held to what any correct fp32-accumulating softmax achieves"}},
};

// The precision models, built once from attention_flash's registry entry (the fp32 model itself).
const std::array<ContractEntry, 3>& precision_models() {
  static const std::array<ContractEntry, 3> models = [] {
    const kernels::Tolerance fp32_model = kernels::find_attention_kernel("attention_flash")->tolerance;
    return std::array<ContractEntry, 3>{
        ContractEntry{"attention_fp32", fp32_model},
        ContractEntry{"attention_p_rounded",
                      with_output_roundings(fp32_model, 0, 2,
                                            "analysis: attention_fp32 plus P rounded to the output format",
                                            "FlashAttention 2/3: P cast to bf16/fp16 before the P V matmul")},
        ContractEntry{"attention_math_lowp",
                      with_output_roundings(
                          fp32_model, 2, 2,
                          "analysis: attention_p_rounded plus scores rounded twice to the output format",
                          "PyTorch's math path on bf16/fp16 tensors: scores and P in the tensors' format")}};
  }();
  return models;
}

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
//
// The statistical tier. Higham and Mary (2019, Theorem 2.4 and its corollaries): if the rounding
// errors delta_i of a computation are independent random variables of mean zero with |delta_i| <= u,
// then prod_{i <= n} (1 + delta_i) = 1 + theta_n with |theta_n| <= exp(lambda sqrt(n) u + n u^2 / (1 - u))
// - 1 except with probability at most 2 exp(-lambda^2 (1 - u)^2 / 2); a sum or dot product of n terms
// (each term a product of at most n such factors) keeps the worst case's form with n replaced by
// lambda sqrt(n), except with probability n times that. Every entry's n-proportional terms (per_item,
// the recursive sums of a denominator or of P V) are such accumulations; the others (an argument's
// rounding, an exp's error, a spread's amplification) are per-element costs and stay as they are.
// So the statistical allowance is the proven one with n replaced by min(n, lambda sqrt(n)) in
// per_item and logarithm; at n <= lambda^2 = 64 the tiers agree. lambda = 8: per accumulation
// 2 n e^-32, below 6.7e-9 at n = 2^18 (docs/verdicts.md gives it per case). The model is not a
// theorem about particular data: rounding errors of equal addends summed one after another are
// correlated; the table in docs/verdicts.md measures every sound kernel under it, and --proven-only
// judges by the worst case alone.
double charged_length(double n, Tier tier) {
  return tier == Tier::proven ? n : std::min(n, statistical_lambda * std::sqrt(n));
}

double absolute_floor(const Tolerance& t, const RowScale& row, const FloatFormat& output) {
  return std::ldexp(1.0, output.min_subnormal_exponent()) +
         4 * std::ldexp(1.0, t.accumulation->min_subnormal_exponent()) +
         (row.negligible > 0 ? negligible_contribution : 0.0) + t.probability_floor * row.value_mass;
}

// The output rounding relative to the value itself (attention). An attention element is judged
// relative to M = sum_j p_j |v_j|, of which the output o may be a tiny part (values cancel). The
// computation before the final rounding errs by E = (exp(units u + output units u_out) - 1) M; the
// kernel then rounds its o^ (|o^ - o| <= E) and the reference rounds o, so
// |RN(o^) - RN(o)| <= E + u_out |o^| + u_out |o| <= E (1 + u_out) + 2 u_out |o|, and
// |o| <= |RN(o)| (1 + u_out) = |expected| (1 + u_out). Charging 2 u_out M instead (as for softmax,
// where M = |expected|) would let a rounding of P to the output's format (u_out M, the
// attention_p_rounded model) pass as an fp32-P kernel's error.
double allowed_error(const Tolerance& t, double magnitude, double z_magnitude, const RowScale& row,
                     const FloatFormat& output, Tier tier, double rounded_value) {
  const double u = t.accumulation->unit_roundoff();
  const double u_out = output.unit_roundoff();
  const auto n = static_cast<double>(row.n);
  const double length = charged_length(n, tier);
  const double z = row.largest_magnitude;
  const double units =
      t.argument * z_magnitude + t.spread * z + t.unshifted * row.shift_magnitude + t.per_item * length +
      t.constant + t.beta_sensitivity * n * (2 + std::log(std::max(n, 1.0)) + z) * (z_magnitude + z) +
      t.dot_product * row.logit_rounding + t.log_length * std::log(std::max(n, 1.0)) +
      (magnitude != 0 ? t.logarithm * charged_length(n + 1, tier) * std::fabs(std::log(std::fabs(magnitude)))
                      : 0.0);
  const double output_units = t.scores_in_output * 2 * row.largest_score + t.probabilities_in_output;
  const double negligible = static_cast<double>(row.negligible) * negligible_contribution;
  const double computed = std::expm1(units * u + output_units * u_out) + negligible;
  // The bound is evaluated in double; 2^-40 relative headroom covers its own rounding errors. An
  // element of magnitude 0 has no relative allowance (only the floor), also where `relative` is
  // infinite (a temperature so small that exp(units u) overflows), which gave NaN before.
  const double relative = rounded_value < 0 ? computed + 2 * u_out : computed;
  const double relative_part = magnitude != 0 ? relative * (1 + 4 * u_out) * std::fabs(magnitude) : 0.0;
  const double rounding_part = rounded_value < 0 ? 0.0 : 2 * u_out * (1 + 4 * u_out) * rounded_value;
  return (relative_part + rounding_part + absolute_floor(t, row, output)) * (1 + 0x1p-40);
}

std::span<const ContractEntry> contract_entries() { return contracts; }

const Tolerance& tolerance_for(std::string_view name) {
  if (const auto* kernel = kernels::find_softmax_kernel(name)) return kernel->tolerance;
  if (const auto* kernel = kernels::find_attention_kernel(name)) return kernel->tolerance;
  for (const ContractEntry& entry : contracts) {
    if (entry.name == name) return entry.tolerance;
  }
  for (const ContractEntry& entry : precision_models()) {
    if (entry.name == name) return entry.tolerance;
  }
  throw InputError(InputProblem::out_of_range,
                   "no tolerance entry named '" + std::string(name) +
                       "' (the entries: plugin_softmax, the attention precision models attention_fp32, "
                       "attention_p_rounded and "
                       "attention_math_lowp, and the kernels' names that `sharpcheck gate --list` shows)");
}

}  // namespace sharpcheck::metrics
