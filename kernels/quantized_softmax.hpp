// TFLite-style quantized softmax: int8 logits (scale 1/16, zero point 0), exp by a lookup table
// over the 256 possible differences from the row's maximum code, a float sum, and rounding to
// the output quantization with TFLite's round-half-away-from-zero. Outputs use TFLite's softmax
// conventions: scale 1/256 with zero point -128 (int8) or 0 (uint8).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sharpcheck::kernels {

inline constexpr float quantized_input_scale = 1.0F / 16;

void softmax_int8(const std::int8_t* codes, std::int8_t* out, std::size_t n, float beta);
void softmax_uint8(const std::int8_t* codes, std::uint8_t* out, std::size_t n, float beta);

}  // namespace sharpcheck::kernels
