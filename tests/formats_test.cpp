// The formats against MPFR's own IEEE emulation (mpfr_subnormalize at the format's precision and
// exponent range), exhaustively for the 8- and 16-bit formats, and against the hardware's double
// to float conversion for fp32.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/random.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck {
namespace {

// MPFR's rounding of a double to the format: precision p, exponent range [emin, emax] in MPFR's
// convention (significand in [1/2, 1)), subnormals by mpfr_subnormalize. Overflow beyond the
// format's largest finite value (e4m3 reserves its top code for NaN) is mapped as the format says.
double mpfr_native_round(double x, const FloatFormat& format) {
  const mpfr_exp_t old_min = mpfr_get_emin();
  const mpfr_exp_t old_max = mpfr_get_emax();
  mpfr_set_emin(format.min_subnormal_exponent() + 1);
  mpfr_set_emax(format.max_exponent + 1);
  mpfr_t y;
  mpfr_init2(y, format.precision());
  int ternary = mpfr_set_d(y, x, MPFR_RNDN);
  ternary = mpfr_subnormalize(y, ternary, MPFR_RNDN);
  (void)ternary;
  double result = mpfr_get_d(y, MPFR_RNDN);
  mpfr_clear(y);
  mpfr_set_emin(old_min);
  mpfr_set_emax(old_max);
  if (std::fabs(result) > format.max_finite && !std::isnan(result)) {
    if (format.overflow == OverflowBehaviour::to_nan) return std::numeric_limits<double>::quiet_NaN();
    return std::copysign(std::numeric_limits<double>::infinity(), result);
  }
  if (std::isinf(result) && !format.has_infinity()) return std::numeric_limits<double>::quiet_NaN();
  return result;
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// Rounds through an MPFR value of `bits` precision equal to x + offset * 2^(exponent of x - shift).
double round_via_mpfr(double x, int direction, int shift, const FloatFormat& format) {
  mpfr_t value;
  mpfr_init2(value, 200);
  mpfr_set_d(value, x, MPFR_RNDN);
  if (direction != 0 && x != 0.0) {
    mpfr_t tiny;
    mpfr_init2(tiny, 200);
    mpfr_set_si_2exp(tiny, direction, mpfr_get_exp(value) - shift, MPFR_RNDN);
    mpfr_add(value, value, tiny, MPFR_RNDN);
    mpfr_clear(tiny);
  }
  const double result = round_to_format(value, format);
  mpfr_clear(value);
  return result;
}

class SmallFormat : public ::testing::TestWithParam<const FloatFormat*> {};
class AnyFormat : public ::testing::TestWithParam<const FloatFormat*> {};

// Every bit pattern: decode/encode round trip, the value rounds to itself, and the midpoint to
// the next value rounds to the even neighbour, while points just off the midpoint (by one double
// ulp, and by 2^-150 relative through MPFR, closer than any double) round to the nearer one.
TEST_P(SmallFormat, EveryPatternAndEveryMidpointRoundsAsMpfrDoes) {
  const FloatFormat& format = *GetParam();
  const std::uint64_t patterns = std::uint64_t{1} << format.total_bits();
  std::uint64_t checked = 0;
  for (std::uint64_t bits = 0; bits < patterns; ++bits) {
    const double value = decode(bits, format);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(mpfr_native_round(value, format)));
      continue;
    }
    ASSERT_EQ(encode(value, format), bits) << "pattern " << bits << " value " << hex_float(value);
    ASSERT_TRUE(same_value(round_to_format(value, format), value));
    ASSERT_TRUE(same_value(mpfr_native_round(value, format), value)) << hex_float(value);
    const double next = next_up(value, format);
    if (!std::isfinite(value) || !std::isfinite(next) || std::signbit(value)) continue;
    const double midpoint = value + (next - value) / 2;  // exact: at most precision + 1 bits
    const double even = (encode(value, format) & 1) == 0 ? value : next;
    for (const double x :
         {midpoint, std::nextafter(midpoint, -INFINITY), std::nextafter(midpoint, INFINITY)}) {
      for (const double signed_x : {x, -x}) {
        const double expected = mpfr_native_round(signed_x, format);
        ASSERT_TRUE(same_value(round_to_format(signed_x, format), expected))
            << format.name << ": " << hex_float(signed_x) << " gave "
            << hex_float(round_to_format(signed_x, format)) << ", MPFR " << hex_float(expected);
      }
    }
    ASSERT_TRUE(same_value(round_to_format(midpoint, format), even)) << hex_float(midpoint);
    if (midpoint > 0) {
      EXPECT_TRUE(same_value(round_via_mpfr(midpoint, +1, 150, format), next)) << hex_float(midpoint);
      EXPECT_TRUE(same_value(round_via_mpfr(midpoint, -1, 150, format), value)) << hex_float(midpoint);
      EXPECT_TRUE(same_value(round_via_mpfr(midpoint, 0, 0, format), even)) << hex_float(midpoint);
    }
    ++checked;
  }
  EXPECT_GT(checked, patterns / 4);
}

