// Block-scaled formats as data: the OCP Microscaling formats (MX v1.0: MXFP8, MXFP6, MXFP4, a block
// of 32 elements sharing one E8M0 scale), NVIDIA's NVFP4 (E2M1 elements, an E4M3 scale per 16 and an
// fp32 scale per tensor), and integer quantisation (INT8/INT4 codes, one scale and zero point per
// tensor, block, channel or token). Each with its quantiser under a named scale rule, and exact
// decoding.
//
// Accuracy contract: every decoded value is exact (a double holds code * scale for every format
// here), and quantisation is exact arithmetic under the named rule: the scale is found from the
// exact block maximum, and each element is x / scale rounded once, to nearest with ties to even,
// into the element format (no double rounding: the quotient is formed at 256 bits, and the quotient
// of two doubles lies either on a rounding boundary or at least 2^-110 relative away from it).
// tests/block_scaled_test.cpp checks every code of every element format against an independent
// decoder and each rule against its definition, with the rules' differences shown where they must
// appear.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck {

// How a block's shared power-of-two scale 2^e is chosen from its largest magnitude amax (emax: the
// exponent of the element format's largest value, max its largest value).
enum class ScaleRule {
  // OCP MX v1.0's reference: e = floor(log2 amax) - emax; elements above max saturate (e4m3 blocks
  // whose amax significand exceeds 1.75 lose their top).
  ocp_floor,
  // Transformer Engine, cuBLAS, FlashMLA: the least e with amax / 2^e <= max (ceil(log2(amax/max))),
  // which never saturates.
  ceil,
  // The floor rule after rounding amax to the element's precision, ties to even: a significand of
  // 2 - 2^-(m+1) or more (m the element's fraction bits) carries into the next power of two.
  even,
};

// How a block's scale is stored.
enum class ScaleKind {
  e8m0,  // OCP: an unsigned 8-bit exponent, 2^(code - 127), code 0xFF is NaN
  e4m3,  // NVFP4: a positive fp8 e4m3 scale per block, times an fp32 scale per tensor
};

// A block-scaled format: its element format, its block length along the blocking axis, and how its
// scales are stored.
struct BlockScaledFormat {
  std::string_view name;
  const FloatFormat* element;
  std::size_t block;
  ScaleKind scale;
};

inline constexpr BlockScaledFormat mxfp8_e4m3{"mxfp8_e4m3", &fp8_e4m3, 32, ScaleKind::e8m0};
inline constexpr BlockScaledFormat mxfp8_e5m2{"mxfp8_e5m2", &fp8_e5m2, 32, ScaleKind::e8m0};
inline constexpr BlockScaledFormat mxfp6_e3m2{"mxfp6_e3m2", &fp6_e3m2, 32, ScaleKind::e8m0};
inline constexpr BlockScaledFormat mxfp6_e2m3{"mxfp6_e2m3", &fp6_e2m3, 32, ScaleKind::e8m0};
inline constexpr BlockScaledFormat mxfp4{"mxfp4", &fp4_e2m1, 32, ScaleKind::e8m0};
inline constexpr BlockScaledFormat nvfp4{"nvfp4", &fp4_e2m1, 16, ScaleKind::e4m3};

inline constexpr const BlockScaledFormat* all_block_scaled_formats[] = {&mxfp8_e4m3, &mxfp8_e5m2, &mxfp6_e3m2,
                                                                        &mxfp6_e2m3, &mxfp4,      &nvfp4};

// Looks a block-scaled format up by name ("mxfp8_e4m3", "mxfp8" = mxfp8_e4m3, "nvfp4", ...).
[[nodiscard]] std::optional<const BlockScaledFormat*> find_block_scaled_format(std::string_view name);

// The settings a producer and a consumer of block-scaled data must agree on.
struct ScaleSettings {
  ScaleRule rule = ScaleRule::ocp_floor;
  // One vendor header decodes E8M0 0x00 as zero instead of 2^-127: a setting, not a guess.
  bool e8m0_zero_is_zero = false;
};

// E8M0: 2^(code - 127) for codes 0 to 254 (0x00 is 0 when zero_is_zero), NaN for 0xFF.
[[nodiscard]] double decode_e8m0(std::uint8_t code, bool zero_is_zero = false);

