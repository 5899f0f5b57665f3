#include "metrics/recipes.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/attention_backward.hpp"
#include "kernels/registry.hpp"

namespace sharpcheck::metrics {
namespace {

// Derivations (every count below multiplies the unit roundoff u_i of the format it rounds to;
// tolerance_table.cpp's allowed_error charges it inside exp(...) - 1, relative to the element's
// magnitude M = sum_j p_j |v_jc|):
//
// P rounded before P V (FlashAttention 2/3 forward). The kernel multiplies p^_j = p~_j (1 + d_j),
// |d_j| <= u_P, into V: sum_j p^_j v_j = sum_j p~_j v_j + sum_j d_j p~_j v_j, and the added term
// is at most u_P sum_j p~_j |v_j| = u_P M. A row sum of the rounded p^_j moves l by at most u_P
// relative as well: 2 in all (either row sum). In the statistical tier the data-dependent charge
// replaces this worst case: the d_j are the roundings of distinct fp32 numbers, independent and of
// mean zero in the model of tolerance_table.cpp, so by Hoeffding's inequality the added term
// (with a rounded row sum: sum_j d_j p_j (v_j - o)) exceeds lambda u_P sqrt(sum_j p_j^2 v_j^2)
// (resp. sqrt(sum_j p_j^2 (v_j - o)^2)) with probability at most 2 exp(-lambda^2 / 2), charged
// for this row's exact p_j and v_j (evaluate.cpp). That is what makes a recipe tight: a
// mis-normalised row moves every element by the same relative amount, the roundings by sqrt(n)
// less.
//
// Scores rounded (PyTorch's math path on bf16/fp16 tensors: q k^T rounded, times scale rounded):
// |s^_j - s_j| <= (2 u_S + u_S^2) |s_j|, so each z_j moves by at most 2.0001 u_S max|s / theta|,
// and p_j = exp(z_j) / sum exp(z_i) by exp(2 eps) - 1: scores_in_output 2 (allowed_error doubles
// it for numerator and denominator). The softmax is computed in fp32 from those scores and P is
// rounded once: the P count above.
//
// The math path's backward recipes judge their statistical tier around the gradients of the
// emulated scores (metrics/backward_emulation.hpp) with the roundings of P, dP and dS by their exact
// coefficients: charged as noise, the scores' roundings moved each dS_ij by about 2 u |z| P |dP|, as
// much as a D computed from half of dO does at a few hundred keys, and a default that tried them
// passed that bug. Emulated, a D 10% off fails them, so the default tries them too: PyTorch's bf16
// autograd failed backward_flash_bf16 on most causal heads (ratios 1.1 to 1.5), as its design
// rounds more. What the default then accepts is every design's noise: a FlashAttention kernel with
// a precision defect no larger than the math path's extra roundings fits it
// (tests/recipe_designs_test.cpp measures where).
//
// Backward (FlashAttention 2/3): P rounded before dV = P^T dO moves dV_jc by at most
// u_P sum_i P_ij |dO_ic|, which is dV's magnitude; dS = P (dP - D) rounded before dQ = dS K and
// dK = dS^T Q moves them by at most u_P sum_j |dS_ij| |k_jc| (resp. over queries with |q_ic|),
// within their magnitudes (|dS_ij| <= P_ij (sum_c |dO_ic v_jc| + A_i)): one rounding charged
// against every gradient's magnitude. The math path also rounds dP = dO V^T and the scores:
// three intermediate roundings, and the scores' two as in the forward. Its D is autograd's,
// sum_j P^_ij dP^_ij from the rounded P and dP (DSource::probabilities): their roundings' share of
// D is in their coefficients, and O's rounding, which FlashAttention's D = rowsum(dO * O) carries
// (output_units), is not charged. Charged, it let a D 10% off pass on a one-key head, where the
// exact dS is 0 and O's rounding was allowed u_bf16 sum_c |dO_c v_c|, a few times |D|.
constexpr AttentionRecipe recipes[] = {
    {.name = "attention_fp32", .summary = "S and P in fp32, fp32 sums; only the output rounded"},
    {.name = "flash_bf16",
     .summary = "FlashAttention 2/3: P in bf16 before P V, fp32 row sum and accumulators",
     .intermediates = &bf16,
     .for_format = &bf16},
    {.name = "flash_fp16",
     .summary = "FlashAttention 2/3: P in fp16 before P V, fp32 row sum and accumulators",
     .intermediates = &fp16,
     .for_format = &fp16},
    {.name = "flash_bf16_rounded_sum",
     .summary = "as flash_bf16, the row sum taken from the rounded P",
     .intermediates = &bf16,
     .row_sum = RowSum::rounded,
     .for_format = &bf16,
     .in_default = false},
    {.name = "flash_fp16_rounded_sum",
     .summary = "as flash_fp16, the row sum taken from the rounded P",
     .intermediates = &fp16,
     .row_sum = RowSum::rounded,
     .for_format = &fp16,
     .in_default = false},
    {.name = "math_bf16",
     .summary = "PyTorch's math path on bf16: scores rounded twice, fp32 softmax, P in bf16",
     .intermediates = &bf16,
     .score_roundings = 2,
     .for_format = &bf16},
    {.name = "math_fp16",
     .summary = "PyTorch's math path on fp16: scores rounded twice, fp32 softmax, P in fp16",
     .intermediates = &fp16,
     .score_roundings = 2,
     .for_format = &fp16},
    {.name = "attention_p_rounded",
     .summary = "P rounded to the output's format before P V (either row sum)",
     .in_output_format = true,
     .row_sum = RowSum::rounded},
    {.name = "attention_math_lowp",
     .summary = "scores rounded twice and P once to the output's format",
     .in_output_format = true,
     .row_sum = RowSum::rounded,
     .score_roundings = 2},
    {.name = "attention_backward_flash",
     .summary = "FlashAttention 2 backward in fp32: P from the LSE, D = rowsum(dO * O), fp32 sums",
     .backward = true},
    {.name = "backward_flash_bf16",
     .summary = "FlashAttention 2/3 backward: P in bf16 before dV, dS in bf16 before dQ and dK",
     .backward = true,
     .intermediates = &bf16,
     .gradient_roundings = 1,
     .for_format = &bf16},
    {.name = "backward_flash_fp16",
     .summary = "FlashAttention 2/3 backward: P in fp16 before dV, dS in fp16 before dQ and dK",
     .backward = true,
     .intermediates = &fp16,
     .gradient_roundings = 1,
     .for_format = &fp16},
    {.name = "backward_math_bf16",
     .summary = "PyTorch's math path on bf16, autograd: scores, P, dP and dS rounded to bf16",
     .backward = true,
     .intermediates = &bf16,
     .score_roundings = 2,
     .gradient_roundings = 3,
     .d_source = DSource::probabilities,
     .for_format = &bf16},
    {.name = "backward_math_fp16",
     .summary = "PyTorch's math path on fp16, autograd: scores, P, dP and dS rounded to fp16",
     .backward = true,
     .intermediates = &fp16,
     .score_roundings = 2,
     .gradient_roundings = 3,
     .d_source = DSource::probabilities,
     .for_format = &fp16},
};

constexpr std::size_t recipe_count = std::size(recipes);

kernels::Tolerance derive_forward(const AttentionRecipe& recipe) {
  kernels::Tolerance entry = kernels::find_attention_kernel("attention_flash")->tolerance;
  const bool rounds_p = recipe.intermediates != nullptr || recipe.in_output_format;
  entry.probabilities_in_output = rounds_p ? 2 : 0;
  entry.scores_in_output = recipe.score_roundings;
  entry.probability_format = recipe.intermediates;  // nullptr: the output's format
  entry.score_format = recipe.intermediates;
  entry.row_sum_of_rounded_probabilities = recipe.row_sum == RowSum::rounded;
  entry.scores_emulated = recipe.score_roundings > 0 && recipe.intermediates != nullptr;
  // Below the format's normal range P's rounding errs absolutely, by half the subnormal step f: the
  // weights the kernel rounds lie in [0, 1] (exp(z - max), or P itself) and l >= 1, so the output
  // moves by at most f sum_j |v_j| (fp16: 2^-25). Recipes in the output's format take fp16's, the
  // coarsest 16-bit one (the FP8 kernels have their own entry).
  if (rounds_p) {
    const int exponent = recipe.intermediates != nullptr ? recipe.intermediates->min_subnormal_exponent()
                                                         : fp16.min_subnormal_exponent();
    entry.probability_floor = std::ldexp(1.0, exponent - 1) * (1 + 0x1p-20);
  }
  entry.basis = "analysis: attention_flash's fp32 entry plus the recipe's roundings (metrics/recipes.cpp)";
  entry.reason = recipe.summary;
  return entry;
}

kernels::BackwardTolerance derive_backward(const AttentionRecipe& recipe) {
  kernels::BackwardTolerance entry =
      kernels::find_attention_backward_kernel("attention_backward_flash")->tolerance;
  entry.intermediates = recipe.gradient_roundings;
  entry.score_roundings = recipe.score_roundings;
  entry.intermediate_format = recipe.intermediates;
  entry.scores_emulated = recipe.score_roundings > 0 && recipe.intermediates != nullptr;
  entry.d_from_probabilities = recipe.d_source == DSource::probabilities;
  entry.basis =
      "analysis: attention_backward_flash's entry plus the recipe's roundings (metrics/recipes.cpp)";
  entry.reason = recipe.summary;
  return entry;
}

}  // namespace

std::span<const AttentionRecipe> attention_recipes() { return recipes; }

const AttentionRecipe* find_recipe(std::string_view name) {
  for (const AttentionRecipe& recipe : recipes) {
    if (recipe.name == name) return &recipe;
  }
  return nullptr;
}

const kernels::Tolerance& forward_tolerance(const AttentionRecipe& recipe) {
  static const std::vector<kernels::Tolerance> derived = [] {
    std::vector<kernels::Tolerance> all;
    for (const AttentionRecipe& r : recipes) all.push_back(derive_forward(r));
    return all;
  }();
  return derived.at(static_cast<std::size_t>(&recipe - recipes));
}

const kernels::BackwardTolerance& backward_tolerance(const AttentionRecipe& recipe) {
  static const std::vector<kernels::BackwardTolerance> derived = [] {
    std::vector<kernels::BackwardTolerance> all;
    for (const AttentionRecipe& r : recipes) all.push_back(derive_backward(r));
    return all;
  }();
  return derived.at(static_cast<std::size_t>(&recipe - recipes));
}

const kernels::BackwardTolerance& backward_tolerance_of(const kernels::AttentionBackwardKernel& kernel) {
  if (kernel.recipe.empty()) return kernel.tolerance;
  const AttentionRecipe* recipe = find_recipe(kernel.recipe);
  if (recipe == nullptr || !recipe->backward)
    throw std::logic_error("no backward recipe named " + std::string(kernel.recipe));
  return backward_tolerance(*recipe);
}

std::vector<const AttentionRecipe*> default_recipes(const FloatFormat& inputs, const FloatFormat& output,
                                                    bool backward) {
  std::vector<const AttentionRecipe*> chosen;
  for (const AttentionRecipe& recipe : recipes) {
    if (recipe.backward != backward || recipe.in_output_format || !recipe.in_default) continue;
    if (recipe.for_format != nullptr && recipe.for_format != &inputs && recipe.for_format != &output)
      continue;
    chosen.push_back(&recipe);
  }
  static_assert(recipe_count > 0);
  return chosen;
}

std::vector<const AttentionRecipe*> default_forward_recipes(const FloatFormat& inputs,
                                                            const FloatFormat& output, bool has_lse,
                                                            bool proven_only) {
  std::vector<const AttentionRecipe*> chosen;
  for (const AttentionRecipe* recipe : default_recipes(inputs, output, false)) {
    if (recipe->score_roundings == 0 || (!has_lse && !proven_only)) chosen.push_back(recipe);
  }
  return chosen;
}

std::string intermediate_format_mismatch(std::string_view name, const FloatFormat* intermediates,
                                         const FloatFormat& inputs, const FloatFormat& output,
                                         bool backward) {
  if (intermediates == nullptr || intermediates == &inputs || intermediates == &output ||
      inputs.unit_roundoff() <= fp32.unit_roundoff())
    return {};
  std::string fitting;
  for (const AttentionRecipe* recipe : default_recipes(inputs, output, backward))
    fitting += (fitting.empty() ? "" : ", ") + std::string(recipe->name);
  return std::string(name) + " rounds inside to " + std::string(intermediates->name) +
         ", but the inputs are " + std::string(inputs.name) + " and the output " + std::string(output.name) +
         ": it describes another design (the recipes for these formats: " + fitting + ")";
}

std::string recipe_names(bool backward, bool only_named) {
  std::string names;
  for (const AttentionRecipe& recipe : recipes) {
    if (recipe.backward != backward || (only_named && recipe.in_default && !recipe.in_output_format))
      continue;
    names += (names.empty() ? "" : ", ") + std::string(recipe.name);
  }
  return names;
}

}  // namespace sharpcheck::metrics
