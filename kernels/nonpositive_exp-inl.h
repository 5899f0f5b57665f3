// exp(x) for x <= 0, the only arguments a shifted softmax exponentiates, in Highway SIMD; a
// per-target header (included once per target by the kernels' foreach_target translation unit).
//
// Contract, checked on every float x in [-104, 0] on the dispatched target and on the scalar
// fallback (tests/nonpositive_exp_test.cpp, against reference::certified_exp): relative error at
// most 2^-23 (2u, what the tolerance table assumes of an exp) where exp(x) >= 2^-126, absolute
// error at most 2^-149 (one subnormal) below; exp(-inf) = +0, NaN stays NaN. Unspecified for x > 0.
//
// Why not Highway's Exp: it serves all of float's range, with a degree-7 polynomial and a
// two-product scaling; here 16 operations per vector instead of about 27 make the exp pass, the
// kernels' hot loop, cheaper (docs/performance.md).
#if defined(SHARPCHECK_KERNELS_NONPOSITIVE_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SHARPCHECK_KERNELS_NONPOSITIVE_EXP_INL_H_
#undef SHARPCHECK_KERNELS_NONPOSITIVE_EXP_INL_H_
#else
#define SHARPCHECK_KERNELS_NONPOSITIVE_EXP_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/exp_polynomial.hpp"

HWY_BEFORE_NAMESPACE();
namespace sharpcheck::kernels::HWY_NAMESPACE {

template <class D, class V = hwy::HWY_NAMESPACE::Vec<D>>
HWY_INLINE V ExpOfNonpositive(D d, V x, const ExpPolynomial& polynomial = softmax_exp_polynomial) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<D> integers;
  // Below -104, exp(x) < 2^-150 rounds to 0; clamping keeps k in range and sends -inf to 0. A
  // compare and select, not Max: Max drops NaN on the scalar target.
  const V lowest = hn::Set(d, -104.0F);
  const V clamped = hn::IfThenElse(hn::Lt(x, lowest), lowest, x);
  // k = round(x / ln 2): adding 1.5 * 2^23 rounds to an integer and leaves 2^22 + 2^23 + k in the
  // bits, so k comes back by subtracting the constant again.
  const V magic = hn::Set(d, 12582912.0F);
  const V biased = hn::MulAdd(clamped, hn::Set(d, 1.44269502162933349609375F), magic);
  const V k = hn::Sub(biased, magic);
  // Cody-Waite reduction r = x - k ln 2. ln2_high has 15 significant bits, so k ln2_high is exact
  // for |k| <= 256, and x - k ln2_high is exact too (a multiple of ulp(x) no larger than |x|), also
  // without FMA; only the second step rounds.
  V r = hn::NegMulAdd(k, hn::Set(d, 0.693145751953125F), clamped);
  r = hn::NegMulAdd(k, hn::Set(d, 1.428606765330187045e-6F), r);
  // exp(r) = 1 + r (1 + r q(r)), q of degree 4 (scripts/fit_exp_polynomial.py).
  V q = hn::MulAdd(hn::Set(d, polynomial.c6), r, hn::Set(d, polynomial.c5));
  q = hn::MulAdd(q, r, hn::Set(d, polynomial.c4));
  q = hn::MulAdd(q, r, hn::Set(d, polynomial.c3));
  q = hn::MulAdd(q, r, hn::Set(d, polynomial.c2));
  const V one = hn::Set(d, 1.0F);
  const V exp_r = hn::MulAdd(hn::MulAdd(q, r, one), r, one);
  // 2^(k + 64) is a normal float for k in [-151, 0]: its exponent field is (k + 64 + 127), and
  // shifting the biased bits left by 23 leaves exactly that (the constant's own bits shift out).
  // The product by it is exact; the product by 2^-64 rounds once, into the subnormals if needed.
  const auto exponent =
      hn::ShiftLeft<23>(hn::Add(hn::BitCast(integers, biased), hn::Set(integers, 64 + 127)));
  return hn::Mul(hn::Mul(exp_r, hn::BitCast(d, exponent)), hn::Set(d, 0x1p-64F));
}

}  // namespace sharpcheck::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SHARPCHECK_KERNELS_NONPOSITIVE_EXP_INL_H_
