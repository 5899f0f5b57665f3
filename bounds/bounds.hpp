// The paper's bounds and their tight forms as rigorous numbers: computed in MPFR or Arb and
// rounded outward (an upper bound rounded up, a lower bound rounded down), never understated.
//
// Notation: a row of n logits with spread delta = max e - min e >= 0, temperature theta > 0.
// Every function rejects n < 1, delta < 0 or non-finite, theta <= 0 or non-finite, and eps
// outside (0, 1] with an InputError naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::bounds {

// A rigorous enclosure [lower, upper] of a real quantity, as doubles.
struct Enclosure {
  double lower = 0;
  double upper = 0;
};

// Lemma 2.1 as stated: (1/n) exp(-delta/theta) <= every coefficient <= (1/n) exp(delta/theta).
// Returns [that lower bound rounded down, that upper bound rounded up].
[[nodiscard]] Enclosure lemma_2_1(double n, double delta, double theta);

// The tight forms, both attained: the largest coefficient any such row can have is
// 1/(1 + (n-1) exp(-delta/theta)) (one logit at the max, the rest at the min) and the smallest
// is 1/(1 + (n-1) exp(delta/theta)) (the mirror row). Rounded up and down respectively.
[[nodiscard]] double tight_largest_coefficient(double n, double delta, double theta);
[[nodiscard]] double tight_smallest_coefficient(double n, double delta, double theta);

// Theorem 2.2. Paper form: every coefficient is below eps once n > exp(delta/theta)/eps; this
// returns that threshold rounded up. Exact form: the smallest integer n at which the tight
// largest coefficient is below eps, i.e. floor(1 + (1/eps - 1) exp(delta/theta)) + 1.
[[nodiscard]] double theorem_2_2_threshold(double delta, double theta, double eps);
[[nodiscard]] std::uint64_t smallest_n_below(double delta, double theta, double eps);

// H >= log n - delta/theta (from H >= -log max p and Lemma 2.1), rounded down. May be negative,
// in which case it says nothing beyond H >= 0.
[[nodiscard]] double entropy_lower_bound(double n, double delta, double theta);

// Proposition 3.1 for logits e_i = (Q y) . (K x_i): Q is dq x d, K is dk x d (dq == dk), y has d
// entries (a 1 x d matrix), the x_i are the rows of X (n x d).
struct Proposition31 {
  double sigma_q = 0;       // certified upper bound on sigma_max(Q)
  double sigma_k = 0;       // certified upper bound on sigma_max(K)
  double norm_y = 0;        // ||y||, rounded up
  double max_norm_x = 0;    // max_i ||x_i||, rounded up
  double bound = 0;         // 2 sigma_q sigma_k ||y|| max ||x_i||, rounded up
  Enclosure actual_spread;  // the spread of the given logits, enclosed
  std::string certificate;  // how sigma_max was certified
};
[[nodiscard]] Proposition31 proposition_3_1(const Matrix& q, const Matrix& k, const Matrix& y,
                                            const Matrix& x);

// A certified upper bound on the largest singular value of A: an Eigen SVD estimate s, enlarged
// slightly, is accepted when Arb's ball Cholesky proves s^2 I - A^T A positive definite; if it
// cannot, the bound falls back to sqrt(||A||_1 ||A||_inf) (always valid, looser).
[[nodiscard]] double certified_sigma_max(const Matrix& a, std::string* certificate = nullptr);

// Precision horizons of a format F, for rows of spread delta at temperature theta.
//  Underflow horizon: the smallest n at which even the largest coefficient any row can have,
//    1/(1 + (n-1) exp(-delta/theta)), rounds to zero in F, i.e. is at most half of F's smallest
//    positive value (a tie rounds to the even zero). Beyond it a sharp row is all zeros in F.
//  Accumulation horizon: the smallest n at which adding one more term 1 (what a uniform row
//    contributes after the max shift) to the running sum of the n-1 before it, held in F and
//    rounded to nearest even, leaves the sum unchanged: 2^p + 1 for precision p (bf16: 257).
// The underflow horizon can exceed 2^53; it is returned as an enclosure whose ends are equal
// when the integer is known exactly.
[[nodiscard]] Enclosure underflow_horizon(double delta, double theta, double half_smallest_positive);
[[nodiscard]] Enclosure underflow_horizon(double delta, double theta, const FloatFormat& format);
[[nodiscard]] std::uint64_t accumulation_horizon(const FloatFormat& format);

// The paper's adaptive temperature: beta(H) = max(poly(H), 1) for H > 0.5, else 1, with
// poly(H) = -0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791 (coefficients taken exactly).
// beta > 1 exactly for H strictly between the two roots of poly(H) = 1; the enclosures of those
// roots are certified by sign changes in interval arithmetic.
[[nodiscard]] double adaptive_polynomial(double entropy);  // in double, Horner's rule as jnp.polyval
[[nodiscard]] double adaptive_beta(double entropy);
struct ActiveInterval {
  Enclosure lower_root;  // about 0.8486
  Enclosure upper_root;  // about 5.9445
};
[[nodiscard]] ActiveInterval adaptive_active_interval();

}  // namespace sharpcheck::bounds
