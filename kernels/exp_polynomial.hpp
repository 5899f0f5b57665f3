// The polynomial of the shifted kernels' exp (kernels/nonpositive_exp-inl.h) and the row-wise
// entry point that tests its contract on every float.
#pragma once

#include <cstddef>

namespace sharpcheck::kernels {

// exp(r) ~ 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4) on |r| <= ln(2)/2.
struct ExpPolynomial {
  float c2, c3, c4, c5, c6;
};

// Chebyshev interpolation, coefficients rounded to float (scripts/fit_exp_polynomial.py prints
// them): 0.16 u relative in exact arithmetic; the rest of the 2u contract is rounding.
inline constexpr ExpPolynomial softmax_exp_polynomial{0x1p-1F, 0x1.5554dep-3F, 0x1.55551ap-5F, 0x1.120b62p-7F,
                                                      0x1.6d10fcp-10F};

// out[i] = exp(in[i]) for in[i] <= 0 by the kernels' exp on the dispatched SIMD target, with the
// contract stated in kernels/nonpositive_exp-inl.h. `polynomial` is a parameter so that a test can
// show a wrong one breaks the contract.
void exp_of_nonpositive(const float* in, float* out, std::size_t n,
                        const ExpPolynomial& polynomial = softmax_exp_polynomial);

}  // namespace sharpcheck::kernels
