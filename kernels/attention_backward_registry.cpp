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
    4,
    12,
    8,
    4,
    64,
    0,
    "analysis: recomputed P, fp32 dot products and sums (kernels/attention_backward_registry.cpp)",
    "P from a fresh fp32 forward; every sum in fp32; only the gradients rounded to the format"};
constexpr BackwardTolerance flash_tolerance{
    4,
    12,
    8,
    4,
    64,
    1,
    "analysis: as the plain kernel, D from O rounded to the format",
    "FlashAttention 2: P from the saved log-sum-exp, D = rowsum(dO * O) with O in the format"};

template <BackwardBug Bug>
KernelGradients flash_bf16(const BackwardProblem& p) {
  return attention_backward_flash(p, bf16, Bug);
}

const AttentionBackwardKernel table[] = {
    {"attention_backward_plain", "fp32: fresh forward, P materialised, fp32 sums", &fp32, false,
     [](const BackwardProblem& p) { return attention_backward_plain(p, fp32); }, plain_tolerance},
    {"attention_backward_plain_bf16", "bf16 in and out, the fp32 plain backward inside", &bf16, false,
     [](const BackwardProblem& p) { return attention_backward_plain(p, bf16); }, plain_tolerance},
    {"attention_backward_flash", "fp32 FlashAttention 2 backward: P from the saved LSE, D = rowsum(dO * O)",
     &fp32, false, [](const BackwardProblem& p) { return attention_backward_flash(p, fp32); },
     flash_tolerance},
    {"attention_backward_flash_bf16", "bf16 FlashAttention 2 backward, fp32 accumulation, O saved in bf16",
     &bf16, false, flash_bf16<BackwardBug::none>, flash_tolerance},
    {"attention_backward_flash_bf16_stale_d",
     "broken: D from half the head's columns (flash-attention #2481)", &bf16, true,
     flash_bf16<BackwardBug::stale_d>, flash_tolerance},
    {"attention_backward_flash_bf16_dq_bf16", "broken: dQ accumulated in bf16", &bf16, true,
     flash_bf16<BackwardBug::dq_in_output>, flash_tolerance},
    {"attention_backward_flash_bf16_no_softcap_grad", "broken: the soft-cap's derivative 1 - tanh^2 left out",
     &bf16, true, flash_bf16<BackwardBug::no_softcap_grad>, flash_tolerance},
    {"attention_backward_flash_bf16_nan_masked",
     "broken: NaN gradients on a query that sees no key (PyTorch #41508)", &bf16, true,
     flash_bf16<BackwardBug::nan_on_masked_rows>, flash_tolerance},
};

}  // namespace

std::span<const AttentionBackwardKernel> attention_backward_kernels() { return table; }

const AttentionBackwardKernel* find_attention_backward_kernel(std::string_view name) {
  return find_named(attention_backward_kernels(), name);
}

}  // namespace sharpcheck::kernels
