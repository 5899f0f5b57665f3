// The fp32 arithmetic the reference-style attention kernels share (internal to kernels/): a dot
// product summed left to right in fp32, and rounding an fp32 value into a stored format. One
// definition, so the forward kernels, the designs of kernels/attention_designs.hpp and the
// backward round and sum in exactly the same order.
#pragma once

#include <cstddef>

#include "formats/float_format.hpp"

namespace sharpcheck::kernels {

// sum_t a[t] b[t], accumulated in fp32 in index order (what the kernels' error analyses assume).
inline float dot(const float* a, const float* b, std::size_t length) {
  float sum = 0.0F;
  for (std::size_t t = 0; t < length; ++t) sum += a[t] * b[t];
  return sum;
}

// value rounded to nearest-even in `format` (exact: fp32 to double is exact, then one rounding).
inline float round_to(float value, const FloatFormat& format) {
  return static_cast<float>(round_to_format(static_cast<double>(value), format));
}

}  // namespace sharpcheck::kernels
