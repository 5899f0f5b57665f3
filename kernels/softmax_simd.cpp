// The fp32 softmax cores, vectorised with Highway and compiled once per SIMD target; the best
// target the CPU supports is chosen at run time (HWY_DYNAMIC_DISPATCH). The shifted cores use
// ExpOfNonpositive (2u relative, checked on every float: the tolerance table's assumption); the
// unshifted naive core needs positive arguments and keeps Highway's Exp (1 ulp, documented).
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
#include <type_traits>
#include <vector>

#include "formats/storage.hpp"
#include "kernels/nonpositive_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sharpcheck::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using FloatTag = hn::ScalableTag<float>;
using FloatVector = hn::Vec<FloatTag>;
constexpr std::size_t max_lanes = HWY_MAX_BYTES / sizeof(float);
constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// The cores read fp32, bf16 or fp16 logits and write the same format, arithmetic in fp32 either
// way. bf16 widens exactly by a shift (its bits are the top half of a float's) and is rounded to
// nearest even by integer arithmetic (Highway 1.0's DemoteTo truncates). fp16 uses F16C where the
// target has it (exact widening, round-to-nearest-even narrowing); elsewhere Highway 1.0's
// emulation maps inf and NaN to finite values and truncates, so those targets convert one value at
// a time with the exact scalar conversions of formats/storage.hpp.
using NarrowTag = hn::Rebind<std::uint16_t, FloatTag>;

HWY_INLINE FloatVector load_logits(const float* p) { return hn::LoadU(FloatTag(), p); }
HWY_INLINE FloatVector load_logits(const Bfloat16* p) {
  const hn::RebindToUnsigned<FloatTag> wide;
  const auto bits = hn::LoadU(NarrowTag(), reinterpret_cast<const std::uint16_t*>(p));
  return hn::BitCast(FloatTag(), hn::ShiftLeft<16>(hn::PromoteTo(wide, bits)));
}
HWY_INLINE FloatVector load_logits(const Float16* p) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, FloatTag> half;
  return hn::PromoteTo(FloatTag(), hn::LoadU(half, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  HWY_ALIGN float widened[max_lanes];
  for (std::size_t i = 0; i < hn::Lanes(FloatTag()); ++i) widened[i] = p[i].to_float();
  return hn::Load(FloatTag(), widened);
#endif
}
HWY_INLINE float widen_one(float value) { return value; }
HWY_INLINE float widen_one(Bfloat16 value) { return value.to_float(); }
HWY_INLINE float widen_one(Float16 value) { return value.to_float(); }
HWY_INLINE void narrow_one(float value, float* out) { *out = value; }
HWY_INLINE void narrow_one(float value, Bfloat16* out) { *out = Bfloat16::from_float(value); }
HWY_INLINE void narrow_one(float value, Float16* out) { *out = Float16::from_float(value); }

HWY_INLINE hn::Vec<NarrowTag> round_to_bf16(FloatVector value) {
  const hn::RebindToUnsigned<FloatTag> wide;
  const hn::RebindToSigned<FloatTag> wide_signed;
  const auto bits = hn::BitCast(wide, value);
  const auto rounding = hn::Add(hn::Set(wide, 0x7FFFU), hn::And(hn::ShiftRight<16>(bits), hn::Set(wide, 1U)));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, rounding));
  const auto nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(wide, 0x0040U));
  const auto result = hn::IfThenElse(hn::RebindMask(wide, hn::IsNaN(value)), nan, rounded);
  return hn::DemoteTo(NarrowTag(), hn::BitCast(wide_signed, result));
}
HWY_INLINE void store_full(FloatVector value, float* out) { hn::StoreU(value, FloatTag(), out); }
HWY_INLINE void store_full(FloatVector value, Bfloat16* out) {
  hn::StoreU(round_to_bf16(value), NarrowTag(), reinterpret_cast<std::uint16_t*>(out));
}
HWY_INLINE void store_full(FloatVector value, Float16* out) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, FloatTag> half;
  hn::StoreU(hn::DemoteTo(half, value), half, reinterpret_cast<hwy::float16_t*>(out));
#else
  HWY_ALIGN float values[max_lanes];
  hn::Store(value, FloatTag(), values);
  for (std::size_t i = 0; i < hn::Lanes(FloatTag()); ++i) out[i] = Float16::from_float(values[i]);
#endif
}

