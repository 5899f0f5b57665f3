// A dot product and its magnitude sum_t |q_t k_t| in double with eight partial sums each:
// independent chains the compiler can keep in registers and vectorise.
//
// Accuracy: blocked summation (eight lanes of ceil(d/8) terms, then a pairwise sum of the lanes)
// errs by at most gamma_{ceil(d/8) + 3} <= gamma_{d + 3} times the magnitude (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., section 3.1), the bound the double stage uses.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>

namespace sharpcheck::reference {

struct DotAndMagnitude {
  double dot;
  double magnitude;
};

inline DotAndMagnitude dot_and_magnitude(const double* q, const double* k, std::size_t d) {
  std::array<double, 8> dots{};
  std::array<double, 8> magnitudes{};
  std::size_t t = 0;
  for (; t + 8 <= d; t += 8) {
    for (std::size_t lane = 0; lane < 8; ++lane) {
      const double product = q[t + lane] * k[t + lane];
      dots[lane] += product;
      magnitudes[lane] += std::fabs(product);
    }
  }
  for (std::size_t lane = 0; t < d; ++t, ++lane) {
    const double product = q[t] * k[t];
    dots[lane] += product;
    magnitudes[lane] += std::fabs(product);
  }
  const auto pairwise8 = [](const std::array<double, 8>& x) {
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
  };
  return {pairwise8(dots), pairwise8(magnitudes)};
}

}  // namespace sharpcheck::reference
