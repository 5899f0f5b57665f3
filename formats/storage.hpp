// Storage types for kernels: bf16, fp16 and fp8 values as their bit patterns, with fast exact
// conversions to and from float (round to nearest, ties to even; NaN stays NaN; overflow as
// formats/float_format.hpp states for each format).
//
// These are the conversions kernels use on their hot paths; tests check them against
// round_to_format and encode over every bit pattern and every float rounding boundary.
#pragma once

#include <bit>
#include <cstdint>

#include "formats/float_format.hpp"

namespace sharpcheck {

struct Bfloat16 {
  std::uint16_t bits = 0;

  [[nodiscard]] static constexpr Bfloat16 from_float(float value) {
    const auto word = std::bit_cast<std::uint32_t>(value);
    if ((word & 0x7FFFFFFFU) > 0x7F800000U)
      return Bfloat16{static_cast<std::uint16_t>((word >> 16) | 0x0040U)};
    // Adding 0x7FFF plus the kept part's lowest bit carries into the kept half exactly when the
    // dropped half is above one half, or equal to one half with an odd kept part: ties to even.
    // A carry out of the largest finite value gives the infinity pattern, as IEEE rounding does.
    const std::uint32_t rounding = 0x7FFFU + ((word >> 16) & 1U);
    return Bfloat16{static_cast<std::uint16_t>((word + rounding) >> 16)};
  }
  [[nodiscard]] constexpr float to_float() const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  static constexpr const FloatFormat& format = bf16;
};

struct Float16 {
  std::uint16_t bits = 0;

  [[nodiscard]] static Float16 from_float(float value) {
    // _Float16 conversion is IEEE round-to-nearest-even (g++ >= 12 or clang >= 15 on x86-64).
    return Float16{std::bit_cast<std::uint16_t>(static_cast<_Float16>(value))};
  }
  [[nodiscard]] float to_float() const { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
  static constexpr const FloatFormat& format = fp16;
};

// The 8-bit formats have no hardware conversion on the CPUs this project targets; they go
// through the exact generic rounding of formats/float_format.hpp.
template <const FloatFormat& Format>
struct Float8 {
  std::uint8_t bits = 0;

  [[nodiscard]] static Float8 from_float(float value) {
    return Float8{
        static_cast<std::uint8_t>(encode(round_to_format(static_cast<double>(value), Format), Format))};
  }
  [[nodiscard]] float to_float() const { return static_cast<float>(decode(bits, Format)); }
  static constexpr const FloatFormat& format = Format;
};
using Float8E4M3 = Float8<fp8_e4m3>;

// Kernels reinterpret arrays of these as arrays of their bit patterns.
static_assert(sizeof(Bfloat16) == 2 && sizeof(Float16) == 2 && sizeof(Float8E4M3) == 1);
using Float8E5M2 = Float8<fp8_e5m2>;

}  // namespace sharpcheck
