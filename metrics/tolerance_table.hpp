// Evaluating tolerance entries (kernels/tolerance.hpp): a row's geometry, the allowed error of
// one element, and the entries that belong to no built-in kernel. Every entry is derived beside
// its definition (a kernel's in kernels/registry.cpp, a contract's in tolerance_table.cpp) from
// a rounding-error analysis (and says so) or from measurement (and says so); tests never carry a
// tolerance of their own.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "formats/float_format.hpp"
#include "kernels/tolerance.hpp"

namespace sharpcheck::metrics {

// What a row contributes to the bound: z_j = (e_j - m) / theta with m the logit that maximises
// e / theta, so z_j <= 0.
struct RowScale {
  std::size_t n = 0;             // unmasked entries
  double largest_magnitude = 0;  // max_j |z_j| (the spread over |theta|)
  double shift_magnitude = 0;    // |m / theta| (matters only to kernels without a shift)
  // Attention only: d * max_j sum_t |q_t k_jt| * |scale / theta|, which bounds in units of u the
  // rounding error of a logit formed as an fp32 dot product of length d.
  double logit_rounding = 0;
  // Attention only: sum_j p_j times that bound for z_j, what the log-sum-exp's error from the logits
  // is at most (judge_lse); negative: not formed.
  double weighted_logit_rounding = -1;
  // Attention only: max_j |s_j / theta| over the entries seen, s_j the scaled score (after any
  // soft-cap and bias): what a rounding of the scores to the output's format is relative to.
  double largest_score = 0;
  // Attention only: max over output columns c of sum_j |v_jc| over the keys seen (what a
  // probability_floor is charged against), and the same over Z = sum_j exp(z_j - max z) (sink
  // included; Z >= 1), which a kernel rounding unnormalised weights exp(z_j - m) times a fixed
  // offset charges instead: its row sum is at least offset Z, so an absolute error f in one weight
  // moves the output by at most f |v_j| / (offset Z). A recipe rounding the normalised P gets no
  // such division (Tolerance::floor_over_row_sum).
  double value_mass = 0;
  double value_mass_over_z = 0;
  // Shifted softmax only: entries with z_j < -negligible_below (an additive mask such as -1e4,
  // -1e9 or finfo.min, or a logit far below the rest). They are left out of n and of
  // largest_magnitude and counted here; see the derivation in tolerance_table.cpp.
  std::size_t negligible = 0;
  // Attention with keys smoothed by their mean (kernels::QuantizedWeights::smoothed_keys): what the
  // kernel's fp32 correction c added to its log-sum-exp may err by, in units of u: (d + 6) times
  // metrics::smoothing_shifts' bound (two roundings per product of q^ . k~ and d - 1 in its sum,
  // the products by the scale and 1/theta, and their conversions to fp32).
  double smoothing_shift = 0;
};

// |z| beyond which an entry of a shifted softmax is negligible (derivation in tolerance_table.cpp).
inline constexpr double negligible_below = 200;
// What one negligible entry can contribute, relative to the row's sum and to an element's own value.
inline constexpr double negligible_contribution = 0x1p-190;

using kernels::Tolerance;

// The two tiers a verdict is judged under (derivations in tolerance_table.cpp). The proven tier is
// a worst-case rounding-error bound: an element outside it is wrong whatever the rounding errors
// were. The statistical tier replaces the length n of each accumulation by
// min(n, statistical_lambda sqrt(n)) (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019): a
// kernel outside it is, under the model of independent mean-zero rounding errors, wrong except
// with the probability stated in docs/verdicts.md; it sees systematic errors that the worst case,
// growing as n u, lets through at large n.
enum class Tier { proven, statistical };
inline constexpr double statistical_lambda = 8;

// Largest accepted |actual - expected| for one element of the given magnitude under `tolerance`.
// Includes the output rounding (the kernel's and the reference's, 2 u_out relative to the
// magnitude, or to `rounded_value` = |expected| when given: see tolerance_table.cpp) and an
// absolute floor of one output subnormal plus four accumulation subnormals.
[[nodiscard]] double allowed_error(const Tolerance& tolerance, double magnitude, double z_magnitude,
                                   const RowScale& row, const FloatFormat& output, Tier tier = Tier::proven,
                                   double rounded_value = -1);

// The accumulation length a tier charges for n terms: n (proven) or min(n, lambda sqrt(n)).
[[nodiscard]] double charged_length(double n, Tier tier);

// allowed_error, and what it charges before the output's rounding (its rounded value's part left
// out: with a rounded value, relative is expm1(units u + inside) alone); and how far from
// `expected` (= RN(o), in `output`) a kernel's RN(o^) can land when |o^ - o| <= reach: the tight
// form of that rounding part (tolerance_table.cpp derives it; infinite where it gains nothing). An
// element's allowance is the smaller of allowed_error and rounded_reach(expected, before_rounding +
// whatever else it charges before the rounding).
struct AllowanceParts {
  double full = 0, before_rounding = 0;
};
[[nodiscard]] AllowanceParts allowance_parts(const Tolerance& tolerance, double magnitude, double z_magnitude,
                                             const RowScale& row, const FloatFormat& output, Tier tier,
                                             double rounded_value);
[[nodiscard]] double rounded_reach(double expected, double reach, const FloatFormat& output);

// The absolute floor of allowed_error alone (what an element of magnitude 0 is allowed).
[[nodiscard]] double absolute_floor(const Tolerance& tolerance, const RowScale& row,
                                    const FloatFormat& output);

// A named entry that belongs to no built-in kernel: what a plugin or a file of outputs is held to.
struct ContractEntry {
  std::string_view name;
  Tolerance tolerance;
};
[[nodiscard]] std::span<const ContractEntry> contract_entries();

// The entry of a built-in kernel (its registry row's, or the recipe the row names), a contract
// entry or a forward attention recipe (metrics/recipes.hpp), by name; throws InputError naming
// it if there is none.
[[nodiscard]] const Tolerance& tolerance_for(std::string_view name);

}  // namespace sharpcheck::metrics
