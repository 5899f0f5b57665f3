// The fp32 softmax cores, vectorised with Highway and compiled once per SIMD target; the best
// target the CPU supports is chosen at run time (HWY_DYNAMIC_DISPATCH). Highway's Exp has a
// documented maximum error of 1 ulp over float's range; ties to the tolerance table.
//
// A negative scale is handled by negating the logits (exact) and using |scale|, so every core
// shifts by a maximum.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softmax_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
//
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "formats/storage.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace sharpcheck::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using FloatTag = hn::ScalableTag<float>;
using FloatVector = hn::Vec<FloatTag>;
constexpr std::size_t max_lanes = HWY_MAX_BYTES / sizeof(float);
constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// Calls body(vector_of_signed_logits, index, lanes_valid) over the row; the tail is padded with
// -inf, which every core treats as a masked entry (exp gives 0, max ignores it).
template <typename Body>
HWY_INLINE void for_each_vector(const float* logits, std::size_t n, float sign, Body&& body) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const FloatVector signs = hn::Set(tag, sign);
  const FloatVector masked = hn::Set(tag, negative_infinity);
  // A -inf logit is a masked entry whatever the sign of the temperature: it stays -inf.
  const auto signed_logits = [&](FloatVector x) { return hn::IfThenElse(hn::Eq(x, masked), masked, hn::Mul(x, signs)); };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) body(signed_logits(hn::LoadU(tag, logits + i)), i, lanes);
  if (i < n) {
    HWY_ALIGN float padded[max_lanes];
    std::fill(padded, padded + lanes, negative_infinity);
    std::copy(logits + i, logits + n, padded);
    body(signed_logits(hn::Load(tag, padded)), i, n - i);
  }
}

HWY_INLINE void store_partial(FloatVector value, float* out, std::size_t lanes_valid) {
  const FloatTag tag;
  if (lanes_valid == hn::Lanes(tag)) {
    hn::StoreU(value, tag, out);
    return;
  }
  HWY_ALIGN float padded[max_lanes];
  hn::Store(value, tag, padded);
  std::copy(padded, padded + lanes_valid, out);
}

// Four accumulators in flight, so the loop is not bound by the latency of one max or add chain.
HWY_INLINE float row_max(const float* logits, std::size_t n, float sign) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  FloatVector best[4] = {hn::Set(tag, negative_infinity), hn::Set(tag, negative_infinity),
                         hn::Set(tag, negative_infinity), hn::Set(tag, negative_infinity)};
  std::size_t i = 0;
  if (sign > 0) {  // the common case, without the masked-entry select
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      for (int a = 0; a < 4; ++a) best[a] = hn::Max(best[a], hn::LoadU(tag, logits + i + a * lanes));
    }
  }
  for_each_vector(logits + i, n - i, sign, [&](FloatVector x, std::size_t, std::size_t) { best[0] = hn::Max(best[0], x); });
  const FloatVector all = hn::Max(hn::Max(best[0], best[1]), hn::Max(best[2], best[3]));
  return hn::GetLane(hn::MaxOfLanes(tag, all));
}

// out = exp((sign * e - shift) * magnitude); returns their sum (per-lane sums, then lanes).
HWY_INLINE float exp_and_sum(const float* logits, float* out, std::size_t n, float sign, float shift,
                             float magnitude) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const FloatVector shifts = hn::Set(tag, shift);
  const FloatVector scales = hn::Set(tag, magnitude);
  FloatVector sum[4] = {hn::Zero(tag), hn::Zero(tag), hn::Zero(tag), hn::Zero(tag)};
  std::size_t i = 0;
  if (sign > 0) {
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      for (int a = 0; a < 4; ++a) {
        const FloatVector w = hn::Exp(tag, hn::Mul(hn::Sub(hn::LoadU(tag, logits + i + a * lanes), shifts), scales));
        sum[a] = hn::Add(sum[a], w);
        hn::StoreU(w, tag, out + i + a * lanes);
      }
    }
  }
  for_each_vector(logits + i, n - i, sign, [&](FloatVector x, std::size_t j, std::size_t valid) {
    const FloatVector w = hn::Exp(tag, hn::Mul(hn::Sub(x, shifts), scales));
    sum[0] = hn::Add(sum[0], w);
    store_partial(w, out + i + j, valid);
  });
  const FloatVector all = hn::Add(hn::Add(sum[0], sum[1]), hn::Add(sum[2], sum[3]));
  return hn::GetLane(hn::SumOfLanes(tag, all));
}