TEST_P(AnyFormat, RandomDoublesOverTheWholeRangeRoundAsMpfrDoes) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(7);
  for (int i = 0; i < 200000; ++i) {
    // Exponents from far below the smallest subnormal to beyond the largest value.
    const int exponent =
        format.min_subnormal_exponent() - 4 +
        static_cast<int>(random.below(format.max_exponent - format.min_subnormal_exponent() + 8));
    const double x = std::ldexp(1.0 + random.uniform(), exponent) * (random.below(2) != 0 ? -1.0 : 1.0);
    ASSERT_TRUE(same_value(round_to_format(x, format), mpfr_native_round(x, format))) << hex_float(x);
    mpfr_t value;
    mpfr_init2(value, 53);
    mpfr_set_d(value, x, MPFR_RNDN);
    ASSERT_TRUE(same_value(round_to_format(value, format), mpfr_native_round(x, format))) << hex_float(x);
    mpfr_clear(value);
  }
}

const auto format_name = [](const auto& info) { return std::string(info.param->name); };
INSTANTIATE_TEST_SUITE_P(Formats, SmallFormat, ::testing::Values(&tf32, &bf16, &fp16, &fp8_e4m3, &fp8_e5m2),
                         format_name);
INSTANTIATE_TEST_SUITE_P(Formats, AnyFormat,
                         ::testing::Values(&fp32, &tf32, &bf16, &fp16, &fp8_e4m3, &fp8_e5m2), format_name);

// TF32 is fp32 with the 13 low fraction bits zero: every one of its patterns, shifted into an fp32
// pattern, is the same value as the hardware reads it, and rounding to tf32 is the identity on it.
TEST(Tf32, EveryPatternIsTheFp32PatternWithThirteenLowBitsZero) {
  for (std::uint32_t bits = 0; bits < (1U << 19); ++bits) {
    const auto hardware = static_cast<double>(std::bit_cast<float>(bits << 13));
    const double ours = decode(bits, tf32);
    ASSERT_TRUE(same_value(ours, hardware) || (std::isnan(ours) && std::isnan(hardware))) << bits;
  }
  // Rounding an fp32 value to tf32, against the integer round-to-nearest-even that hardware
  // conversions use (add 0xFFF plus the kept lowest bit, clear 13 bits; overflow carries into
  // infinity): every subnormal-boundary pattern and a million random finite patterns.
  const auto by_bits = [](std::uint32_t bits) {
    const std::uint32_t rounded = (bits + 0xFFFU + ((bits >> 13) & 1U)) & ~0x1FFFU;
    return static_cast<double>(std::bit_cast<float>(rounded));
  };
  DeterministicRandom random(20241203);
  for (int i = 0; i < 1'000'000; ++i) {
    auto bits = static_cast<std::uint32_t>(random.next_u64());
    if (i < 1 << 14)
      bits = static_cast<std::uint32_t>(i) | ((i & 1) ? 0x80000000U : 0U);  // subnormals and zero
    const auto value = static_cast<double>(std::bit_cast<float>(bits));
    if (!std::isfinite(value)) continue;
    ASSERT_TRUE(same_value(round_to_format(value, tf32), by_bits(bits))) << std::hex << bits;
  }
  EXPECT_EQ(encode(1.0, tf32), 0x1FC00u);
  EXPECT_EQ(decode(0x3FBFF, tf32), tf32.max_finite);
  EXPECT_EQ(find_float_format("tensorfloat32").value(), &tf32);
}

TEST(Fp32, RoundingMatchesTheHardwareConversionOfDoubleToFloat) {
  DeterministicRandom random(11);
  for (int i = 0; i < 1000000; ++i) {
    const double x = std::bit_cast<double>(random.next_u64());
    if (std::isnan(x)) continue;
    const double expected = static_cast<double>(static_cast<float>(x));
    ASSERT_TRUE(same_value(round_to_format(x, fp32), expected)) << hex_float(x);
  }
}

