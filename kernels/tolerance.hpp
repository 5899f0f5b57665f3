// A kernel's tolerance entry: the largest error the suite accepts per output element, as a
// formula in units of the accumulation format's unit roundoff u. Each kernel's entry is a field
// of its registry row (kernels/registry.cpp), written beside the derivation that justifies it;
// metrics/tolerance_table.hpp evaluates it (metrics::allowed_error) and holds the entries that
// belong to no built-in kernel (what a plugin is held to).
#pragma once

#include <cstddef>
#include <string_view>

#include "formats/float_format.hpp"

namespace sharpcheck::kernels {

// How a kernel rounds its unnormalised softmax weights to a narrow format before P V (FP8 and
// MXFP8 attention, issue 36): w_j = RN_format(min(2^offset_log2 exp(s_j - m), largest)), m the
// running max of an online softmax over tiles of `tile` key positions (the visible keys among
// them; a tile with none is skipped) that moves only when a tile's max
// exceeds it by more than rescale_threshold_log2 (log2 units; 0: whenever it grows), starting at
// the sink's logit if there is one (whose weight is then 2^offset_log2). The reference knows the
// exact scores, so it can emulate every w_j and mark those an honest kernel's fp32 score could
// round the other way (metrics/quantized_weights.hpp): the statistical tier is then judged around
// the attention of the emulated weights, charging only those flips and the fp32 arithmetic,
// instead of 2^-4 of sum_j p_j |v_j| per key.
struct QuantizedWeights {
  const FloatFormat* format = nullptr;
  int offset_log2 = 0;
  double rescale_threshold_log2 = 0;
  std::size_t tile = 128;
  // Whether the row sum l is taken over the rounded weights (the P that P V uses) or over the
  // fp32 ones before rounding (SageAttention3's design, and the SageAttention-2-style kernel
  // here). A kernel that does the other is a bug.
  bool row_sum_of_rounded = true;
  // Whether the kernel smooths K by its mean k~ first (SageAttention; not under a soft-cap or a
  // sink, where the shift is not softmax-invariant): its logits are then formed
  // minus c = q . k~ scale / theta, so their fp32 error is relative to |z| + |c| (bounded per row by
  // metrics::smoothing_shifts), and its log-sum-exp adds c back, formed in fp32.
  bool smoothed_keys = false;
  // Whether the kernel's dot products are exact (INT8 MMAs into int32): a logit's fp32 error is
  // then a few roundings of its own size (of z - c where the keys are smoothed), not the fp32 dot
  // product's d u sum |q k|.
  bool exact_dot_product = false;
};

// Relative error bound of element j, in units of u:
//   argument |z_j| + spread max|z| + unshifted |m/theta| + per_item n + constant
//   + beta_sensitivity n (2 + ln n + max|z|) (|z_j| + max|z|) + dot_product logit_rounding
//   + log_length ln n + logarithm (n + 1) |ln magnitude|
// plus, in units of the output format's u_out (attention's precision models, where scores or
// probabilities are rounded to the output's format inside the computation):
//   scores_in_output 2 max_j |s_j / theta| + probabilities_in_output
// plus probability_floor sum_j |v_j| absolute (FP8 attention's subnormal weights),
// relative to the element's magnitude (|expected| for softmax, sum_j p_j |v_j| for attention),
// taken as exp(units u + output units u_out) - 1 so that the large exponent errors of
// stick-breaking stay bounds.
struct Tolerance {
  // The accumulation format the bound assumes: the kernel's contract, which a broken kernel
  // (bf16acc, whose running sum is bf16) fails to honour.
  const FloatFormat* accumulation = &fp32;
  double argument = 0;
  double spread = 0;
  double unshifted = 0;
  double per_item = 0;
  double constant = 0;
  double beta_sensitivity = 0;
  double dot_product = 0;
  std::string_view basis;   // "analysis: ..." or "measured: ..."
  std::string_view reason;  // one line: why these coefficients
  double log_length = 0;    // sigmoid attention's bias -ln n, rounded
  double logarithm = 0;     // stick-breaking: an exponent of size |ln A_j| summed over up to n terms
  // Attention precision models (metrics/tolerance_table.cpp): how many times each scaled score s_j
  // is rounded to the output's format before the softmax, and each probability before P V.
  double scores_in_output = 0;
  double probabilities_in_output = 0;
  // Attention: an absolute error per key's probability (an e4m3 P's subnormal step), charged
  // times sum_j |v_j| (RowScale::value_mass; over Z where floor_over_row_sum says so), since a tiny
  // weight's error is not relative to it.
  double probability_floor = 0;
  // The formats the two counts above are charged in: where a precision recipe rounds P (or the
  // scores) inside the kernel (metrics/recipes.hpp). nullptr: the output's format, which is what
  // the names that predate recipes (attention_p_rounded, attention_math_lowp) mean.
  const FloatFormat* probability_format = nullptr;
  const FloatFormat* score_format = nullptr;
  // Whether the softmax denominator may be summed from the rounded P (then the log-sum-exp moves
  // with P's rounding too). Recipes that sum the fp32 exponentials say false.
  bool row_sum_of_rounded_probabilities = true;
  // A math-path recipe whose score roundings are emulated exactly (metrics/score_emulation.hpp):
  // its statistical tier is centred on the attention of the emulated scores, and charges only P's
  // rounding and the fp32 arithmetic around it, where the head's scores are the plain math path's.
  bool scores_emulated = false;
  // The floor is charged against sum_j |v_j| / Z (RowScale::value_mass_over_z): only for kernels
  // that round unnormalised weights exp(z - m) at a fixed offset and divide by their sum afterwards
  // (the FP8 and MXFP8 attention kernels). A recipe rounding the normalised P charges sum_j |v_j|.
  bool floor_over_row_sum = false;
  // A kernel whose weights are rounded at a fixed offset as QuantizedWeights says: its statistical
  // tier is centred on the emulated weights (metrics/quantized_weights.hpp). nullptr: not emulated.
  const QuantizedWeights* quantized_weights = nullptr;
  // Adaptive temperature whose entropy is formed from unshifted logits (log Z - sum p z with z
  // = e / theta, not e - max): the entropy's error, which beta_sensitivity carries to the output,
  // grows with |m / theta| as well as with the spread (its factor 2 + ln n + max|z| gains |m/theta|).
  bool entropy_unshifted = false;
};

// An attention backward kernel's tolerance (metrics/judge_backward.hpp): each gradient element
// may err by (exp(units u + output_units u_out) - 1) M + 2 u_out |expected|, M the element's
// magnitude (sum_j P_ij (sum_c |dO_ic v_jc| + A_i + |dLSE_i|) |dz/dr| |k_jc| for dQ, the same over
// queries with |q_ic| for dK, sum_i P_ij |dO_ic| for dV; A_i = sum_j P_ij sum_c |dO_ic v_jc|), with
//   units = logit max logit_rounding + lse (max|L_i| + max|z_ij - L_i|) + length max(m, n)
//           + dims (d + dv) + constant,
// plus output_units u_out times what D_i moving by sum_c |dO_ic O_ic| moves the element by (the
// forward output O rounded to the format, from which FlashAttention forms D). Derivation beside
// the entries (kernels/attention_backward_registry.cpp).
struct BackwardTolerance {
  double logit = 0;
  double lse = 0;
  double length = 0;
  double dims = 0;
  double constant = 0;
  double output_units = 0;
  std::string_view basis;
  std::string_view reason;
  // Precision recipes (metrics/recipes.hpp): intermediates a kernel rounds to `intermediate_format`
  // before a product. `intermediates` counts roundings of P (before dV = P^T dO), of dP and of
  // dS (before dQ = dS K and dK = dS^T Q), each relative error u_i moving the gradient by at most
  // u_i times its magnitude (the magnitudes above bound |P| |dO|, |dS| |K| and |dS| |Q|);
  // `score_roundings` counts roundings of the scores s (as the forward's scores_in_output: each
  // moves P relatively by 2 u_i max|s|, so every gradient by as much relative to its magnitude).
  double intermediates = 0;
  double score_roundings = 0;
  const FloatFormat* intermediate_format = nullptr;
  // The math path's recipes: the statistical tier judged around the gradients of the emulated
  // scores where a head allows (metrics/judge_backward.cpp), not charging their roundings as noise.
  bool scores_emulated = false;
  // D_i = sum_j P_ij dP_ij from the saved P (autograd's softmax backward: PyTorch's math path)
  // rather than rowsum(dO * O): O's rounding is not in it, and output_units is not charged.
  bool d_from_probabilities = false;
};

}  // namespace sharpcheck::kernels