template <class Input>
constexpr Input masked_logit() {
  if constexpr (std::is_same_v<Input, float>) {
    return negative_infinity;
  } else if constexpr (std::is_same_v<Input, Bfloat16>) {
    return Bfloat16{0xFF80};  // -inf
  } else {
    return Float16{0xFC00};  // -inf
  }
}

// -e for a negative temperature; a -inf logit is a masked entry whatever the temperature's sign:
// it stays -inf.
HWY_INLINE FloatVector negate_keeping_masked(FloatVector x) {
  const FloatVector masked = hn::Set(FloatTag(), negative_infinity);
  return hn::IfThenElse(hn::Eq(x, masked), masked, hn::Neg(x));
}

// Calls body(vector_of_signed_logits, index, lanes_valid) over the row; the tail is padded with
// -inf, which every core treats as a masked entry (exp gives 0, max ignores it).
template <class Input, typename Body>
HWY_INLINE void for_each_vector(const Input* logits, std::size_t n, float sign, Body&& body) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const auto signed_logits = [sign](FloatVector x) { return sign < 0 ? negate_keeping_masked(x) : x; };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) body(signed_logits(load_logits(logits + i)), i, lanes);
  if (i < n) {
    HWY_ALIGN Input padded[max_lanes];
    std::fill(padded, padded + lanes, masked_logit<Input>());
    std::copy(logits + i, logits + n, padded);
    body(signed_logits(load_logits(padded)), i, n - i);
  }
}

template <class Output>
HWY_INLINE void store_partial(FloatVector value, Output* out, std::size_t lanes_valid) {
  if (lanes_valid == hn::Lanes(FloatTag())) {
    store_full(value, out);
    return;
  }
  HWY_ALIGN Output padded[max_lanes];
  store_full(value, padded);
  std::copy(padded, padded + lanes_valid, out);
}

// out = exps * factor, rounded to the output's format.
template <class Output>
HWY_INLINE void normalise(const float* exps, Output* out, std::size_t n, FloatVector factor) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store_full(hn::Mul(hn::LoadU(tag, exps + i), factor), out + i);
  if (i < n) {
    HWY_ALIGN float padded[max_lanes] = {};
    std::copy(exps + i, exps + n, padded);
    store_partial(hn::Mul(hn::Load(tag, padded), factor), out + i, n - i);
  }
}

// Four accumulators in flight, so the loop is not bound by the latency of one max or add chain.
template <class Input>
HWY_INLINE float row_max(const Input* logits, std::size_t n, float sign) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  FloatVector best[4] = {hn::Set(tag, negative_infinity), hn::Set(tag, negative_infinity),
                         hn::Set(tag, negative_infinity), hn::Set(tag, negative_infinity)};
  std::size_t i = 0;
  if (sign > 0) {  // the common case, without the masked-entry select
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      HWY_UNROLL(4)
      for (int a = 0; a < 4; ++a) best[a] = hn::Max(best[a], load_logits(logits + i + a * lanes));
    }
  }
  for_each_vector(logits + i, n - i, sign,
                  [&](FloatVector x, std::size_t, std::size_t) { best[0] = hn::Max(best[0], x); });
  const FloatVector all = hn::Max(hn::Max(best[0], best[1]), hn::Max(best[2], best[3]));
  return hn::GetLane(hn::MaxOfLanes(tag, all));
}

// out = exp((sign * e - shift) * magnitude); returns their sum (per-lane sums, then lanes).
template <class Input>
HWY_INLINE float exp_and_sum(const Input* logits, float* out, std::size_t n, float sign, float shift,
                             float magnitude) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  const FloatVector shifts = hn::Set(tag, shift);
  const FloatVector scales = hn::Set(tag, magnitude);
  FloatVector sum[4] = {hn::Zero(tag), hn::Zero(tag), hn::Zero(tag), hn::Zero(tag)};
  std::size_t i = 0;
  if (sign > 0) {
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      HWY_UNROLL(4)
      for (int a = 0; a < 4; ++a) {
        const FloatVector w =
            ExpOfNonpositive(tag, hn::Mul(hn::Sub(load_logits(logits + i + a * lanes), shifts), scales));
        sum[a] = hn::Add(sum[a], w);
        hn::StoreU(w, tag, out + i + a * lanes);
      }
    }
  }
  for_each_vector(logits + i, n - i, sign, [&](FloatVector x, std::size_t j, std::size_t valid) {
    const FloatVector w = ExpOfNonpositive(tag, hn::Mul(hn::Sub(x, shifts), scales));
    sum[0] = hn::Add(sum[0], w);
    store_partial(w, out + i + j, valid);
  });
  const FloatVector all = hn::Add(hn::Add(sum[0], sum[1]), hn::Add(sum[2], sum[3]));
  return hn::GetLane(hn::SumOfLanes(tag, all));
}

