#include "metrics/tolerance_table.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/errors.hpp"
#include "kernels/registry.hpp"
#include "metrics/recipes.hpp"

namespace sharpcheck::metrics {
namespace {

// A plugin's softmax is judged by the contract of any shifted fp32-accumulating softmax (the
// derivation is online2's in kernels/registry.cpp); the online normaliser's entry covers the
// three-pass one, so it is the one used.
//
// Attention precision models are recipes now (metrics/recipes.hpp): attention_fp32,
// attention_p_rounded and attention_math_lowp keep their meaning as recipes that round P (and the
// scores) to the output's format; flash_bf16, math_bf16 and the rest name the format themselves.
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
         (row.negligible > 0 ? negligible_contribution : 0.0) +
         t.probability_floor * (t.floor_over_row_sum ? row.value_mass_over_z : row.value_mass);
}

// How far from e = RN(o) the kernel's RN(o^) can land when its o^ is within E of the exact o: o
// lies between the midpoints m- and m+ from e to its neighbours, so o^ lies in [m- - E, m+ + E]
// and, rounding being monotone, RN(o^) between RN(m- - E) and RN(m+ + E). Tighter than
// E + 2 u_out |e| (below), which charges two whole roundings: a kernel within a hair of o lands
// on e or a neighbour, one gap away, where 2 u_out |e| reaches almost two gaps at the top of a
// binade (a bf16 output one key sees, v exactly, passed the fp32 recipe 2 ulp off). An output is
// a value of the format, and the comparison is symmetric (|a - e| <= allowed): the allowance is
// halfway between the farthest reachable code on either side and the nearest unreachable one on
// either side, so that exactly the reachable codes pass and a reachable code's bound ratio stays
// well below 1; where no such symmetric allowance exists (e a power of two: a whole gap above is
// as far as two half gaps below), the farthest reachable code itself. The format is symmetric,
// so |e| serves; the midpoints are exact in double for formats of at most 52 bits of precision, and
// m +- E is rounded outward. Infinite (no gain) for fp64 outputs and at the range's ends.
double rounded_reach(double expected, double reach, const FloatFormat& output) {
  const double e = std::fabs(expected);
  if (output.precision() > 52 || !std::isfinite(reach)) return INFINITY;
  // The common case without the format's neighbour walks (a judgement asks for every element): E
  // under a quarter gap and e two gaps inside its binade reach one code each way, and the next ones
  // lie two gaps away, so the answer is 1.5 gaps, as below.
  if (output.exponent_bits > 0 && e > 0) {
    const auto binade = [&](double x) { return std::max(std::ilogb(x), output.min_normal_exponent); };
    const int k = binade(e);
    const double gap = std::ldexp(1.0, k - output.fraction_bits);
    // Past four gaps of E, E + 2 u_out |e| is within 30% of the reachable codes' form (it exceeds it
    // by at most 1.5 gaps): kept, without the walks.
    if (reach > 4 * gap) return INFINITY;
    if (4 * reach < gap && e + 2 * gap <= output.max_finite && e > 2 * gap && binade(e + 2 * gap) == k &&
        binade(e - 2 * gap) == k)
      return 1.5 * gap * (1 + 0x1p-40);
  }
  const double up = next_up(e, output), down = next_down(e, output);
  if (!std::isfinite(up) || !std::isfinite(down)) return INFINITY;
  const double highest = round_to_format(std::nextafter((e + up) / 2 + reach, INFINITY), output);
  const double lowest = round_to_format(std::nextafter((e + down) / 2 - reach, -INFINITY), output);
  const double reachable = std::max(highest - e, e - lowest);
  const double unreachable = std::min(next_up(highest, output) - e, e - next_down(lowest, output));
  const double farthest = unreachable > reachable ? (reachable + unreachable) / 2 : reachable;
  return std::isfinite(farthest) ? farthest * (1 + 0x1p-40) : INFINITY;
}

// The output rounding relative to the value itself (attention). An attention element is judged
// relative to M = sum_j p_j |v_j|, of which the output o may be a tiny part (values cancel). The
// computation before the final rounding errs by E = (exp(units u + output units u_out) - 1) M; the
// kernel then rounds its o^ (|o^ - o| <= E) and the reference rounds o, so
// |RN(o^) - RN(o)| <= E + u_out |o^| + u_out |o| <= E (1 + u_out) + 2 u_out |o|, and
// |o| <= |RN(o)| (1 + u_out) = |expected| (1 + u_out). Charging 2 u_out M instead (as for softmax,
// where M = |expected|) would let a rounding of P to the output's format (u_out M, the
// attention_p_rounded model) pass as an fp32-P kernel's error.
AllowanceParts allowance_parts(const Tolerance& t, double magnitude, double z_magnitude, const RowScale& row,
                               const FloatFormat& output, Tier tier, double rounded_value) {
  const double u = t.accumulation->unit_roundoff();
  const double u_out = output.unit_roundoff();
  const auto n = static_cast<double>(row.n);
  const double length = charged_length(n, tier);
  const double z = row.largest_magnitude;
  const double units =
      t.argument * z_magnitude + t.spread * z + t.unshifted * row.shift_magnitude + t.per_item * length +
      t.constant +
      t.beta_sensitivity * n *
          (2 + std::log(std::max(n, 1.0)) + z + (t.entropy_unshifted ? row.shift_magnitude : 0.0)) *
          (z_magnitude + z) +
      t.dot_product * row.logit_rounding + t.log_length * std::log(std::max(n, 1.0)) +
      (magnitude != 0 ? t.logarithm * charged_length(n + 1, tier) * std::fabs(std::log(std::fabs(magnitude)))
                      : 0.0);
  // Roundings inside the kernel, in the units of the format they round to (the output's unless
  // a recipe names another: P in bf16 under an fp32 output is charged 2^-8, not 2^-24).
  const double u_scores = (t.score_format != nullptr ? *t.score_format : output).unit_roundoff();
  const double u_probabilities =
      (t.probability_format != nullptr ? *t.probability_format : output).unit_roundoff();
  const double inside =
      t.scores_in_output * 2 * row.largest_score * u_scores + t.probabilities_in_output * u_probabilities;
  const double negligible = static_cast<double>(row.negligible) * negligible_contribution;
  const double computed = std::expm1(units * u + inside) + negligible;
  // The bound is evaluated in double; 2^-40 relative headroom covers its own rounding errors. An
  // element of magnitude 0 has no relative allowance (only the floor), also where `relative` is
  // infinite (a temperature so small that exp(units u) overflows), which gave NaN before.
  const double relative = rounded_value < 0 ? computed + 2 * u_out : computed;
  const double relative_part = magnitude != 0 ? relative * (1 + 4 * u_out) * std::fabs(magnitude) : 0.0;
  const double rounding_part = rounded_value < 0 ? 0.0 : 2 * u_out * (1 + 4 * u_out) * rounded_value;
  const double floor = absolute_floor(t, row, output);
  return {.full = (relative_part + rounding_part + floor) * (1 + 0x1p-40),
          .before_rounding = (relative_part + floor) * (1 + 0x1p-40)};
}

double allowed_error(const Tolerance& t, double magnitude, double z_magnitude, const RowScale& row,
                     const FloatFormat& output, Tier tier, double rounded_value) {
  return allowance_parts(t, magnitude, z_magnitude, row, output, tier, rounded_value).full;
}

std::span<const ContractEntry> contract_entries() { return contracts; }

const Tolerance& tolerance_for(std::string_view name) {
  if (const auto* kernel = kernels::find_softmax_kernel(name)) return kernel->tolerance;
  if (const auto* kernel = kernels::find_attention_kernel(name)) {
    if (kernel->recipe.empty()) return kernel->tolerance;
    const AttentionRecipe* recipe = find_recipe(kernel->recipe);
    if (recipe == nullptr || recipe->backward)
      throw std::logic_error("no forward recipe " + std::string(kernel->recipe));
    return forward_tolerance(*recipe);
  }
  for (const ContractEntry& entry : contracts) {
    if (entry.name == name) return entry.tolerance;
  }
  if (const AttentionRecipe* recipe = find_recipe(name); recipe != nullptr && !recipe->backward)
    return forward_tolerance(*recipe);
  throw InputError(InputProblem::out_of_range,
                   "no tolerance entry named '" + std::string(name) +
                       "' (the entries: plugin_softmax, the attention recipes " + recipe_names(false) +
                       ", and the kernels' names that `sharpcheck gate --list` shows)");
}

}  // namespace sharpcheck::metrics