HWY_INLINE void multiply_row(float* out, std::size_t n, float factor) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const FloatVector factors = hn::Set(tag, factor);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(tag, out + i), factors), tag, out + i);
  for (; i < n; ++i) out[i] *= factor;
}

void Safe3(const float* logits, float* out, std::size_t n, float scale) {
  const float sign = scale < 0 ? -1.0F : 1.0F;
  const float magnitude = std::fabs(scale);
  const float shift = row_max(logits, n, sign);
  const float sum = exp_and_sum(logits, out, n, sign, shift, magnitude);
  multiply_row(out, n, 1.0F / sum);
}

void Naive(const float* logits, float* out, std::size_t n, float scale) {
  const FloatTag tag;
  const FloatVector scales = hn::Set(tag, scale);
  // exp overflows past ~88.72 as std::exp does (Highway's Exp is only valid up to 104).
  const FloatVector overflow = hn::Set(tag, 88.72283935546875F);
  const FloatVector infinity = hn::Set(tag, std::numeric_limits<float>::infinity());
  FloatVector sum = hn::Zero(tag);
  for_each_vector(logits, n, 1.0F, [&](FloatVector x, std::size_t i, std::size_t valid) {
    const FloatVector argument = hn::Mul(x, scales);
    const FloatVector w = hn::IfThenElse(hn::Gt(argument, overflow), infinity, hn::Exp(tag, argument));
    sum = hn::Add(sum, w);
    store_partial(w, out + i, valid);
  });
  multiply_row(out, n, 1.0F / hn::GetLane(hn::SumOfLanes(tag, sum)));
}

void Online2(const float* logits, float* out, std::size_t n, float scale) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const float sign = scale < 0 ? -1.0F : 1.0F;
  const FloatVector scales = hn::Set(tag, std::fabs(scale));
  FloatVector running_max = hn::Set(tag, negative_infinity);
  FloatVector running_sum = hn::Zero(tag);
  for_each_vector(logits, n, sign, [&](FloatVector x, std::size_t, std::size_t) {
    const FloatVector new_max = hn::Max(running_max, x);
    // Rescale only when some lane's maximum grew: after the first few vectors of a row the
    // maximum rarely moves, so this costs one exp per element, not two.
    if (!hn::AllFalse(tag, hn::Gt(x, running_max))) {
      running_sum = hn::Mul(running_sum, hn::Exp(tag, hn::Mul(hn::Sub(running_max, new_max), scales)));
      running_max = new_max;
    }
    running_sum = hn::Add(running_sum, hn::Exp(tag, hn::Mul(hn::Sub(x, running_max), scales)));
  });
  HWY_ALIGN float lane_max[max_lanes];
  HWY_ALIGN float lane_sum[max_lanes];
  hn::Store(running_max, tag, lane_max);
  hn::Store(running_sum, tag, lane_sum);
  const float shift = *std::max_element(lane_max, lane_max + lanes);
  float sum = 0.0F;
  for (std::size_t lane = 0; lane < lanes; ++lane) {
    if (lane_sum[lane] != 0.0F) sum += lane_sum[lane] * std::exp((lane_max[lane] - shift) * std::fabs(scale));
  }
  const FloatVector shifts = hn::Set(tag, shift);
  const FloatVector inverse = hn::Set(tag, 1.0F / sum);
  for_each_vector(logits, n, sign, [&](FloatVector x, std::size_t i, std::size_t valid) {
    store_partial(hn::Mul(hn::Exp(tag, hn::Mul(hn::Sub(x, shifts), scales)), inverse), out + i, valid);
  });
}

void Blocked(const float* logits, float* out, std::size_t n, float scale, std::size_t tile) {
  const float sign = scale < 0 ? -1.0F : 1.0F;
  const float magnitude = std::fabs(scale);
  std::vector<float> tile_max;
  float shift = negative_infinity;
  float sum = 0.0F;
  for (std::size_t start = 0; start < n; start += tile) {
    const std::size_t length = std::min(tile, n - start);
    const float local_max = row_max(logits + start, length, sign);
    const float local_sum = exp_and_sum(logits + start, out + start, length, sign, local_max, magnitude);
    tile_max.push_back(local_max);
    if (local_max == negative_infinity) continue;  // a fully masked tile adds nothing
    if (local_max > shift) {
      sum = sum * std::exp((shift - local_max) * magnitude) + local_sum;
      shift = local_max;
    } else {
      sum += local_sum * std::exp((local_max - shift) * magnitude);
    }
  }
  for (std::size_t t = 0; t < tile_max.size(); ++t) {
    const std::size_t start = t * tile;
    const float factor = tile_max[t] == negative_infinity ? 0.0F : std::exp((tile_max[t] - shift) * magnitude) / sum;
    multiply_row(out + start, std::min(tile, n - start), factor);
  }
}

