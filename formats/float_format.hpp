// Binary floating-point formats (fp64, fp32, tf32, bf16, fp16, fp8 e4m3/e5m2) as data, with exact
// round-to-nearest-even into each of them, bit encodings and ulp distance.
//
// Every value of every format here is exactly representable as a double, so a value of a
// format is carried as a double that the format can hold; the format decides which doubles
// those are. Rounding contract: round_to_format returns the format value nearest to the
// exact input, ties to the one with an even last significand bit, subnormals included.
// The input is never rounded twice: from a double it is rounded once, and from an MPFR
// value it is rounded once from the MPFR value itself.
#pragma once

#include <mpfr.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace sharpcheck {

// What rounding does with a finite value beyond the largest finite one.
enum class OverflowBehaviour {
  to_infinity,  // IEEE 754: round to nearest gives +-infinity (fp64, fp32, bf16, fp16, fp8 e5m2).
  to_nan,       // OCP fp8 e4m3 "fn" has no infinity; like PyTorch's cast, overflow gives NaN.
  saturate,     // fixed-point grids of quantized kernels and the OCP MX element formats fp6/fp4:
                // beyond the range (infinities too) clamps; no code is NaN or infinite.
};

struct FloatFormat {
  std::string_view name;
  int exponent_bits;
  int fraction_bits;        // stored significand bits; precision is fraction_bits + 1
  int min_normal_exponent;  // the smallest normal value is 2^min_normal_exponent
  int max_exponent;         // the largest finite value lies in [2^max_exponent, 2^(max_exponent+1))
  double max_finite;
  OverflowBehaviour overflow;

  [[nodiscard]] constexpr int precision() const { return fraction_bits + 1; }
  [[nodiscard]] constexpr int total_bits() const { return 1 + exponent_bits + fraction_bits; }
  // Exponent of the smallest subnormal: 2^(min_normal_exponent - fraction_bits).
  [[nodiscard]] constexpr int min_subnormal_exponent() const { return min_normal_exponent - fraction_bits; }
  [[nodiscard]] constexpr bool has_infinity() const { return overflow == OverflowBehaviour::to_infinity; }
  // Unit roundoff u = 2^-precision: the largest relative error of rounding to nearest (normal range).
  [[nodiscard]] double unit_roundoff() const;
  friend constexpr bool operator==(const FloatFormat& a, const FloatFormat& b) { return a.name == b.name; }
};

inline constexpr FloatFormat fp64{
    "fp64", 11, 52, -1022, 1023, 1.7976931348623157e308, OverflowBehaviour::to_infinity};
inline constexpr FloatFormat fp32{
    "fp32", 8, 23, -126, 127, 3.4028234663852886e38, OverflowBehaviour::to_infinity};
inline constexpr FloatFormat bf16{
    "bf16", 8, 7, -126, 127, 3.3895313892515355e38, OverflowBehaviour::to_infinity};
inline constexpr FloatFormat fp16{"fp16", 5, 10, -14, 15, 65504.0, OverflowBehaviour::to_infinity};
// NVIDIA's TensorFloat-32 (Ampere and later tensor cores; torch.backends.cuda.matmul.allow_tf32):
// fp32's 8-bit exponent with fp16's 10 fraction bits, stored in fp32 containers; its 19 bits are
// encoded here as sign, exponent, fraction (the fp32 pattern shifted right by 13).
inline constexpr FloatFormat tf32{
    "tf32", 8, 10, -126, 127, 3.4011621342146535e38, OverflowBehaviour::to_infinity};
// OCP 8-bit e4m3 "fn": bias 7, no infinities, only S.1111.111 is NaN, so the largest finite is 448.
inline constexpr FloatFormat fp8_e4m3{"fp8_e4m3", 4, 3, -6, 8, 448.0, OverflowBehaviour::to_nan};
inline constexpr FloatFormat fp8_e5m2{"fp8_e5m2", 5, 2, -14, 15, 57344.0, OverflowBehaviour::to_infinity};