// scale = 0 (theta = inf): every unmasked logit's argument is 0, so the row is uniform over them.
// Said separately because the cores' arguments would be -inf * 0 = NaN on masked entries.
template <class Input, class Output>
bool uniform_when_scale_is_zero(const Input* logits, Output* out, std::size_t n, float scale) {
  if (scale != 0.0F) return false;
  std::size_t unmasked = 0;
  for (std::size_t i = 0; i < n; ++i) unmasked += widen_one(logits[i]) != negative_infinity ? 1 : 0;
  const float share = 1.0F / static_cast<float>(unmasked);
  for (std::size_t i = 0; i < n; ++i)
    narrow_one(widen_one(logits[i]) != negative_infinity ? share : 0.0F, out + i);
  return true;
}

// Exponentials go to `exps` (the output row itself for fp32), then are normalised into `out`.
template <class Input, class Output>
void Safe3Row(const Input* logits, float* exps, Output* out, std::size_t n, float scale) {
  if (uniform_when_scale_is_zero(logits, out, n, scale)) return;
  const float sign = scale < 0 ? -1.0F : 1.0F;
  const float magnitude = std::fabs(scale);
  const float shift = row_max(logits, n, sign);
  const float sum = exp_and_sum(logits, exps, n, sign, shift, magnitude);
  normalise(exps, out, n, hn::Set(FloatTag(), 1.0F / sum));
}

void Safe3(const float* logits, float* out, std::size_t n, float scale) {
  Safe3Row(logits, out, out, n, scale);
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
  normalise(out, out, n, hn::Set(tag, 1.0F / hn::GetLane(hn::SumOfLanes(tag, sum))));
}

// One pass over tiles of 4 vectors keeps one running max (of the row so far) and a sum rescaled
// whenever a tile raises it, and stores each exp against the running max at its tile; every tile
// that raises the max starts a segment. The second pass multiplies each segment by
// exp(segment max - final max) / sum. One exp per element and one per segment: about
// ln(n / tile) segments on a random row, one per tile on a rising row. (A running max per SIMD
// lane would start a segment at almost every vector: 16 lanes each see their own new maxima.)
template <bool kNegate, class Input>
HWY_INLINE FloatVector load_signed(const Input* p) {
  const FloatVector x = load_logits(p);
  if constexpr (kNegate) {
    return negate_keeping_masked(x);
  } else {
    return x;
  }
}

