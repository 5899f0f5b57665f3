#include "formats/float_format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace sharpcheck {
namespace {

constexpr double quiet_nan = std::numeric_limits<double>::quiet_NaN();
constexpr double infinity = std::numeric_limits<double>::infinity();

double overflow_value(bool negative, const FloatFormat& format) {
  if (format.overflow == OverflowBehaviour::to_nan) return quiet_nan;
  if (format.overflow == OverflowBehaviour::saturate)
    return negative ? -format.max_finite : format.max_finite;
  return negative ? -infinity : infinity;
}

// Rounds |v| < 2^53 to the nearest integer, ties to even, using only exact operations
// (trunc and the subtraction below are exact), so the FP environment's mode does not matter.
double round_half_even(double v) {
  const double truncated = std::trunc(v);
  const double fraction = std::fabs(v - truncated);
  const double step = std::copysign(1.0, v);
  if (fraction > 0.5) return truncated + step;
  if (fraction == 0.5 && std::fmod(truncated, 2.0) != 0.0) return truncated + step;
  return truncated;
}

// Scale exponent q of the rounding grid for a value whose frexp exponent is e: the grid
// spacing is 2^(e - precision) for normal values, never finer than the smallest subnormal.
long grid_exponent(long frexp_exponent, const FloatFormat& format) {
  return std::max<long>(frexp_exponent - format.precision(), format.min_subnormal_exponent());
}

double finish(double rounded, const FloatFormat& format) {
  if (std::fabs(rounded) > format.max_finite) return overflow_value(std::signbit(rounded), format);
  return rounded;
}

std::uint64_t sign_mask(const FloatFormat& format) { return std::uint64_t{1} << (format.total_bits() - 1); }
std::uint64_t exponent_field_max(const FloatFormat& format) {
  return (std::uint64_t{1} << format.exponent_bits) - 1;
}
int exponent_bias(const FloatFormat& format) { return 1 - format.min_normal_exponent; }

std::uint64_t nan_pattern(const FloatFormat& format) {
  if (format.overflow == OverflowBehaviour::to_nan) {  // e4m3: S.1111.111 is the only NaN
    return (exponent_field_max(format) << format.fraction_bits) |
           ((std::uint64_t{1} << format.fraction_bits) - 1);
  }
  return (exponent_field_max(format) << format.fraction_bits) |
         (std::uint64_t{1} << (format.fraction_bits - 1));
}

}  // namespace

double FloatFormat::unit_roundoff() const { return std::ldexp(1.0, -precision()); }

std::optional<const FloatFormat*> find_float_format(std::string_view name) {
  for (const FloatFormat* format : all_float_formats) {
    if (format->name == name) return format;
  }
  if (name == "e4m3" || name == "fp8") return &fp8_e4m3;
  if (name == "e5m2") return &fp8_e5m2;
  if (name == "float32" || name == "float") return &fp32;
  if (name == "float64" || name == "double") return &fp64;
  if (name == "float16" || name == "half") return &fp16;
  if (name == "bfloat16") return &bf16;
  if (name == "tensorfloat32") return &tf32;
  if (name == "q8_probabilities" || name == "uint8" || name == "int8") return &q8_probabilities;
  if (name == "q8_logits") return &q8_logits;
  return std::nullopt;
}

double round_to_format(double x, const FloatFormat& format) {
  if (std::isnan(x)) return quiet_nan;
  if (std::isinf(x)) {
    if (format.overflow == OverflowBehaviour::saturate) return overflow_value(x < 0, format);
    return format.has_infinity() ? x : quiet_nan;
  }
  if (x == 0.0) return x;
  int exponent = 0;
  std::frexp(x, &exponent);
  const long q = grid_exponent(exponent, format);
  // x * 2^-q is exact: it only changes the exponent and stays in double's normal range.
  const double rounded =
      std::ldexp(round_half_even(std::ldexp(x, static_cast<int>(-q))), static_cast<int>(q));
  return finish(rounded, format);
}

double round_to_format(mpfr_srcptr x, const FloatFormat& format) {
  if (mpfr_nan_p(x)) return quiet_nan;
  const bool negative = mpfr_signbit(x) != 0;
  if (mpfr_inf_p(x)) {
    if (format.overflow == OverflowBehaviour::saturate) return overflow_value(negative, format);
    return format.has_infinity() ? (negative ? -infinity : infinity) : quiet_nan;
  }
  if (mpfr_zero_p(x)) return negative ? -0.0 : 0.0;
  const mpfr_exp_t exponent = mpfr_get_exp(x);  // x = m * 2^exponent with 1/2 <= |m| < 1
  if (exponent >= format.max_exponent + 2) return overflow_value(negative, format);
  // Below half the smallest subnormal: rounds to a signed zero.
  if (exponent <= format.min_subnormal_exponent() - 1) return negative ? -0.0 : 0.0;
  const long q = grid_exponent(exponent, format);
  // A per-thread scratch number: rounding is on every hot path of the reference, and a fresh
  // mpfr_init2/mpfr_clear per call costs more than the rounding itself.
  thread_local struct Scratch {
    Scratch() { mpfr_init2(value, 64); }
    ~Scratch() { mpfr_clear(value); }
    mpfr_t value;
  } scratch;
  const mpfr_prec_t needed = std::max<mpfr_prec_t>(mpfr_get_prec(x), 64);
  if (mpfr_get_prec(scratch.value) != needed) mpfr_set_prec(scratch.value, needed);
  mpfr_mul_2si(scratch.value, x, -q, MPFR_RNDN);  // exact: a power-of-two scaling
  // With enough precision to hold the integer, mpfr_rint in MPFR_RNDN rounds ties to even.
  mpfr_rint(scratch.value, scratch.value, MPFR_RNDN);
  const double integer = mpfr_get_d(scratch.value, MPFR_RNDN);  // exact: |integer| <= 2^precision <= 2^53
  double rounded = std::ldexp(integer, static_cast<int>(q));
  if (rounded == 0.0) rounded = negative ? -0.0 : 0.0;
  return finish(rounded, format);
}