// Affine-quantized 8-bit values seen as fixed-point grids (value = scale * (code - zero point)
// with a power-of-two scale), so that the same exact rounding serves them: every grid value is a
// "subnormal" of the pseudo-format below, and overflow saturates.
//  q8_probabilities: TFLite's softmax outputs, scale 1/256: the grid k/256, k in [0, 255]
//    (uint8 with zero point 0 and int8 with zero point -128 hold the same values).
//  q8_logits: int8 logits with scale 1/16 and zero point 0, codes -127 to 127 (symmetric:
//    -128 is left out so the grid is one format): k/16 in [-7.9375, 7.9375].
inline constexpr FloatFormat q8_probabilities{"q8_probabilities",         2, 8, 0, 0, 255.0 / 256,
                                              OverflowBehaviour::saturate};
inline constexpr FloatFormat q8_logits{"q8_logits", 4, 7, 3, 3, 127.0 / 16, OverflowBehaviour::saturate};

// The OCP Microscaling (MX v1.0) element formats beyond fp8: no infinities and no NaN (every code is
// a finite value; NaN lives in the block's E8M0 scale), conversion saturates. Used as elements of
// formats/block_scaled.hpp's formats, not as formats of a whole tensor, so they are not in the list
// below.
//  fp6_e3m2: bias 3, values up to 28; fp6_e2m3: bias 1, up to 7.5; fp4_e2m1: bias 1, up to 6
//  (the eight magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
inline constexpr FloatFormat fp6_e3m2{"fp6_e3m2", 3, 2, -2, 4, 28.0, OverflowBehaviour::saturate};
inline constexpr FloatFormat fp6_e2m3{"fp6_e2m3", 2, 3, 0, 2, 7.5, OverflowBehaviour::saturate};
inline constexpr FloatFormat fp4_e2m1{"fp4_e2m1", 2, 1, 0, 2, 6.0, OverflowBehaviour::saturate};

// All formats, widest first.
inline constexpr const FloatFormat* all_float_formats[] = {&fp64, &fp32,     &tf32,    &bf16,
                                                           &fp16, &fp8_e4m3, &fp8_e5m2};

// Looks a format up by name ("fp32", "bf16", "fp8_e4m3", also "e4m3"/"e5m2"); nullopt if unknown.
[[nodiscard]] std::optional<const FloatFormat*> find_float_format(std::string_view name);

// Round-to-nearest-even of x into the format. NaN stays NaN; +-inf stays +-inf where the format
// has infinities and becomes NaN in fp8 e4m3; finite overflow follows format.overflow.
// Independent of the current floating-point environment.
[[nodiscard]] double round_to_format(double x, const FloatFormat& format);
// Same contract, from an MPFR value of any precision, rounded once (never through a double).
[[nodiscard]] double round_to_format(mpfr_srcptr x, const FloatFormat& format);

// True when x is a value of the format. NaN counts as representable in every format that has a NaN
// code, that is every format but the saturating ones (the quantized grids, fp6, fp4).
[[nodiscard]] bool is_representable(double x, const FloatFormat& format);

// Bit pattern of a representable value (sign, biased exponent, fraction); NaN encodes as the
// format's canonical quiet NaN. Throws std::invalid_argument if x is not representable (NaN
// included for a saturating format, which has no NaN code).
[[nodiscard]] std::uint64_t encode(double x, const FloatFormat& format);
// The value of a bit pattern (only the low total_bits() bits are read). A saturating format's every
// code is finite.
[[nodiscard]] double decode(std::uint64_t bits, const FloatFormat& format);

// Neighbouring values in the format; next_up(max_finite) is +inf (or NaN for e4m3),
// next_up(-0) and next_up(+0) are the smallest positive subnormal. NaN stays NaN.
[[nodiscard]] double next_up(double x, const FloatFormat& format);
[[nodiscard]] double next_down(double x, const FloatFormat& format);

// Ordinal distance between two representable values: the number of format values one must step
// over to go from a to b. +0 and -0 are 0 apart, the infinities are one step beyond max_finite.
// nullopt if either is NaN (no ordinal), unless both are NaN, which are 0 apart.
[[nodiscard]] std::optional<std::uint64_t> ulp_distance(double a, double b, const FloatFormat& format);

// Hexadecimal float text of a double ("0x1.8p-3"), for reports that must be exact.
[[nodiscard]] std::string hex_float(double x);

}  // namespace sharpcheck
