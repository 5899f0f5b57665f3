// The one tolerance table: for each kernel, the largest error the suite accepts per output
// element, as a formula in the accumulation format's unit roundoff u, the output format's unit
// roundoff u_out, the row size n and the row's shifted logits. Every entry is derived in
// metrics/tolerance_table.cpp from a rounding-error analysis (and says so) or from measurement
// (and says so); tests never carry a tolerance of their own.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "formats/float_format.hpp"

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
  // Shifted softmax only: entries with z_j < -negligible_below (an additive mask such as -1e4,
  // -1e9 or finfo.min, or a logit far below the rest). They are left out of n and of
  // largest_magnitude and counted here; see the derivation in tolerance_table.cpp.
  std::size_t negligible = 0;
};

// |z| beyond which an entry of a shifted softmax is negligible (derivation in tolerance_table.cpp).
inline constexpr double negligible_below = 200;
// What one negligible entry can contribute, relative to the row's sum and to an element's own value.
inline constexpr double negligible_contribution = 0x1p-190;

struct Tolerance {
  std::string_view kernel;
  // The accumulation format the bound assumes: the kernel's contract, which a broken kernel
  // (bf16acc, whose running sum is bf16) fails to honour.
  const FloatFormat* accumulation;
  // Relative error bound of element j, in units of u:
  //   argument |z_j| + spread max|z| + unshifted |m/theta| + per_item n + constant
  //   + beta_sensitivity n (2 + ln n + max|z|) (|z_j| + max|z|) + dot_product logit_rounding
  //   + log_length ln n + logarithm (n + 1) |ln magnitude|
  // relative to the element's magnitude (|expected| for softmax, sum_j p_j |v_j| for attention),
  // taken as exp(units u) - 1 so that the large exponent errors of stick-breaking stay bounds.
  double argument;
  double spread;
  double unshifted;
  double per_item;
  double constant;
  double beta_sensitivity;
  double dot_product;
  std::string_view basis;   // "analysis: ..." or "measured: ..."
  std::string_view reason;  // one line: why these coefficients
  double log_length = 0;    // sigmoid attention's bias -ln n, rounded
  double logarithm = 0;     // stick-breaking: an exponent of size |ln A_j| summed over up to n terms

  // Largest accepted |actual - expected| for one element of the given magnitude. Includes the
  // output rounding (the kernel's and the reference's, 2 u_out relative) and an absolute floor
  // of one output subnormal plus four accumulation subnormals.
  [[nodiscard]] double allowed_error(double magnitude, double z_magnitude, const RowScale& row,
                                     const FloatFormat& output) const;
};

// The entry for a kernel; throws std::out_of_range naming the kernel if it has none.
[[nodiscard]] const Tolerance& tolerance_for(std::string_view kernel);
[[nodiscard]] std::span<const Tolerance> tolerance_table();

}  // namespace sharpcheck::metrics
