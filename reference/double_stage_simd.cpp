// The double stage's softmax loops in Highway SIMD (see double_stage_simd.hpp for the contract).
// Every lane repeats the scalar operations of double_stage.cpp in the same order, each rounded to
// nearest: Mul then Add where the scalar code multiplies then adds (this file is compiled with
// -ffp-contract=off, so the compiler may not fuse them either).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reference/double_stage_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
//
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "reference/certified_exp_constants.hpp"
#include "reference/double_stage.hpp"
#include "reference/double_stage_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace sharpcheck::reference::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DoubleTag = hn::ScalableTag<double>;
using DoubleVector = hn::Vec<DoubleTag>;
constexpr std::size_t max_lanes = HWY_MAX_BYTES / sizeof(double);
constexpr double unit_roundoff = 0x1p-53;

// certified_exp, lane by lane. The scalar k = nearbyint(fl(x / ln 2)) is computed here by adding and
// subtracting 1.5 * 2^52: for |y| < 2^51 the sum lies where doubles are the integers, so it rounds y
// to the nearest integer, ties to even, exactly as nearbyint does under round to nearest. The sum's
// low mantissa bits then hold 2^51 + k, from which 2^k's exponent field k + 1023 follows by an
// integer addition (the shift by 52 discards the bits above it).
HWY_INLINE DoubleVector CertifiedExp(DoubleTag d, DoubleVector x) {
  const hn::RebindToSigned<DoubleTag> integers;
  const DoubleVector magic = hn::Set(d, 0x1.8p52);
  namespace constants = certified_exp_constants;
  const DoubleVector biased = hn::Add(hn::Mul(x, hn::Set(d, constants::inverse_ln2)), magic);
  const DoubleVector k = hn::Sub(biased, magic);
  const DoubleVector r = hn::Sub(hn::Sub(x, hn::Mul(k, hn::Set(d, constants::ln2_high))),
                                 hn::Mul(k, hn::Set(d, constants::ln2_low)));
  DoubleVector p = hn::Set(d, constants::taylor[constants::degree]);
  for (int i = constants::degree - 1; i >= 0; --i)
    p = hn::Add(hn::Mul(p, r), hn::Set(d, constants::taylor[i]));
  const auto exponent = hn::ShiftLeft<52>(hn::Add(
      hn::BitCast(integers, biased), hn::Set(integers, std::int64_t{1023} - (std::int64_t{1} << 51))));
  return hn::Mul(p, hn::BitCast(d, exponent));
}

// Calls body(vector, index, valid) for each vector of the span; the last, partial one is read from a
// copy padded with `pad`, and only its first `valid` lanes count.
template <class Body>
HWY_INLINE void for_each_vector(const double* in, std::size_t n, double pad, Body&& body) {
  const DoubleTag d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) body(hn::LoadU(d, in + i), i, lanes);
  if (i == n) return;
  HWY_ALIGN double padded[max_lanes];
  std::fill(padded, padded + lanes, pad);
  std::copy(in + i, in + n, padded);
  body(hn::Load(d, padded), i, n - i);
}

HWY_INLINE void store_partial(DoubleVector value, double* out, std::size_t valid) {
  const DoubleTag d;
  if (valid == hn::Lanes(d)) {
    hn::StoreU(value, d, out);
    return;
  }
  HWY_ALIGN double lanes[max_lanes];
  hn::Store(value, d, lanes);
  std::copy(lanes, lanes + valid, out);
}

void CertifiedExpMany(const double* x, double* out, std::size_t n) {
  for_each_vector(x, n, 0.0, [&](DoubleVector v, std::size_t i, std::size_t valid) {
    store_partial(CertifiedExp(DoubleTag(), v), out + i, valid);
  });
}