TEST(Fp64, RoundingIsTheIdentityOnDoublesAndRoundsMpfrValuesOnce) {
  DeterministicRandom random(13);
  for (int i = 0; i < 100000; ++i) {
    const double x = std::bit_cast<double>(random.next_u64());
    if (std::isnan(x)) continue;
    ASSERT_TRUE(same_value(round_to_format(x, fp64), x));
    if (!std::isfinite(x) || x == 0.0) continue;
    const double next = std::nextafter(x, INFINITY);
    if (!std::isfinite(next)) continue;
    // x + half an ulp, plus or minus 2^-150 relative: MPFR values no double can hold.
    mpfr_t value;
    mpfr_init2(value, 300);
    mpfr_set_d(value, x, MPFR_RNDN);
    mpfr_add_d(value, value, next - x, MPFR_RNDN);  // then back by half of that step
    mpfr_t half_step;
    mpfr_init2(half_step, 300);
    mpfr_set_d(half_step, next - x, MPFR_RNDN);
    mpfr_div_2ui(half_step, half_step, 1, MPFR_RNDN);  // exact, even below double's subnormals
    mpfr_sub(value, value, half_step, MPFR_RNDN);
    mpfr_clear(half_step);
    mpfr_t tiny;
    mpfr_init2(tiny, 300);
    mpfr_set_si_2exp(tiny, 1, mpfr_get_exp(value) - 150, MPFR_RNDN);
    mpfr_add(value, value, tiny, MPFR_RNDN);
    ASSERT_TRUE(same_value(round_to_format(value, fp64), next)) << hex_float(x);
    mpfr_sub(value, value, tiny, MPFR_RNDN);
    mpfr_sub(value, value, tiny, MPFR_RNDN);
    ASSERT_TRUE(same_value(round_to_format(value, fp64), x)) << hex_float(x);
    mpfr_clear(tiny);
    mpfr_clear(value);
  }
}

TEST(SpecialValues, OverflowFollowsEachFormatsStatedBehaviour) {
  EXPECT_EQ(round_to_format(65519.0, fp16), 65504.0);
  EXPECT_EQ(round_to_format(65520.0, fp16), INFINITY);  // the tie goes to the even "next", infinity
  EXPECT_EQ(round_to_format(-1e6, fp16), -INFINITY);
  EXPECT_EQ(round_to_format(464.0, fp8_e4m3), 448.0);  // tie: 448 has the even significand
  EXPECT_TRUE(std::isnan(round_to_format(464.5, fp8_e4m3)));
  EXPECT_TRUE(std::isnan(round_to_format(INFINITY, fp8_e4m3)));
  EXPECT_EQ(round_to_format(61439.0, fp8_e5m2), 57344.0);
  EXPECT_EQ(round_to_format(61440.0, fp8_e5m2), INFINITY);
  EXPECT_EQ(round_to_format(3.39e38, bf16), 3.3895313892515355e38);
  EXPECT_EQ(round_to_format(3.4e38, bf16), INFINITY);  // above the midpoint between max and 2^128
  EXPECT_EQ(round_to_format(3.4e38, fp32), static_cast<double>(3.4e38F));
  EXPECT_TRUE(std::isnan(round_to_format(NAN, bf16)));
  EXPECT_TRUE(std::signbit(round_to_format(-1e-30, fp16)));  // underflow keeps the sign
  EXPECT_EQ(round_to_format(-1e-30, fp16), 0.0);
}

TEST(SpecialValues, FormatsHaveTheirDocumentedNumberOfFiniteValues) {
  const auto count_finite = [](const FloatFormat& format) {
    int finite = 0;
    for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << format.total_bits()); ++bits) {
      finite += std::isfinite(decode(bits, format)) ? 1 : 0;
    }
    return finite;
  };
  EXPECT_EQ(count_finite(fp8_e4m3), 254);  // only S.1111.111 is NaN
  EXPECT_EQ(count_finite(fp8_e5m2), 248);  // 2 infinities and 6 NaNs
  EXPECT_EQ(count_finite(fp16), 65536 - 2048);
  EXPECT_EQ(count_finite(tf32), (1 << 19) - 2048);  // exponent all ones: 2 x 1024 infinities and NaNs
  EXPECT_EQ(decode(0x7E, fp8_e4m3), 448.0);
  EXPECT_EQ(decode(0x01, fp8_e4m3), std::ldexp(1.0, -9));
  EXPECT_EQ(decode(0x7B, fp8_e5m2), 57344.0);
  EXPECT_EQ(decode(0x7F7F, bf16), bf16.max_finite);
  EXPECT_EQ(decode(0x7BFF, fp16), fp16.max_finite);
}

