// Precision recipes: where an attention kernel rounds inside its computation, and to what, as
// data. A recipe is what a kernel's design implies (FlashAttention 2/3 round P to bf16 before
// P V; PyTorch's math path on bf16 tensors rounds the scores and P as well), and it is the one
// thing a verdict's allowance is derived from: metrics/tolerance_table.cpp turns a recipe's
// roundings into each element's allowance (proven and statistical tiers), and
// metrics/evaluate.cpp adds the data-dependent parts (the statistical charge of P's rounding for
// this row's exact P and V, the row-scale test). Every name that predates recipes
// (attention_fp32, attention_p_rounded, attention_math_lowp, attention_backward_flash, ...) is a
// recipe here or a kernel's own entry.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/tolerance.hpp"

namespace sharpcheck::metrics {

// Where the kernel's softmax denominator l comes from when P is rounded: the fp32 exponentials
// before rounding (FlashAttention 2/3) or the rounded ones. Outputs are judged under either (the
// two differ by a common factor far inside the allowance); the log-sum-exp is not: a row sum of
// rounded P moves it by up to u_P, which a recipe that sums unrounded P does not allow.
enum class RowSum { unrounded, rounded };
// Where a backward kernel takes D_i from: rowsum(dO * O) with O as the forward saved it
// (FlashAttention), or sum_j P_ij dP_ij from the saved P (autograd's softmax backward).
enum class DSource { output, probabilities };

struct AttentionRecipe {
  std::string_view name;
  std::string_view summary;  // one line: "P in bf16 before P V; fp32 row sum"
  bool backward = false;     // a recipe for the gradients (else for the forward output and LSE)
  // The format P is rounded to before a product that uses it (forward: P V; backward: P^T dO,
  // and dS before dS K and dS^T Q). nullptr with `in_output_format` false: kept in fp32.
  const FloatFormat* intermediates = nullptr;
  bool in_output_format = false;  // the names that predate recipes: "the output's format"
  RowSum row_sum = RowSum::unrounded;
  int score_roundings = 0;             // roundings of each score to the intermediates' format (math path: 2)
  double gradient_roundings = 0;       // backward: how many of P, dP, dS are rounded (each relative to M)
  DSource d_source = DSource::output;  // backward
  // The formats this recipe is for (a default judgement tries it only where the kernel's
  // inputs or output have this format); nullptr: any.
  const FloatFormat* for_format = nullptr;
  // Tried by a judgement that names no recipe. The rounded-sum variants are not: their LSE may
  // move by u_P sqrt(sum p^2), which would let an LSE off by 1e-3 pass at a few hundred keys as
  // "a kernel that sums the rounded P" (a design FlashAttention does not use); nor the math path's
  // backward (recipes.cpp says why). Name them to use them.
  bool in_default = true;
};

// Every recipe, forward first, each group from the tightest to the loosest.
[[nodiscard]] std::span<const AttentionRecipe> attention_recipes();
// nullptr if no recipe has that name.
[[nodiscard]] const AttentionRecipe* find_recipe(std::string_view name);

// The forward allowance of a recipe: attention_flash's fp32 entry (kernels/attention_registry.cpp)
// plus the recipe's roundings, each charged in its own format's unit (derivation in recipes.cpp).
[[nodiscard]] const kernels::Tolerance& forward_tolerance(const AttentionRecipe& recipe);
// The backward allowance: FlashAttention 2's fp32 entry (kernels/attention_backward_registry.cpp)
// plus the recipe's roundings.
[[nodiscard]] const kernels::BackwardTolerance& backward_tolerance(const AttentionRecipe& recipe);

// A built-in backward kernel's allowance: the recipe its row names, or its own entry.
[[nodiscard]] const kernels::BackwardTolerance& backward_tolerance_of(
    const kernels::AttentionBackwardKernel& kernel);

// The recipes a judgement with no recipe named tries, in order (the first that fits is the
// verdict's): the fp32 recipe, then for each of bf16 and fp16 that the inputs or the output
// have, FlashAttention's and then the math path's.
[[nodiscard]] std::vector<const AttentionRecipe*> default_recipes(const FloatFormat& inputs,
                                                                  const FloatFormat& output, bool backward);

// The forward recipes a judgement that names none tries, in order: default_recipes less the math
// path's when the kernel returns a log-sum-exp (PyTorch's math path returns none; its rounded
// scores move L by about u sqrt(sum p^2 z^2), enough for an LSE off by 1e-3 at a few hundred keys)
// or when the proven tier alone is asked for (the rounded scores' worst case, 4 u max|z|, is then
// all that is charged: loose enough for a mis-normalised row).
[[nodiscard]] std::vector<const AttentionRecipe*> default_forward_recipes(const FloatFormat& inputs,
                                                                          const FloatFormat& output,
                                                                          bool has_lse, bool proven_only);

// Why a named recipe or tolerance entry, rounding inside to `intermediates` (nullptr: the output's
// format or none), does not describe a kernel of these formats (empty: it may). A design rounds P
// to its own input or output format (FlashAttention's bf16 P for bf16 tensors), or a kernel on
// fp32 tensors rounds to a narrower format inside (bf16 or FP8 tensor cores); a bf16 kernel
// judged under fp16's or FP8's recipe is judged by another design's allowance, tighter (a false
// fail naming the wrong cause) or looser (FP8's lets a bf16 kernel's bugs pass).
[[nodiscard]] std::string intermediate_format_mismatch(std::string_view name,
                                                       const FloatFormat* intermediates,
                                                       const FloatFormat& inputs, const FloatFormat& output,
                                                       bool backward);

// The names, comma-separated, for messages (only those a default judgement does not try, with
// `only_named`).
[[nodiscard]] std::string recipe_names(bool backward, bool only_named = false);

}  // namespace sharpcheck::metrics