void ExponentiateShifted(const double* logits, std::size_t n, double shift, double theta, double* weights,
                         double* magnitudes, ShiftedExponentials* found) {
  const DoubleTag d;
  const DoubleVector shift_vector = hn::Set(d, shift);
  const DoubleVector theta_vector = hn::Set(d, theta);
  const DoubleVector cutoff = hn::Set(d, -700.0);
  const DoubleVector zero = hn::Zero(d);
  DoubleVector largest = zero;
  auto finite = hn::Eq(zero, zero);
  std::size_t tiny = 0;
  // Padding with the shift gives z = 0: finite, not tiny, and its lanes are not counted.
  for_each_vector(logits, n, shift, [&](DoubleVector e, std::size_t i, std::size_t valid) {
    const DoubleVector difference = hn::Sub(e, shift_vector);
    finite = hn::And(finite, hn::IsFinite(difference));
    // z / 1 is z: the scalar code's skipped division changes nothing.
    const DoubleVector z = hn::Div(difference, theta_vector);
    const DoubleVector magnitude = hn::Abs(z);
    const auto is_tiny = hn::Lt(z, cutoff);
    // Tiny lanes are exponentiated at 0 (so no lane leaves the exp's range) and then zeroed.
    const DoubleVector argument = hn::IfThenZeroElse(is_tiny, hn::Min(z, zero));
    store_partial(hn::IfThenZeroElse(is_tiny, CertifiedExp(d, argument)), weights + i, valid);
    store_partial(magnitude, magnitudes + i, valid);
    largest = hn::Max(largest, hn::IfThenZeroElse(is_tiny, magnitude));
    tiny += hn::CountTrue(d, is_tiny);
  });
  found->finite = hn::AllTrue(d, finite);
  found->largest_magnitude = hn::GetLane(hn::MaxOfLanes(d, largest));
  found->tiny = tiny;
}

// The interval of coefficient j (double_stage_simd.hpp), both ends.
struct Bracket {
  DoubleVector low, high;
};
HWY_INLINE Bracket BracketOf(DoubleVector weight, DoubleVector magnitude, DoubleVector sum,
                             DoubleVector shared) {
  const DoubleTag d;
  const DoubleVector error = hn::Mul(
      hn::Add(hn::Add(hn::Set(d, certified_exp_error), hn::Mul(hn::Set(d, 2.01 * unit_roundoff), magnitude)),
              shared),
      hn::Set(d, 1 + 0x1p-20));
  const DoubleVector coefficient = hn::Div(weight, sum);
  const DoubleVector widening = hn::Add(error, hn::Set(d, 4 * unit_roundoff));
  const DoubleVector low = hn::Mul(coefficient, hn::Sub(hn::Set(d, 1.0), widening));
  const DoubleVector high = hn::Mul(coefficient, hn::Add(hn::Set(d, 1.0), widening));
  return {low, hn::IfThenElse(hn::Eq(weight, hn::Zero(d)), hn::Set(d, 0x1p-1008), high)};
}

void BracketCoefficients(const double* weights, const double* magnitudes, std::size_t n, double sum,
                         double shared, double* low, double* high) {
  const DoubleTag d;
  const std::size_t lanes = hn::Lanes(d);
  const DoubleVector sum_vector = hn::Set(d, sum);
  const DoubleVector shared_vector = hn::Set(d, shared);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const Bracket bracket =
        BracketOf(hn::LoadU(d, weights + i), hn::LoadU(d, magnitudes + i), sum_vector, shared_vector);
    hn::StoreU(bracket.low, d, low + i);
    hn::StoreU(bracket.high, d, high + i);
  }
  if (i == n) return;
  HWY_ALIGN double weight_lanes[max_lanes] = {};
  HWY_ALIGN double magnitude_lanes[max_lanes] = {};
  std::copy(weights + i, weights + n, weight_lanes);
  std::copy(magnitudes + i, magnitudes + n, magnitude_lanes);
  const Bracket bracket =
      BracketOf(hn::Load(d, weight_lanes), hn::Load(d, magnitude_lanes), sum_vector, shared_vector);
  store_partial(bracket.low, low + i, n - i);
  store_partial(bracket.high, high + i, n - i);
}

