// A kernel's tolerance entry: the largest error the suite accepts per output element, as a
// formula in units of the accumulation format's unit roundoff u. Each kernel's entry is a field
// of its registry row (kernels/registry.cpp), written beside the derivation that justifies it;
// metrics/tolerance_table.hpp evaluates it (metrics::allowed_error) and holds the entries that
// belong to no built-in kernel (what a plugin is held to).
#pragma once

#include <string_view>

#include "formats/float_format.hpp"

namespace sharpcheck::kernels {

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
  // times sum_j |v_j| (RowScale::value_mass), since a tiny weight's error is not relative to it.
  double probability_floor = 0;
};

}  // namespace sharpcheck::kernels