// Exact widening of bf16 (a shift) and fp16 (Highway's PromoteTo, exact on every target).
void WidenBf16(const std::uint16_t* in, float* out, std::size_t n) {
  const FloatTag tag;
  const hn::Rebind<std::uint16_t, FloatTag> narrow;
  const hn::RebindToUnsigned<FloatTag> wide;
  const std::size_t lanes = hn::Lanes(tag);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(wide, hn::LoadU(narrow, in + i)));
    hn::StoreU(hn::BitCast(tag, bits), tag, out + i);
  }
  for (; i < n; ++i) out[i] = Bfloat16{in[i]}.to_float();
}

// Round to nearest even into bf16 (Highway 1.0's DemoteTo truncates, so it is not used).
void NarrowToBf16(const float* in, std::uint16_t* out, std::size_t n) {
  const FloatTag tag;
  const hn::RebindToUnsigned<FloatTag> wide;
  const hn::RebindToSigned<FloatTag> wide_signed;
  const hn::Rebind<std::uint16_t, FloatTag> narrow;
  const std::size_t lanes = hn::Lanes(tag);
  const auto rounding_base = hn::Set(wide, 0x7FFFU);
  const auto one = hn::Set(wide, 1U);
  const auto quiet = hn::Set(wide, 0x0040U);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const FloatVector value = hn::LoadU(tag, in + i);
    const auto bits = hn::BitCast(wide, value);
    const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(rounding_base, hn::And(hn::ShiftRight<16>(bits), one))));
    const auto nan = hn::Or(hn::ShiftRight<16>(bits), quiet);
    const auto result = hn::IfThenElse(hn::RebindMask(wide, hn::IsNaN(value)), nan, rounded);
    hn::StoreU(hn::DemoteTo(narrow, hn::BitCast(wide_signed, result)), narrow, out + i);
  }
  for (; i < n; ++i) out[i] = Bfloat16::from_float(in[i]).bits;
}

void WidenFp16(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = Float16{in[i]}.to_float();
}

// F16C's conversion rounds to nearest even; Highway's emulation on other targets truncates, so
// those targets use the exact scalar conversion instead.
void NarrowToFp16(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
#if HWY_TARGET <= HWY_AVX2
  const FloatTag tag;
  const hn::Rebind<hwy::float16_t, FloatTag> half;
  const std::size_t lanes = hn::Lanes(tag);
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::DemoteTo(half, hn::LoadU(tag, in + i)), half, reinterpret_cast<hwy::float16_t*>(out + i));
  }
#endif
  for (; i < n; ++i) out[i] = Float16::from_float(in[i]).bits;
}

}  // namespace sharpcheck::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
HWY_EXPORT(Safe3);
HWY_EXPORT(Naive);
HWY_EXPORT(Online2);
HWY_EXPORT(Blocked);
HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowToBf16);
HWY_EXPORT(WidenFp16);
HWY_EXPORT(NarrowToFp16);

void widen(const Bfloat16* in, float* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenBf16)(reinterpret_cast<const std::uint16_t*>(in), out, n);
}
void narrow(const float* in, Bfloat16* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowToBf16)(in, reinterpret_cast<std::uint16_t*>(out), n);
}
void widen(const Float16* in, float* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenFp16)(reinterpret_cast<const std::uint16_t*>(in), out, n);
}
void narrow(const float* in, Float16* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowToFp16)(in, reinterpret_cast<std::uint16_t*>(out), n);
}

void softmax_naive_fp32(const float* logits, float* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Naive)(logits, out, n, scale);
}
void softmax_safe3_fp32(const float* logits, float* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Safe3)(logits, out, n, scale);
}
void softmax_online2_fp32(const float* logits, float* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Online2)(logits, out, n, scale);
}
void softmax_blocked_fp32(const float* logits, float* out, std::size_t n, float scale, std::size_t tile) {
  HWY_DYNAMIC_DISPATCH(Blocked)(logits, out, n, scale, tile);
}
}  // namespace sharpcheck::kernels
#endif