bool is_representable(double x, const FloatFormat& format) {
  if (std::isnan(x)) return format.overflow != OverflowBehaviour::saturate;
  if (std::isinf(x)) return format.has_infinity();
  if (std::fabs(x) > format.max_finite) return false;
  return round_to_format(x, format) == x;
}

std::uint64_t encode(double x, const FloatFormat& format) {
  if (std::isnan(x) && format.overflow == OverflowBehaviour::saturate)
    throw std::invalid_argument("encode: " + std::string(format.name) + " has no NaN");
  if (std::isnan(x)) return nan_pattern(format);
  if (!is_representable(x, format)) {
    throw std::invalid_argument("encode: " + hex_float(x) + " is not a value of " + std::string(format.name));
  }
  const std::uint64_t sign = std::signbit(x) ? sign_mask(format) : 0;
  const double magnitude = std::fabs(x);
  if (std::isinf(x)) return sign | (exponent_field_max(format) << format.fraction_bits);
  if (magnitude == 0.0) return sign;
  int exponent = 0;
  std::frexp(magnitude, &exponent);
  const int unbiased = exponent - 1;
  if (unbiased < format.min_normal_exponent) {  // subnormal: fraction counts smallest subnormals
    return sign | static_cast<std::uint64_t>(std::ldexp(magnitude, -format.min_subnormal_exponent()));
  }
  const int biased_exponent = unbiased + exponent_bias(format);  // in [1, 2^exponent_bits - 1]
  const auto biased = static_cast<std::uint64_t>(biased_exponent);
  const auto fraction = static_cast<std::uint64_t>(std::ldexp(magnitude, format.fraction_bits - unbiased)) -
                        (std::uint64_t{1} << format.fraction_bits);
  return sign | (biased << format.fraction_bits) | fraction;
}

double decode(std::uint64_t bits, const FloatFormat& format) {
  const bool negative = (bits & sign_mask(format)) != 0;
  const std::uint64_t fraction_mask = (std::uint64_t{1} << format.fraction_bits) - 1;
  const std::uint64_t fraction = bits & fraction_mask;
  const std::uint64_t biased = (bits >> format.fraction_bits) & exponent_field_max(format);
  if (biased == exponent_field_max(format)) {
    if (format.has_infinity()) {
      if (fraction != 0) return quiet_nan;
      return negative ? -infinity : infinity;
    }
    // e4m3: only S.1111.111 is NaN; a saturating format has no NaN code.
    if (fraction == fraction_mask && format.overflow == OverflowBehaviour::to_nan) return quiet_nan;
  }
  double magnitude = 0.0;
  if (biased == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction), format.min_subnormal_exponent());
  } else {
    const auto significand = static_cast<double>(fraction | (std::uint64_t{1} << format.fraction_bits));
    magnitude =
        std::ldexp(significand, static_cast<int>(biased) - exponent_bias(format) - format.fraction_bits);
  }
  return negative ? -magnitude : magnitude;
}

namespace {
// Signed ordinal: +0 and -0 are both 0; each step is one format value.
std::int64_t ordinal(double x, const FloatFormat& format) {
  const std::uint64_t bits = encode(x, format);
  const auto magnitude = static_cast<std::int64_t>(bits & ~sign_mask(format));
  return (bits & sign_mask(format)) != 0 ? -magnitude : magnitude;
}
double from_ordinal(std::int64_t ord, const FloatFormat& format) {
  if (ord >= 0) return decode(static_cast<std::uint64_t>(ord), format);
  return decode(sign_mask(format) | static_cast<std::uint64_t>(-ord), format);
}
}  // namespace

double next_up(double x, const FloatFormat& format) {
  if (std::isnan(x) || x == infinity) return x;
  if (x == 0.0) return from_ordinal(1, format);
  return from_ordinal(ordinal(x, format) + 1, format);
}

double next_down(double x, const FloatFormat& format) {
  if (std::isnan(x) || x == -infinity) return x;
  if (x == 0.0) return from_ordinal(-1, format);
  return from_ordinal(ordinal(x, format) - 1, format);
}

std::optional<std::uint64_t> ulp_distance(double a, double b, const FloatFormat& format) {
  if (std::isnan(a) || std::isnan(b)) {
    if (std::isnan(a) && std::isnan(b)) return 0;
    return std::nullopt;
  }
  const std::int64_t difference = ordinal(a, format) - ordinal(b, format);
  return static_cast<std::uint64_t>(difference < 0 ? -difference : difference);
}

std::string hex_float(double x) {
  std::array<char, 64> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%a", x);
  return buffer.data();
}

}  // namespace sharpcheck
