// The attention backward kernels under test as registry rows (kernels/attention_backward.hpp),
// with the derivation of their tolerance.
#include "kernels/attention_backward.hpp"
#include "kernels/registry.hpp"

namespace sharpcheck::kernels {
namespace {

// Derivation, in units of u = 2^-24 and relative to the magnitudes kernels/tolerance.hpp defines
// (every step below errs relative to the magnitude of the quantity it feeds):
// - P recomputed as exp(z - L): the logit errs by at most logit_rounding u (the fp32 dot product,
//   as in the forward) plus a few |z| u (scale, cap, theta); L, from the flash forward, by
//   (|L| + n + 4) u; exp and its argument's rounding add (|z - L| + 2) u. So P errs relatively by
//   at most (logit_rounding + 4 (|L| + |z - L|) + n + 8) u (|z| <= |L| + |z - L|).
// - dP = dO . v, an fp32 dot product of dv terms: dv u sum_c |dO_ic v_jc|.
// - D: from P and dP (plain) it errs by (eps_P + (dv + n) u) A_i; from O (flash) by O's own error,
//   attention_flash's entry (2 logit + 3|z| + 9 spread + 4 n + 18) u relative to sum_j P_ij |v_j|,
//   times |dO|: within the same units times A_i; plus O's rounding to the format, at most
//   u_out sum_c |dO_ic O_ic| (1 + u): "output_units 1" against that sum (the u part is in the units).
// - dz = P (dP - D + g) and dr = dz dz/dr: four roundings and the slope (with a cap, the tanh's
//   error and its argument's, 2 |tanh| |delta| <= 2 |delta|): a few u, in "constant".
// - dQ sums n keys, dK and dV sum m queries: max(m, n) u.
// Summed with margin: logit 4, lse 12, length 8, dims 4, constant 64. The bugs the twins carry
// cost O(1) relative (D off by half its terms, a missing 1 - tanh^2, NaN) or ~sqrt(n) u_bf16 (dQ
// accumulated in bf16 over n keys), far outside.
constexpr BackwardTolerance plain_tolerance{
    .logit = 4,
    .lse = 12,
    .length = 8,
    .dims = 4,
    .constant = 64,
    .output_units = 0,
    .basis = "analysis: recomputed P, fp32 dot products and sums (kernels/attention_backward_registry.cpp)",
    .reason = "P from a fresh fp32 forward; every sum in fp32; only the gradients rounded to the format"};
constexpr BackwardTolerance flash_tolerance{
    .logit = 4,
    .lse = 12,
    .length = 8,
    .dims = 4,
    .constant = 64,
    .output_units = 1,
    .basis = "analysis: as the plain kernel, D from O rounded to the format",
    .reason = "FlashAttention 2: P from the saved log-sum-exp, D = rowsum(dO * O) with O in the format"};

template <const FloatFormat& Format, BackwardBug Bug, bool RoundsIntermediates>
KernelGradients flash(const BackwardProblem& p) {
  return attention_backward_flash(p, Format,
                                  {.bug = Bug, .intermediates = RoundsIntermediates ? &Format : nullptr});
}
template <const FloatFormat& Format>
KernelGradients math_path(const BackwardProblem& p) {
  return attention_backward_math_lowp(p, Format);
}

// A kernel with its own entry (the fp32-inside designs) or one judged under a recipe.
constexpr AttentionBackwardKernel own(std::string_view name, std::string_view description,
                                      const FloatFormat& format, bool broken,
                                      KernelGradients (*run)(const BackwardProblem&),
                                      const BackwardTolerance& tolerance) {
  return {.name = name,
          .description = description,
          .format = &format,
          .deliberately_broken = broken,
          .run = run,
          .tolerance = tolerance};
}
constexpr AttentionBackwardKernel by_recipe(std::string_view name, std::string_view description,
                                            const FloatFormat& format, bool broken,
                                            KernelGradients (*run)(const BackwardProblem&),
                                            std::string_view recipe) {
  return {.name = name,
          .description = description,
          .format = &format,
          .deliberately_broken = broken,
          .run = run,
          .tolerance = {},
          .recipe = recipe};
}

const AttentionBackwardKernel table[] = {
    own(
        "attention_backward_plain", "fp32: fresh forward, P materialised, fp32 sums", fp32, false,
        [](const BackwardProblem& p) { return attention_backward_plain(p, fp32); }, plain_tolerance),
    own(
        "attention_backward_plain_bf16", "bf16 in and out, the fp32 plain backward inside", bf16, false,
        [](const BackwardProblem& p) { return attention_backward_plain(p, bf16); }, plain_tolerance),
    own("attention_backward_flash",
        "fp32 FlashAttention 2 backward: P from the saved LSE, D = rowsum(dO * O)", fp32, false,
        flash<fp32, BackwardBug::none, false>, flash_tolerance),
    own("attention_backward_flash_bf16", "bf16 FlashAttention 2 backward, fp32 accumulation, O saved in bf16",
        bf16, false, flash<bf16, BackwardBug::none, false>, flash_tolerance),
    own("attention_backward_flash_bf16_stale_d",
        "broken: D from half the head's columns (flash-attention #2481)", bf16, true,
        flash<bf16, BackwardBug::stale_d, false>, flash_tolerance),
    own("attention_backward_flash_bf16_dq_bf16", "broken: dQ accumulated in bf16", bf16, true,
        flash<bf16, BackwardBug::dq_in_output, false>, flash_tolerance),
    own("attention_backward_flash_bf16_no_softcap_grad",
        "broken: the soft-cap's derivative 1 - tanh^2 left out", bf16, true,
        flash<bf16, BackwardBug::no_softcap_grad, false>, flash_tolerance),
    own("attention_backward_flash_bf16_nan_masked",
        "broken: NaN gradients on a query that sees no key (PyTorch #41508)", bf16, true,
        flash<bf16, BackwardBug::nan_on_masked_rows, false>, flash_tolerance),
    // The designs as FlashAttention 2/3 and PyTorch's math path run them on bf16/fp16 tensors,
    // each judged under its recipe alone (metrics/recipes.cpp derives the allowance), and the
    // broken twins again under the looser flash recipe: no recipe may fit a bug.
    by_recipe("flash2_backward_bf16", "FlashAttention 2/3 backward: P and dS in bf16 before their products",
              bf16, false, flash<bf16, BackwardBug::none, true>, "backward_flash_bf16"),
    by_recipe("flash2_backward_fp16", "FlashAttention 2/3 backward: P and dS in fp16 before their products",
              fp16, false, flash<fp16, BackwardBug::none, true>, "backward_flash_fp16"),
    by_recipe("math_backward_bf16", "PyTorch's math path on bf16, autograd: every matmul and softmax rounded",
              bf16, false, math_path<bf16>, "backward_math_bf16"),
    by_recipe("math_backward_fp16", "PyTorch's math path on fp16, autograd: every matmul and softmax rounded",
              fp16, false, math_path<fp16>, "backward_math_fp16"),
    by_recipe("flash2_backward_bf16_stale_d", "broken: D from half the head's columns, P and dS in bf16",
              bf16, true, flash<bf16, BackwardBug::stale_d, true>, "backward_flash_bf16"),
    by_recipe("flash2_backward_bf16_dq_bf16", "broken: dQ accumulated in bf16, P and dS in bf16", bf16, true,
              flash<bf16, BackwardBug::dq_in_output, true>, "backward_flash_bf16"),
    by_recipe("flash2_backward_bf16_no_softcap_grad", "broken: no 1 - tanh^2, P and dS in bf16", bf16, true,
              flash<bf16, BackwardBug::no_softcap_grad, true>, "backward_flash_bf16"),
    by_recipe("flash2_backward_bf16_nan_masked", "broken: NaN on a query that sees no key, P and dS in bf16",
              bf16, true, flash<bf16, BackwardBug::nan_on_masked_rows, true>, "backward_flash_bf16"),
};

}  // namespace

std::span<const AttentionBackwardKernel> attention_backward_kernels() { return table; }

const AttentionBackwardKernel* find_attention_backward_kernel(std::string_view name) {
  return find_named(attention_backward_kernels(), name);
}

}  // namespace sharpcheck::kernels