// A tensor in a block-scaled format, as a flat sequence cut into blocks of format.block (the last
// block may be shorter): one element code per value (the element format's bits, low bits of the
// byte; FP4 is not packed here) and one scale code per block; NVFP4 adds its fp32 tensor scale.
struct BlockScaledTensor {
  const BlockScaledFormat* format = nullptr;
  ScaleSettings settings;
  std::vector<std::uint8_t> codes;
  std::vector<std::uint8_t> scale_codes;
  double tensor_scale = 1.0;  // NVFP4's fp32 per-tensor scale; 1 for the MX formats

  // The scale of block b: decoded scale code, times the tensor scale. NaN for E8M0's NaN code.
  [[nodiscard]] double block_scale(std::size_t b) const;
  // The value of element i, exactly: decode(code) * block_scale(i / block); NaN in a NaN block.
  [[nodiscard]] double value(std::size_t i) const;
  [[nodiscard]] std::vector<double> values() const;
};

// Quantises `values` as a producer of `format` under `settings.rule`:
//  MX: the block's scale 2^e by the rule, e clamped to E8M0's [-127, 127] ([-126, 127] for a
//   non-zero block where e8m0_zero_is_zero); each element x / 2^e
//   rounded (saturating) into the element format. A block holding NaN or an infinity gets the
//   NaN scale 0xFF (OCP: the whole block is NaN); an all-zero block gets 2^-127.
//  NVFP4 (the rule is ignored: its scales are not powers of two): tensor scale
//   g = RN_fp32(amax_tensor / (448 * 6)) (1 for an all-zero tensor); block scale
//   s = RN_e4m3(amax_block / (6 g)), saturating at 448; elements RN_e2m1(x / (s g)), saturating,
//   dividing by the rounded scale as the encoders do. A block whose scale rounds to 0 is all zeros;
//   g that rounds to 0 is taken as fp32's least subnormal. InputError for a non-finite value (NVFP4
//   has no NaN scale) or an amax beyond 2688 times fp32's largest (g would be infinite).
[[nodiscard]] BlockScaledTensor quantize(std::span<const double> values, const BlockScaledFormat& format,
                                         const ScaleSettings& settings = {});

// Integer quantisation: code = clamp(round(x / scale) + zero_point, lowest, highest), value =
// scale * (code - zero_point).
enum class IntegerCodes {
  int8,   // [-128, 127]
  uint8,  // [0, 255]
  int4,   // [-8, 7]
  uint4,  // [0, 15]
};
enum class IntegerRounding {
  nearest_even,  // torch.round, numpy.rint, cvt.rni
  nearest_away,  // C's round, Triton's libdevice.round: ties away from zero
};

struct IntegerFormat {
  IntegerCodes codes = IntegerCodes::int8;
  bool symmetric = true;  // zero point 0 and scale amax / highest; otherwise min-max with a zero point
  IntegerRounding rounding = IntegerRounding::nearest_even;
};

[[nodiscard]] std::int32_t lowest_code(IntegerCodes codes);
[[nodiscard]] std::int32_t highest_code(IntegerCodes codes);

// One group's quantisation: its codes and the scale and zero point that decode them.
struct IntegerGroup {
  std::vector<std::int32_t> codes;
  double scale = 1.0;  // an fp32 value, as the kernels store it
  std::int32_t zero_point = 0;

  [[nodiscard]] double value(std::size_t i) const {
    return scale * static_cast<double>(codes[i] - zero_point);
  }
};

// Quantises one group (a tensor, a block, a channel or a token: the caller chooses the grouping).
// Symmetric: scale = RN_fp32(amax / highest) (1 for an all-zero group), zero point 0. Asymmetric:
// scale = RN_fp32((max - min) / (highest - lowest)), zero_point = clamp(lowest - round(min / scale)).
// Codes as above, the quotient x / scale rounded once, exactly; a scale that rounds to 0 is taken as
// fp32's least subnormal. InputError for a non-finite value or a scale beyond fp32's range.
[[nodiscard]] IntegerGroup quantize_integer(std::span<const double> values, const IntegerFormat& format);

}  // namespace sharpcheck
