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

HWY_INLINE float row_max(const float* logits, std::size_t n, float sign) {
  const FloatTag tag;
  FloatVector best = hn::Set(tag, negative_infinity);
  for_each_vector(logits, n, sign, [&](FloatVector x, std::size_t, std::size_t) { best = hn::Max(best, x); });
  return hn::GetLane(hn::MaxOfLanes(tag, best));
}

// out = exp((sign * e - shift) * magnitude); returns their sum (per-lane sums, then lanes).
HWY_INLINE float exp_and_sum(const float* logits, float* out, std::size_t n, float sign, float shift,
                             float magnitude) {
  const FloatTag tag;
  const FloatVector shifts = hn::Set(tag, shift);
  const FloatVector scales = hn::Set(tag, magnitude);
  FloatVector sum = hn::Zero(tag);
  for_each_vector(logits, n, sign, [&](FloatVector x, std::size_t i, std::size_t valid) {
    const FloatVector w = hn::Exp(tag, hn::Mul(hn::Sub(x, shifts), scales));
    sum = hn::Add(sum, w);
    store_partial(w, out + i, valid);
  });
  return hn::GetLane(hn::SumOfLanes(tag, sum));
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

}  // namespace sharpcheck::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
HWY_EXPORT(Safe3);
HWY_EXPORT(Naive);
HWY_EXPORT(Online2);
HWY_EXPORT(Blocked);

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
