// The constants of certified_exp (reference/double_stage.cpp, where its error bound is proved):
// one definition for the scalar function and its SIMD lanes (reference/double_stage_simd.cpp),
// which must compute the same thing bit for bit.
#pragma once

namespace sharpcheck::reference::certified_exp_constants {

inline constexpr double inverse_ln2 = 0x1.71547652b82fep0;
// 33 significant bits: k * ln2_high is exact for |k| < 2^20.
inline constexpr double ln2_high = 0x1.62e42fefp-1;
// ln 2 - ln2_high, to within 2^-89.
inline constexpr double ln2_low = 0x1.473de6af278edp-34;
// Taylor coefficients 1/i! rounded to double, i = 0..13 (Horner's rule from the last).
inline constexpr double taylor[] = {
    1.0,        1.0,         1.0 / 2,      1.0 / 6,       1.0 / 24,       1.0 / 120,       1.0 / 720,
    1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};
inline constexpr int degree = 13;

}  // namespace sharpcheck::reference::certified_exp_constants
