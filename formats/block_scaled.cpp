#include "formats/block_scaled.hpp"

#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "core/mpfr_number.hpp"

namespace sharpcheck {
namespace {

constexpr int e8m0_bias = 127;
constexpr std::uint8_t e8m0_nan = 0xFF;
constexpr double nvfp4_tensor_divisor = 448.0 * 6.0;  // e4m3's largest scale times e2m1's largest value

// x / divisor, exact to within 2^-256 relative: enough that rounding it once to any format here, or
// to an integer, gives the rounding of the exact quotient (see the header).
void quotient(MpfrNumber& result, double x, double divisor) {
  MpfrNumber numerator(64);
  mpfr_set_d(numerator.get(), x, MPFR_RNDN);
  mpfr_div_d(result.get(), numerator.get(), divisor, MPFR_RNDN);
}

// RN of x / divisor into `format`, clamped to its largest magnitude (the MX and NVFP4 encoders
// saturate, e4m3 included, whose own overflow is NaN).
double saturating_quotient(double x, double divisor, const FloatFormat& format) {
  MpfrNumber q(320);
  quotient(q, x, divisor);
  if (mpfr_cmp_d(q.get(), format.max_finite) > 0) return format.max_finite;
  if (mpfr_cmp_d(q.get(), -format.max_finite) < 0) return -format.max_finite;
  return round_to_format(q.get(), format);
}

// The exponent e of an MX block's scale 2^e for a largest magnitude amax > 0 (finite).
int shared_exponent(double amax, const FloatFormat& element, ScaleRule rule) {
  const int exponent = std::ilogb(amax);  // exact: amax = m * 2^exponent, 1 <= m < 2
  switch (rule) {
    case ScaleRule::ocp_floor:
      return exponent - element.max_exponent;
    case ScaleRule::ceil: {
      const int floor = exponent - element.max_exponent;
      return amax <= std::ldexp(element.max_finite, floor) ? floor : floor + 1;
    }
    case ScaleRule::even: {
      const double significand = std::scalbn(amax, -exponent);
      const double carry_from = 2.0 - std::ldexp(1.0, -(element.fraction_bits + 1));
      return (significand >= carry_from ? exponent + 1 : exponent) - element.max_exponent;
    }
  }
  return exponent;
}

void quantize_mx_block(std::span<const double> block, const BlockScaledFormat& format,
                       const ScaleSettings& settings, BlockScaledTensor& tensor) {
  const ScaleRule rule = settings.rule;
  double amax = 0;
  bool non_finite = false;
  for (const double x : block) {
    non_finite = non_finite || !std::isfinite(x);
    amax = std::max(amax, std::fabs(x));
  }
  const FloatFormat& element = *format.element;
  if (non_finite) {  // OCP: a NaN scale makes the whole block NaN; the element codes are zeros
    tensor.scale_codes.push_back(e8m0_nan);
    tensor.codes.insert(tensor.codes.end(), block.size(), 0);
    return;
  }
  // Where a consumer decodes E8M0 0x00 as zero, a non-zero block never takes that code.
  const int least = settings.e8m0_zero_is_zero ? 1 - e8m0_bias : -e8m0_bias;
  const int exponent =
      amax == 0 ? -e8m0_bias : std::clamp(shared_exponent(amax, element, rule), least, e8m0_bias);
  tensor.scale_codes.push_back(static_cast<std::uint8_t>(exponent + e8m0_bias));
  for (const double x : block) {
    const double scaled = std::ldexp(x, -exponent);  // exact unless far below the element's range
    const double clamped = std::clamp(scaled, -element.max_finite, element.max_finite);
    tensor.codes.push_back(static_cast<std::uint8_t>(encode(round_to_format(clamped, element), element)));
  }
}

double nvfp4_tensor_scale(std::span<const double> values) {
  double amax = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      throw InputError(InputProblem::non_finite_value,
                       "nvfp4: value " + std::to_string(i) + " is not finite (NVFP4 has no NaN scale)");
    amax = std::max(amax, std::fabs(values[i]));
  }
  if (amax == 0) return 1.0;
  MpfrNumber q(320);
  quotient(q, amax, nvfp4_tensor_divisor);
  const double scale = round_to_format(q.get(), fp32);
  if (std::isinf(scale))
    throw InputError(InputProblem::out_of_range, "nvfp4: the tensor's largest magnitude " + hex_float(amax) +
                                                     " puts its fp32 scale amax / 2688 beyond fp32's range");
  return scale > 0 ? scale : std::ldexp(1.0, fp32.min_subnormal_exponent());
}

void quantize_nvfp4_block(std::span<const double> block, BlockScaledTensor& tensor) {
  double amax = 0;
  for (const double x : block) amax = std::max(amax, std::fabs(x));
  const double scale = saturating_quotient(amax, 6.0 * tensor.tensor_scale, fp8_e4m3);
  tensor.scale_codes.push_back(static_cast<std::uint8_t>(encode(scale, fp8_e4m3)));
  const double divisor = scale * tensor.tensor_scale;  // exact: a 4-bit times a 24-bit significand
  for (const double x : block) {
    const double element = divisor == 0 ? 0.0 : saturating_quotient(x, divisor, fp4_e2m1);
    tensor.codes.push_back(static_cast<std::uint8_t>(encode(element, fp4_e2m1)));
  }
}

}  // namespace

std::optional<const BlockScaledFormat*> find_block_scaled_format(std::string_view name) {
  for (const BlockScaledFormat* format : all_block_scaled_formats) {
    if (format->name == name) return format;
  }
  if (name == "mxfp8") return &mxfp8_e4m3;
  return std::nullopt;
}

