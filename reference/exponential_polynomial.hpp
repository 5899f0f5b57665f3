// Sums of exponentials with rational exponents and coefficients, sum_r c_r e^r, and the exact
// question the escapes' references ask of them: is a ratio of two such sums a rational number?
// By Lindemann-Weierstrass, e^r for distinct algebraic r are linearly independent over the
// algebraic numbers, so N / D = rho (rational) holds iff N - rho D has every grouped coefficient 0.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "core/rational.hpp"

namespace sharpcheck::reference {

class ExponentialPolynomial {
 public:
  void add(const Rational& exponent, const Rational& coefficient) {
    terms_.emplace_back(exponent, coefficient);
  }
  // Adds every term of `other` times `factor`.
  void add_scaled(const ExponentialPolynomial& other, const Rational& factor);
  // Equal exponents grouped (exactly), zero coefficients dropped, exponents increasing.
  void normalise();
  [[nodiscard]] const std::vector<std::pair<Rational, Rational>>& terms() const { return terms_; }

 private:
  std::vector<std::pair<Rational, Rational>> terms_;  // (exponent, coefficient)
};

// numerator / denominator when it is rational, else nullopt (then it is irrational: the argument
// above). Both are normalised first; a denominator that groups to 0 gives nullopt.
[[nodiscard]] std::optional<Rational> rational_ratio(ExponentialPolynomial numerator,
                                                     ExponentialPolynomial denominator);

}  // namespace sharpcheck::reference
