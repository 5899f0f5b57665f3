#include "reference/exponential_polynomial.hpp"

#include <algorithm>

namespace sharpcheck::reference {

void ExponentialPolynomial::add_scaled(const ExponentialPolynomial& other, const Rational& factor) {
  for (const auto& [exponent, coefficient] : other.terms_) {
    Rational scaled;
    mpq_mul(scaled.get(), coefficient.get(), factor.get());
    terms_.emplace_back(exponent, scaled);
  }
}

void ExponentialPolynomial::normalise() {
  std::sort(terms_.begin(), terms_.end(),
            [](const auto& a, const auto& b) { return mpq_cmp(a.first.get(), b.first.get()) < 0; });
  std::vector<std::pair<Rational, Rational>> grouped;
  for (auto& term : terms_) {
    if (!grouped.empty() && mpq_equal(grouped.back().first.get(), term.first.get()) != 0) {
      mpq_add(grouped.back().second.get(), grouped.back().second.get(), term.second.get());
    } else {
      grouped.push_back(std::move(term));
    }
  }
  std::erase_if(grouped, [](const auto& term) { return mpq_sgn(term.second.get()) == 0; });
  terms_ = std::move(grouped);
}

std::optional<Rational> rational_ratio(ExponentialPolynomial numerator, ExponentialPolynomial denominator) {
  numerator.normalise();
  denominator.normalise();
  const auto& n = numerator.terms();
  const auto& d = denominator.terms();
  if (d.empty()) return std::nullopt;
  // Both sorted by exponent: walk them together. Each exponent of either sum needs the numerator's
  // coefficient to be rho times the denominator's (0 where a sum lacks the exponent); rho is fixed
  // by the denominator's first exponent.
  std::optional<Rational> rho;
  std::size_t a = 0, b = 0;
  while (a < n.size() || b < d.size()) {
    const int order = a == n.size() ? 1 : b == d.size() ? -1 : mpq_cmp(n[a].first.get(), d[b].first.get());
    if (order < 0) return std::nullopt;  // a numerator exponent the denominator lacks
    const Rational numerator_coefficient = order == 0 ? n[a].second : Rational(0.0);
    if (!rho) {
      rho.emplace();
      mpq_div(rho->get(), numerator_coefficient.get(), d[b].second.get());
    } else {
      Rational expected;
      mpq_mul(expected.get(), rho->get(), d[b].second.get());
      if (mpq_equal(expected.get(), numerator_coefficient.get()) == 0) return std::nullopt;
    }
    if (order == 0) ++a;
    ++b;
  }
  return rho;
}

}  // namespace sharpcheck::reference