template <bool kNegate, class Input, class Output>
void Online2Tiles(const Input* logits, float* exps, Output* out, std::size_t n, float magnitude) {
  const FloatTag tag;
  const std::size_t lanes = hn::Lanes(tag);
  constexpr std::size_t unroll = 4;
  const std::size_t tile = unroll * lanes;
  const FloatVector scales = hn::Set(tag, magnitude);
  thread_local std::vector<std::size_t> segment_starts;
  thread_local std::vector<float> segment_maxima;
  segment_starts.clear();
  segment_maxima.clear();
  // The lowest finite float, not -inf, stands for "nothing seen yet": masked entries then give
  // exp(-inf - lowest) = 0 rather than exp(-inf + inf) = NaN.
  float running_max = std::numeric_limits<float>::lowest();
  FloatVector shift = hn::Set(tag, running_max);
  FloatVector sums[unroll] = {hn::Zero(tag), hn::Zero(tag), hn::Zero(tag), hn::Zero(tag)};
  // One loop body for every tile (kept inline, so the sums stay in registers); the last, partial
  // tile runs on copies padded with masked entries.
  HWY_ALIGN Input padded_logits[unroll * max_lanes];
  HWY_ALIGN float padded_exps[unroll * max_lanes];
  for (std::size_t start = 0; start < n; start += tile) {
    const Input* tile_logits = logits + start;
    float* tile_exps = exps + start;
    const bool partial = start + tile > n;
    if (partial) {
      std::fill(padded_logits, padded_logits + tile, masked_logit<Input>());
      std::copy(logits + start, logits + n, padded_logits);
      tile_logits = padded_logits;
      tile_exps = padded_exps;
    }
    FloatVector x[unroll];
    // Unrolled by pragma: without it GCC keeps x[] and sums[] in stack arrays, not registers.
    HWY_UNROLL(4)
    for (std::size_t a = 0; a < unroll; ++a) x[a] = load_signed<kNegate>(tile_logits + a * lanes);
    const FloatVector lane_maxima = hn::Max(hn::Max(x[0], x[1]), hn::Max(x[2], x[3]));
    // A vector compare first: the reduction across lanes is paid only by tiles that raise the max.
    if (HWY_UNLIKELY(!hn::AllFalse(tag, hn::Gt(lane_maxima, shift)))) {
      const float tile_max = hn::GetLane(hn::MaxOfLanes(tag, lane_maxima));
      if (!segment_starts.empty()) {  // before the first segment the sums are 0: nothing to rescale
        const FloatVector rescale = ExpOfNonpositive(tag, hn::Set(tag, (running_max - tile_max) * magnitude));
        HWY_UNROLL(4)
        for (auto& sum : sums) sum = hn::Mul(sum, rescale);
      }
      running_max = tile_max;
      shift = hn::Set(tag, running_max);
      segment_starts.push_back(start);
      segment_maxima.push_back(running_max);
    }
    HWY_UNROLL(4)
    for (std::size_t a = 0; a < unroll; ++a) {
      const FloatVector w = ExpOfNonpositive(tag, hn::Mul(hn::Sub(x[a], shift), scales));
      sums[a] = hn::Add(sums[a], w);
      hn::StoreU(w, tag, tile_exps + a * lanes);
    }
    if (partial) std::copy(padded_exps, padded_exps + (n - start), exps + start);
  }
  if (segment_starts.empty()) {  // every entry masked: nothing to normalise, as safe3 gives
    normalise(exps, out, n, hn::Set(tag, std::numeric_limits<float>::infinity()));
    return;
  }
  // Tiles before the first segment were all masked: their exps are 0, and a narrow output still
  // needs them written.
  normalise(exps, out, segment_starts.front(), hn::Zero(tag));
  const float sum =
      hn::GetLane(hn::SumOfLanes(tag, hn::Add(hn::Add(sums[0], sums[1]), hn::Add(sums[2], sums[3]))));
  // Every segment's factor exp(segment max - final max) / sum, a vector of segments at a time.
  const std::size_t segments = segment_starts.size();
  segment_maxima.resize((segments + lanes - 1) / lanes * lanes, running_max);  // padding: factor 1/sum
  const FloatVector final_max = hn::Set(tag, running_max);
  const FloatVector inverse = hn::Set(tag, 1.0F / sum);
  for (std::size_t s = 0; s < segments; s += lanes) {
    const FloatVector maxima = hn::LoadU(tag, segment_maxima.data() + s);
    const FloatVector factors =
        hn::Mul(ExpOfNonpositive(tag, hn::Mul(hn::Sub(maxima, final_max), scales)), inverse);
    hn::StoreU(factors, tag, segment_maxima.data() + s);  // the maxima are not needed again
  }
  for (std::size_t s = 0; s < segments; ++s) {
    const std::size_t begin = segment_starts[s];
    const std::size_t end = s + 1 < segments ? segment_starts[s + 1] : n;
    normalise(exps + begin, out + begin, end - begin, hn::Set(tag, segment_maxima[s]));
  }
}

template <class Input, class Output>
void Online2Row(const Input* logits, float* exps, Output* out, std::size_t n, float scale) {
  if (uniform_when_scale_is_zero(logits, out, n, scale)) return;
  if (scale < 0) {
    Online2Tiles<true>(logits, exps, out, n, -scale);
  } else {
    Online2Tiles<false>(logits, exps, out, n, scale);
  }
}

void Online2(const float* logits, float* out, std::size_t n, float scale) {
  Online2Row(logits, out, out, n, scale);
}