double decode_e8m0(std::uint8_t code, bool zero_is_zero) {
  if (code == e8m0_nan) return std::numeric_limits<double>::quiet_NaN();
  if (code == 0 && zero_is_zero) return 0.0;
  return std::ldexp(1.0, static_cast<int>(code) - e8m0_bias);
}

double BlockScaledTensor::block_scale(std::size_t b) const {
  if (format->scale == ScaleKind::e8m0) return decode_e8m0(scale_codes[b], settings.e8m0_zero_is_zero);
  return decode(scale_codes[b], fp8_e4m3) * tensor_scale;
}

double BlockScaledTensor::value(std::size_t i) const {
  return decode(codes[i], *format->element) * block_scale(i / format->block);
}

std::vector<double> BlockScaledTensor::values() const {
  std::vector<double> result(codes.size());
  for (std::size_t i = 0; i < codes.size(); ++i) result[i] = value(i);
  return result;
}

BlockScaledTensor quantize(std::span<const double> values, const BlockScaledFormat& format,
                           const ScaleSettings& settings) {
  BlockScaledTensor tensor;
  tensor.format = &format;
  tensor.settings = settings;
  if (format.scale == ScaleKind::e4m3) tensor.tensor_scale = nvfp4_tensor_scale(values);
  for (std::size_t start = 0; start < values.size(); start += format.block) {
    const std::span<const double> block =
        values.subspan(start, std::min(format.block, values.size() - start));
    if (format.scale == ScaleKind::e8m0) {
      quantize_mx_block(block, format, settings, tensor);
    } else {
      quantize_nvfp4_block(block, tensor);
    }
  }
  return tensor;
}

std::int32_t lowest_code(IntegerCodes codes) {
  switch (codes) {
    case IntegerCodes::int8:
      return -128;
    case IntegerCodes::int4:
      return -8;
    default:
      return 0;
  }
}

std::int32_t highest_code(IntegerCodes codes) {
  switch (codes) {
    case IntegerCodes::int8:
      return 127;
    case IntegerCodes::uint8:
      return 255;
    case IntegerCodes::int4:
      return 7;
    case IntegerCodes::uint4:
      return 15;
  }
  return 0;
}

namespace {

// round(x / scale) by `rounding`, exactly, clamped to [lowest, highest] before converting.
std::int32_t integer_quotient(double x, double scale, IntegerRounding rounding, std::int32_t lowest,
                              std::int32_t highest) {
  MpfrNumber q(320);
  quotient(q, x, scale);
  if (rounding == IntegerRounding::nearest_even) {
    mpfr_rint(q.get(), q.get(), MPFR_RNDN);
  } else {
    mpfr_round(q.get(), q.get());
  }
  if (mpfr_cmp_si(q.get(), lowest) < 0) return lowest;
  if (mpfr_cmp_si(q.get(), highest) > 0) return highest;
  return static_cast<std::int32_t>(mpfr_get_si(q.get(), MPFR_RNDN));
}

// RN_fp32(numerator / denominator) with the numerator exact in MPFR; the least positive fp32 value
// when that rounds to zero, 1 when the numerator is zero (a scale must divide).
double fp32_scale(mpfr_ptr numerator, long denominator) {
  if (mpfr_zero_p(numerator)) return 1.0;
  MpfrNumber q(mpfr_get_prec(numerator) + 64);
  mpfr_div_si(q.get(), numerator, denominator, MPFR_RNDN);
  const double scale = round_to_format(q.get(), fp32);
  if (std::isinf(scale))
    throw InputError(InputProblem::out_of_range,
                     "integer quantisation: the group's range puts its fp32 scale beyond fp32's range");
  return scale > 0 ? scale : std::ldexp(1.0, fp32.min_subnormal_exponent());
}

}  // namespace

IntegerGroup quantize_integer(std::span<const double> values, const IntegerFormat& format) {
  const std::int32_t lowest = lowest_code(format.codes), highest = highest_code(format.codes);
  double low = 0, high = 0, amax = 0;  // the range always holds zero, so zero is a code
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      throw InputError(InputProblem::non_finite_value,
                       "integer quantisation: value " + std::to_string(i) + " is not finite");
    low = std::min(low, values[i]);
    high = std::max(high, values[i]);
    amax = std::max(amax, std::fabs(values[i]));
  }
  IntegerGroup group;
  // The difference of two doubles is exact in 2,200 bits (their exponents differ by at most 2,098).
  MpfrNumber span(2200);
  if (format.symmetric) {
    mpfr_set_d(span.get(), amax, MPFR_RNDN);
    group.scale = fp32_scale(span.get(), highest);
  } else {
    mpfr_set_d(span.get(), high, MPFR_RNDN);
    mpfr_sub_d(span.get(), span.get(), low, MPFR_RNDN);
    group.scale = fp32_scale(span.get(), static_cast<long>(highest) - lowest);
    group.zero_point = lowest - integer_quotient(low, group.scale, format.rounding, lowest - highest, 0);
    group.zero_point = std::clamp(group.zero_point, lowest, highest);
  }
  group.codes.reserve(values.size());
  for (const double x : values) {
    const std::int32_t offset = integer_quotient(x, group.scale, format.rounding, lowest - group.zero_point,
                                                 highest - group.zero_point);
    group.codes.push_back(offset + group.zero_point);
  }
  return group;
}

}  // namespace sharpcheck
