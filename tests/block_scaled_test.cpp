// The block-scaled and integer formats (formats/block_scaled.hpp) against independent decoders and
// a brute-force quantiser: every code of every element format, every E8M0 code, and each scale rule
// checked element by element against a search over all codes for the nearest (ties to the even code),
// with the rules' differences shown where the OCP and Transformer Engine rules disagree, and a
// mutation check (a block quantised by one rule, checked against another, must be caught).
#include "formats/block_scaled.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"

namespace sharpcheck {
namespace {

// The OCP MX v1.0 element formats as the spec's tables describe them, written without
// formats/float_format.cpp: value = (-1)^s 2^(E - bias) (1 + M / 2^m), or 2^(1 - bias) M / 2^m when
// E = 0, with every code finite.
struct SpecElement {
  const FloatFormat* format;
  int exponent_bits, mantissa_bits, bias;
  double max_normal, min_normal, min_subnormal;
};
constexpr SpecElement spec_elements[] = {
    {&fp4_e2m1, 2, 1, 1, 6.0, 1.0, 0.5},
    {&fp6_e2m3, 2, 3, 1, 7.5, 1.0, 0.125},
    {&fp6_e3m2, 3, 2, 3, 28.0, 0.25, 0.0625},
};

double spec_decode(std::uint32_t code, const SpecElement& spec) {
  const std::uint32_t mantissa = code & ((1U << spec.mantissa_bits) - 1);
  const std::uint32_t exponent = (code >> spec.mantissa_bits) & ((1U << spec.exponent_bits) - 1);
  const bool negative = (code >> (spec.mantissa_bits + spec.exponent_bits)) & 1U;
  const double fraction = mantissa / std::pow(2.0, spec.mantissa_bits);
  const double magnitude = exponent == 0
                               ? std::pow(2.0, 1 - spec.bias) * fraction
                               : std::pow(2.0, static_cast<int>(exponent) - spec.bias) * (1 + fraction);
  return negative ? -magnitude : magnitude;
}

TEST(ElementFormats, EveryCodeDecodesAsTheOcpTablesSayAndIsFinite) {
  for (const SpecElement& spec : spec_elements) {
    const FloatFormat& format = *spec.format;
    const std::uint32_t codes = 1U << (1 + spec.exponent_bits + spec.mantissa_bits);
    double largest = 0, least_normal = INFINITY, least_positive = INFINITY;
    for (std::uint32_t code = 0; code < codes; ++code) {
      const double value = decode(code, format);
      ASSERT_TRUE(std::isfinite(value)) << format.name << " code " << code;
      EXPECT_EQ(value, spec_decode(code, spec)) << format.name << " code " << code;
      EXPECT_EQ(std::signbit(value), code >= codes / 2) << format.name << " code " << code;
      EXPECT_EQ(encode(value, format), code) << format.name << " code " << code;
      largest = std::max(largest, value);
      if (value > 0) least_positive = std::min(least_positive, value);
      if (value > 0 && (code >> spec.mantissa_bits) != 0) least_normal = std::min(least_normal, value);
    }
    EXPECT_EQ(largest, spec.max_normal) << format.name;
    EXPECT_EQ(largest, format.max_finite) << format.name;
    EXPECT_EQ(least_normal, spec.min_normal) << format.name;
    EXPECT_EQ(least_positive, spec.min_subnormal) << format.name;
  }
  // FP4 E2M1's eight magnitudes, as printed in the spec.
  const double e2m1[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (std::uint32_t code = 0; code < 8; ++code) EXPECT_EQ(decode(code, fp4_e2m1), e2m1[code]);
}

TEST(ElementFormats, RoundingSaturatesAndHasNoNan) {
  for (const SpecElement& spec : spec_elements) {
    const FloatFormat& format = *spec.format;
    EXPECT_EQ(round_to_format(spec.max_normal * 1.5, format), spec.max_normal) << format.name;
    EXPECT_EQ(round_to_format(-INFINITY, format), -spec.max_normal) << format.name;
    EXPECT_FALSE(is_representable(std::nan(""), format)) << format.name;
    EXPECT_THROW((void)encode(std::nan(""), format), std::invalid_argument) << format.name;
    // Midway between the two smallest positive values: ties to the even code (0 for the first).
    EXPECT_EQ(round_to_format(spec.min_subnormal / 2, format), 0.0) << format.name;
    EXPECT_EQ(round_to_format(spec.min_subnormal * 1.5, format), 2 * spec.min_subnormal) << format.name;
  }
  EXPECT_EQ(round_to_format(5.0, fp4_e2m1), 4.0);  // midway between 4 (code 6, even) and 6
  EXPECT_EQ(round_to_format(2.5, fp4_e2m1), 2.0);  // midway between 2 (code 4) and 3
  EXPECT_EQ(round_to_format(3.5, fp4_e2m1), 4.0);  // midway between 3 (code 5) and 4 (code 6)
}

TEST(E8m0, EveryCodeIsAPowerOfTwoButTheNanCode) {
  for (int code = 0; code < 255; ++code)
    EXPECT_EQ(decode_e8m0(static_cast<std::uint8_t>(code)), std::ldexp(1.0, code - 127)) << code;
  EXPECT_TRUE(std::isnan(decode_e8m0(0xFF)));
  EXPECT_EQ(decode_e8m0(0x00, /*zero_is_zero=*/true), 0.0);
  EXPECT_EQ(decode_e8m0(0x01, /*zero_is_zero=*/true), std::ldexp(1.0, -126));
}

// The element code nearest to `target` by a search over every code (ties to the even code), with
// the target clamped to the format's range first: what a saturating encoder must return.
double nearest_by_search(double target, const FloatFormat& element) {
  const std::uint32_t codes = 1U << element.total_bits();
  double best = NAN;
  std::uint32_t best_code = 0;
  for (std::uint32_t code = 0; code < codes; ++code) {
    const double value = decode(code, element);
    if (!std::isfinite(value)) continue;
    const double distance = std::fabs(value - target), best_distance = std::fabs(best - target);
    if (std::isnan(best) || distance < best_distance ||
        (distance == best_distance && (code & 1U) == 0 && (best_code & 1U) == 1)) {
      best = value;
      best_code = code;
    }
  }
  return best;
}

// The shared exponent each rule defines, from its definition (log2 through frexp, no shortcuts).
int rule_exponent(double amax, const FloatFormat& element, ScaleRule rule) {
  int e = 0;
  const double m = 2 * std::frexp(amax, &e);  // amax = m 2^(e-1), 1 <= m < 2
  const int floor_log2 = e - 1;
  if (rule == ScaleRule::ocp_floor) return floor_log2 - element.max_exponent;
  if (rule == ScaleRule::even) {
    const double rounded =
        std::ldexp(std::nearbyint(std::ldexp(m, element.fraction_bits)), -element.fraction_bits);
    return (rounded >= 2 ? floor_log2 + 1 : floor_log2) - element.max_exponent;
  }
  for (int candidate = floor_log2 - element.max_exponent - 2;; ++candidate) {
    if (amax / std::ldexp(1.0, candidate) <= element.max_finite) return candidate;
  }
}

// Mismatches between a quantised MX tensor and the rule's definition, element by element.
int mismatches_against_rule(std::span<const double> values, const BlockScaledTensor& tensor, ScaleRule rule) {
  const BlockScaledFormat& format = *tensor.format;
  int mismatches = 0;
  for (std::size_t start = 0; start < values.size(); start += format.block) {
    const std::size_t end = std::min(values.size(), start + format.block);
    double amax = 0;
    for (std::size_t i = start; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
    const int exponent = std::clamp(rule_exponent(amax, *format.element, rule), -127, 127);
    const double scale = std::ldexp(1.0, exponent);
    if (tensor.block_scale(start / format.block) != scale) ++mismatches;
    for (std::size_t i = start; i < end; ++i) {
      if (tensor.value(i) != nearest_by_search(values[i] / scale, *format.element) * scale) ++mismatches;
    }
  }
  return mismatches;
}

// Blocks of normal(0, 1) values times a per-block magnitude from 2^-20 to 2^20, some with one outlier.
std::vector<double> random_blocks(std::uint64_t seed, std::size_t blocks, std::size_t block) {
  DeterministicRandom random(seed);
  std::vector<double> values;
  for (std::size_t b = 0; b < blocks; ++b) {
    const double magnitude = std::ldexp(1.0, static_cast<int>(random.below(41)) - 20);
    for (std::size_t i = 0; i < block; ++i) values.push_back(random.normal() * magnitude);
    if (b % 3 == 0) values[values.size() - 1 - b % block] *= 300;
  }
  return values;
}

TEST(MxQuantiser, EveryRuleMatchesItsDefinitionElementByElement) {
  const ScaleRule rules[] = {ScaleRule::ocp_floor, ScaleRule::ceil, ScaleRule::even};
  for (const BlockScaledFormat* format : all_block_scaled_formats) {
    if (format->scale != ScaleKind::e8m0) continue;
    const std::vector<double> values = random_blocks(11, 200, format->block);
    for (const ScaleRule rule : rules) {
      const BlockScaledTensor tensor = quantize(values, *format, {.rule = rule, .e8m0_zero_is_zero = false});
      EXPECT_EQ(mismatches_against_rule(values, tensor, rule), 0) << format->name;
    }
  }
}

// Mutation check: quantised by one rule and checked against another, the checker must object,
// and only where the rules differ: floor and ceil differ exactly when amax's significand is above
// the element format's largest significand (1.75 for e4m3, 1.5 for e2m1).
TEST(MxQuantiser, FloorAndCeilDifferExactlyWhereTheSignificandExceedsTheElementsLargest) {
  const std::vector<double> values = random_blocks(12, 400, 32);
  const BlockScaledTensor ceil =
      quantize(values, mxfp8_e4m3, {.rule = ScaleRule::ceil, .e8m0_zero_is_zero = false});
  EXPECT_GT(mismatches_against_rule(values, ceil, ScaleRule::ocp_floor), 0);
  const BlockScaledTensor floor = quantize(values, mxfp8_e4m3, {});
  int differing = 0;
  for (std::size_t b = 0; b < values.size() / 32; ++b) {
    double amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(values[b * 32 + i]));
    int e = 0;
    const bool above = 2 * std::frexp(amax, &e) > 1.75;
    EXPECT_EQ(floor.block_scale(b) != ceil.block_scale(b), above) << "block " << b;
    differing += above ? 1 : 0;
  }
  EXPECT_GT(differing, 10);  // the draw reaches the class
  // The spec's example: amax 480 = 1.875 * 2^8 saturates to 448 under floor, is exact under ceil;
  // 496 = 1.9375 * 2^8 carries under even.
  const std::vector<double> block = {480.0, 1.0};
  EXPECT_EQ(quantize(block, mxfp8_e4m3, {}).value(0), 448.0);
  EXPECT_EQ(quantize(block, mxfp8_e4m3, {.rule = ScaleRule::ceil, .e8m0_zero_is_zero = false}).value(0),
            480.0);
  EXPECT_EQ(quantize(block, mxfp8_e4m3, {.rule = ScaleRule::even, .e8m0_zero_is_zero = false}).value(0),
            448.0);
  const std::vector<double> carrying = {496.0};
  EXPECT_EQ(
      quantize(carrying, mxfp8_e4m3, {.rule = ScaleRule::even, .e8m0_zero_is_zero = false}).block_scale(0),
      2.0);
}

TEST(MxQuantiser, NonFiniteBlocksGetTheNanScaleAndZeroBlocksTheLeastScale) {
  const std::vector<double> values = {1.0, INFINITY, 2.0, 3.0};
  const BlockScaledFormat two{"test_mx_block_2", &fp8_e4m3, 2, ScaleKind::e8m0};
  const BlockScaledTensor tensor = quantize(values, two);
  EXPECT_TRUE(std::isnan(tensor.value(0)));
  EXPECT_TRUE(std::isnan(tensor.value(1)));
  EXPECT_EQ(tensor.value(2), 2.0);
  EXPECT_EQ(tensor.value(3), 3.0);
  // A consumer that decodes 0x00 as zero never sees a non-zero block take it.
  const std::vector<double> tiny(32, std::ldexp(1.0, -130));
  const BlockScaledTensor tiny_block =
      quantize(tiny, mxfp8_e4m3, {.rule = ScaleRule::ocp_floor, .e8m0_zero_is_zero = true});
  EXPECT_EQ(tiny_block.scale_codes.front(), 1);
  EXPECT_EQ(tiny_block.value(0), std::ldexp(1.0, -130));
  const std::vector<double> zeros(32, 0.0);
  EXPECT_EQ(quantize(zeros, mxfp4).scale_codes.front(), 0);
  EXPECT_EQ(quantize(zeros, mxfp4).value(5), 0.0);
}

TEST(Nvfp4, ScalesAndElementsFollowTheTwoLevelRuleWithTheRoundedBlockScale) {
  const std::vector<double> values = random_blocks(13, 64, 16);
  const BlockScaledTensor tensor = quantize(values, nvfp4);
  double amax = 0;
  for (const double x : values) amax = std::max(amax, std::fabs(x));
  EXPECT_EQ(tensor.tensor_scale, static_cast<double>(static_cast<float>(amax / 2688.0)));
  int rounded_differs_from_unrounded = 0;
  for (std::size_t b = 0; b < 64; ++b) {
    double block_amax = 0;
    for (std::size_t i = 0; i < 16; ++i) block_amax = std::max(block_amax, std::fabs(values[b * 16 + i]));
    const double exact_scale = block_amax / (6 * tensor.tensor_scale);
    const double scale = std::min(448.0, nearest_by_search(exact_scale, fp8_e4m3));
    ASSERT_EQ(tensor.block_scale(b), scale * tensor.tensor_scale) << "block " << b;
    for (std::size_t i = 0; i < 16; ++i) {
      const double x = values[b * 16 + i];
      const double expected = nearest_by_search(x / (scale * tensor.tensor_scale), fp4_e2m1);
      EXPECT_EQ(tensor.value(b * 16 + i), expected * scale * tensor.tensor_scale) << b << ", " << i;
      const double with_unrounded = nearest_by_search(x / (exact_scale * tensor.tensor_scale), fp4_e2m1);
      rounded_differs_from_unrounded += expected != with_unrounded ? 1 : 0;
    }
  }
  EXPECT_GT(rounded_differs_from_unrounded, 0);  // dividing by the unrounded scale is a different encoder
  const std::vector<double> with_nan = {1.0, NAN};
  EXPECT_THROW((void)quantize(with_nan, nvfp4), InputError);
  const std::vector<double> beyond_fp32_scale = {1e42, 1.0};  // g = amax / 2688 overflows fp32
  EXPECT_THROW((void)quantize(beyond_fp32_scale, nvfp4), InputError);
  EXPECT_THROW((void)quantize_integer(beyond_fp32_scale, {}), InputError);
}

TEST(IntegerQuantiser, SymmetricAndAsymmetricCodesAreTheNearestWithTheNamedTieRule) {
  // amax 127 makes the int8 scale exactly 1, so the halves are ties.
  const std::vector<double> values = {-127.0, -0.5, 0.5, 1.5, 2.5, 0.75, 127.0};
  const IntegerGroup even = quantize_integer(values, {});
  const IntegerGroup away = quantize_integer(
      values, {.codes = IntegerCodes::int8, .symmetric = true, .rounding = IntegerRounding::nearest_away});
  EXPECT_EQ(even.scale, 1.0);
  EXPECT_EQ(even.codes, (std::vector<std::int32_t>{-127, 0, 0, 2, 2, 1, 127}));
  EXPECT_EQ(away.codes, (std::vector<std::int32_t>{-127, -1, 1, 2, 3, 1, 127}));
  const std::vector<double> random = random_blocks(14, 1, 64);
  const IntegerGroup int4 = quantize_integer(
      random, {.codes = IntegerCodes::int4, .symmetric = true, .rounding = IntegerRounding::nearest_even});
  double amax = 0;
  for (const double x : random) amax = std::max(amax, std::fabs(x));
  EXPECT_EQ(int4.scale, static_cast<double>(static_cast<float>(amax / 7)));
  for (std::size_t i = 0; i < random.size(); ++i) {
    const double q = random[i] / int4.scale;
    EXPECT_EQ(int4.codes[i], std::clamp(static_cast<std::int32_t>(std::nearbyint(q)), -8, 7)) << i;
  }
  // Asymmetric uint4: the range [-1, 2] over 15 steps, the zero point making 0 a code.
  const std::vector<double> range = {-1.0, 0.0, 0.3, 2.0};
  const IntegerGroup asym = quantize_integer(
      range, {.codes = IntegerCodes::uint4, .symmetric = false, .rounding = IntegerRounding::nearest_even});
  EXPECT_EQ(asym.scale, static_cast<double>(static_cast<float>(3.0 / 15)));
  EXPECT_EQ(asym.value(1), 0.0);
  for (std::size_t i = 0; i < range.size(); ++i) {
    EXPECT_GE(asym.codes[i], 0);
    EXPECT_LE(asym.codes[i], 15);
    EXPECT_LE(std::fabs(asym.value(i) - range[i]), asym.scale / 2 * (1 + 1e-12)) << i;
  }
  const std::vector<double> bad = {1.0, INFINITY};
  EXPECT_THROW((void)quantize_integer(bad, {}), InputError);
}

}  // namespace
}  // namespace sharpcheck