TEST(UlpDistance, CountsFormatValuesAndTreatsSignedZerosAsEqual) {
  for (const FloatFormat* format : all_float_formats) {
    EXPECT_EQ(ulp_distance(0.0, -0.0, *format), 0u);
    EXPECT_EQ(ulp_distance(1.0, next_up(1.0, *format), *format), 1u);
    EXPECT_EQ(ulp_distance(next_down(0.0, *format), next_up(0.0, *format), *format), 2u);
    EXPECT_EQ(ulp_distance(1.0, 2.0, *format), std::uint64_t{1} << format->fraction_bits);
    EXPECT_EQ(ulp_distance(-1.0, 1.0, *format), 2 * ulp_distance(0.0, 1.0, *format).value());
    EXPECT_FALSE(ulp_distance(NAN, 1.0, *format).has_value());
    EXPECT_EQ(ulp_distance(NAN, NAN, *format), 0u);
    EXPECT_EQ(next_down(next_up(0.5, *format), *format), 0.5);
    if (format->has_infinity()) {
      EXPECT_EQ(ulp_distance(format->max_finite, INFINITY, *format), 1u);
    }
  }
  EXPECT_TRUE(std::isnan(next_up(448.0, fp8_e4m3)));
  EXPECT_EQ(next_up(0.0, fp16), std::ldexp(1.0, -24));
}

TEST(Encoding, RejectsValuesTheFormatCannotHold) {
  EXPECT_THROW((void)encode(1.0 + 0x1p-20, bf16), std::invalid_argument);
  EXPECT_THROW((void)encode(INFINITY, fp8_e4m3), std::invalid_argument);
  EXPECT_EQ(encode(-0.0, fp16), 0x8000u);
  EXPECT_EQ(encode(1.0, fp32), 0x3F800000u);
  EXPECT_EQ(encode(1.0, bf16), 0x3F80u);
}

TEST(Lookup, FindsFormatsByNameAndAlias) {
  EXPECT_EQ(find_float_format("bf16").value(), &bf16);
  EXPECT_EQ(find_float_format("e4m3").value(), &fp8_e4m3);
  EXPECT_FALSE(find_float_format("fp4").has_value());
}

}  // namespace
}  // namespace sharpcheck

namespace sharpcheck {
namespace {

// The quantized grids: round to the nearest multiple of the scale, ties to the even code, and
// saturate (infinities too) at the ends, exactly as an independent integer computation does.
TEST(QuantizedGrids, RoundToTheNearestCodeTiesToEvenAndSaturate) {
  DeterministicRandom random(19);
  for (int i = 0; i < 100000; ++i) {
    const double x = random.uniform(-0.1, 1.2);
    const double scaled = x * 256;         // exact
    double code = std::nearbyint(scaled);  // the default environment rounds ties to even
    code = std::clamp(code, -255.0, 255.0);
    ASSERT_EQ(round_to_format(x, q8_probabilities), code / 256) << hex_float(x);
  }
  EXPECT_EQ(round_to_format(0.5 / 256, q8_probabilities), 0.0);        // tie to the even code 0
  EXPECT_EQ(round_to_format(1.5 / 256, q8_probabilities), 2.0 / 256);  // tie to the even code 2
  EXPECT_EQ(round_to_format(1.0, q8_probabilities), 255.0 / 256);      // p = 1 saturates to code 255
  EXPECT_EQ(round_to_format(INFINITY, q8_logits), 127.0 / 16);
  EXPECT_EQ(round_to_format(-INFINITY, q8_logits), -127.0 / 16);
  EXPECT_EQ(round_to_format(88.7, q8_logits), 127.0 / 16);
  EXPECT_EQ(round_to_format(0.03125, q8_logits), 0.0);  // half of 1/16: tie to the even code 0
  EXPECT_EQ(ulp_distance(3.0 / 256, 7.0 / 256, q8_probabilities), 4u);
  EXPECT_FALSE(is_representable(8.0, q8_logits));
}

}  // namespace
}  // namespace sharpcheck