// bf16 and fp16 rows: read and written in their format, exponentials kept in fp32 in a per-thread
// buffer.
float* narrow_row_buffer(std::size_t n) {
  thread_local std::vector<float> exps;
  exps.resize(n);
  return exps.data();
}
template <class Storage>
void Safe3Narrow(const Storage* logits, Storage* out, std::size_t n, float scale) {
  Safe3Row(logits, narrow_row_buffer(n), out, n, scale);
}
template <class Storage>
void Online2Narrow(const Storage* logits, Storage* out, std::size_t n, float scale) {
  Online2Row(logits, narrow_row_buffer(n), out, n, scale);
}
void Safe3Bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale) {
  Safe3Narrow(logits, out, n, scale);
}
void Online2Bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale) {
  Online2Narrow(logits, out, n, scale);
}
void Safe3Fp16(const Float16* logits, Float16* out, std::size_t n, float scale) {
  Safe3Narrow(logits, out, n, scale);
}
void Online2Fp16(const Float16* logits, Float16* out, std::size_t n, float scale) {
  Online2Narrow(logits, out, n, scale);
}

void Blocked(const float* logits, float* out, std::size_t n, float scale, std::size_t tile) {
  if (uniform_when_scale_is_zero(logits, out, n, scale)) return;
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
    const float factor =
        tile_max[t] == negative_infinity ? 0.0F : std::exp((tile_max[t] - shift) * magnitude) / sum;
    normalise(out + start, out + start, std::min(tile, n - start), hn::Set(FloatTag(), factor));
  }
}

// Row conversions: exact widening, rounding to nearest even (the helpers above).
template <class Storage>
void WidenRow(const Storage* in, float* out, std::size_t n) {
  const std::size_t lanes = hn::Lanes(FloatTag());
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store_full(load_logits(in + i), out + i);
  for (; i < n; ++i) out[i] = widen_one(in[i]);
}
template <class Storage>
void NarrowRow(const float* in, Storage* out, std::size_t n) {
  const std::size_t lanes = hn::Lanes(FloatTag());
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store_full(hn::LoadU(FloatTag(), in + i), out + i);
  for (; i < n; ++i) narrow_one(in[i], out + i);
}
void WidenBf16(const Bfloat16* in, float* out, std::size_t n) { WidenRow(in, out, n); }
void NarrowToBf16(const float* in, Bfloat16* out, std::size_t n) { NarrowRow(in, out, n); }
void WidenFp16(const Float16* in, float* out, std::size_t n) { WidenRow(in, out, n); }
void NarrowToFp16(const float* in, Float16* out, std::size_t n) { NarrowRow(in, out, n); }

void ExpOfNonpositiveRow(const float* in, float* out, std::size_t n, const ExpPolynomial& polynomial) {
  for_each_vector(in, n, 1.0F, [&](FloatVector x, std::size_t i, std::size_t valid) {
    store_partial(ExpOfNonpositive(FloatTag(), x, polynomial), out + i, valid);
  });
}

}  // namespace sharpcheck::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/exp_polynomial.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
HWY_EXPORT(Safe3);
HWY_EXPORT(Naive);
HWY_EXPORT(Online2);
HWY_EXPORT(Safe3Bf16);
HWY_EXPORT(Online2Bf16);
HWY_EXPORT(Safe3Fp16);
HWY_EXPORT(Online2Fp16);
HWY_EXPORT(Blocked);
HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowToBf16);
HWY_EXPORT(WidenFp16);
HWY_EXPORT(NarrowToFp16);
HWY_EXPORT(ExpOfNonpositiveRow);

void exp_of_nonpositive(const float* in, float* out, std::size_t n, const ExpPolynomial& polynomial) {
  HWY_DYNAMIC_DISPATCH(ExpOfNonpositiveRow)(in, out, n, polynomial);
}

void widen(const Bfloat16* in, float* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(WidenBf16)(in, out, n); }
void narrow(const float* in, Bfloat16* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(NarrowToBf16)(in, out, n); }
void widen(const Float16* in, float* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(WidenFp16)(in, out, n); }
void narrow(const float* in, Float16* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(NarrowToFp16)(in, out, n); }

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
void softmax_safe3_bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Safe3Bf16)(logits, out, n, scale);
}
void softmax_online2_bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Online2Bf16)(logits, out, n, scale);
}
void softmax_safe3_fp16(const Float16* logits, Float16* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Safe3Fp16)(logits, out, n, scale);
}
void softmax_online2_fp16(const Float16* logits, Float16* out, std::size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(Online2Fp16)(logits, out, n, scale);
}
}  // namespace sharpcheck::kernels
#endif