HWY_INLINE DoubleVector RoundToFp32(DoubleVector x) {
  const DoubleTag d;
  const hn::Rebind<float, DoubleTag> floats;
  return hn::PromoteTo(d, hn::DemoteTo(floats, x));  // conversion rounds to nearest even, subnormals too
}

std::size_t DecideCoefficientsInFp32(const double* weights, const double* magnitudes, std::size_t n,
                                     double sum, double shared, double* values) {
  const DoubleTag d;
  const std::size_t lanes = hn::Lanes(d);
  const DoubleVector sum_vector = hn::Set(d, sum);
  const DoubleVector shared_vector = hn::Set(d, shared);
  const DoubleVector undecided = hn::Set(d, std::numeric_limits<double>::quiet_NaN());
  std::size_t decided = 0;
  const auto decide = [&](DoubleVector weight, DoubleVector magnitude, double* out, std::size_t valid) {
    const Bracket bracket = BracketOf(weight, magnitude, sum_vector, shared_vector);
    const DoubleVector high = RoundToFp32(bracket.high);
    const auto agree = hn::Eq(RoundToFp32(bracket.low), high);
    // The high end's: a coefficient is positive, and where both ends round to a zero the low one
    // (below 0 by the bracket's width) gives -0, which equals +0 as a number but not as bits.
    store_partial(hn::IfThenElse(agree, high, undecided), out, valid);
    return agree;
  };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    decided +=
        hn::CountTrue(d, decide(hn::LoadU(d, weights + i), hn::LoadU(d, magnitudes + i), values + i, lanes));
  }
  if (i == n) return decided;
  HWY_ALIGN double weight_lanes[max_lanes] = {};
  HWY_ALIGN double magnitude_lanes[max_lanes] = {};
  std::copy(weights + i, weights + n, weight_lanes);
  std::copy(magnitudes + i, magnitudes + n, magnitude_lanes);
  decide(hn::Load(d, weight_lanes), hn::Load(d, magnitude_lanes), values + i, n - i);
  for (; i < n; ++i) decided += std::isnan(values[i]) ? 0 : 1;
  return decided;
}

}  // namespace sharpcheck::reference::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sharpcheck::reference {
HWY_EXPORT(CertifiedExpMany);
HWY_EXPORT(ExponentiateShifted);
HWY_EXPORT(BracketCoefficients);
HWY_EXPORT(DecideCoefficientsInFp32);

void certified_exp_many(std::span<const double> x, std::span<double> out) {
  HWY_DYNAMIC_DISPATCH(CertifiedExpMany)(x.data(), out.data(), std::min(x.size(), out.size()));
}

ShiftedExponentials exponentiate_shifted(std::span<const double> logits, double shift, double theta,
                                         std::span<double> weights, std::span<double> magnitudes) {
  ShiftedExponentials found;
  HWY_DYNAMIC_DISPATCH(ExponentiateShifted)
  (logits.data(), logits.size(), shift, theta, weights.data(), magnitudes.data(), &found);
  return found;
}

void bracket_coefficients(std::span<const double> weights, std::span<const double> magnitudes, double sum,
                          double shared, std::span<double> low, std::span<double> high) {
  HWY_DYNAMIC_DISPATCH(BracketCoefficients)
  (weights.data(), magnitudes.data(), weights.size(), sum, shared, low.data(), high.data());
}

std::size_t decide_coefficients_in_fp32(std::span<const double> weights, std::span<const double> magnitudes,
                                        double sum, double shared, std::span<double> values) {
  return HWY_DYNAMIC_DISPATCH(DecideCoefficientsInFp32)(weights.data(), magnitudes.data(), weights.size(),
                                                        sum, shared, values.data());
}

}  // namespace sharpcheck::reference
#endif  // HWY_ONCE
