// The largest attention logit, correctly rounded (reference/max_logit.hpp).
#include "reference/max_logit.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/mpfr_number.hpp"
#include "core/rational.hpp"
#include "reference/attention_row.hpp"
#include "reference/exact_rounding.hpp"
#include "reference/ziv_loop.hpp"

namespace sharpcheck::reference {
namespace {

constexpr double minus_infinity = -std::numeric_limits<double>::infinity();

// The score in double and a bound on its error: the products and the naive sum carry at most
// gamma_d sum |q k| (any order; u = 2^-53), the scale (1/sqrt(d): the root and the quotient round)
// two more u and the product one, so gamma_{d+3} sum |q k| |scale| bounds it, and the bound's own
// roundings (a few u of it) are covered by the factors (1 + 2^-40); 2^-1000 covers underflow of the
// products (inputs are values of formats far above it). A score that overflows double has no
// estimate (NaN or infinite): it is always rounded exactly.
struct Estimate {
  double score = 0, error = 0;
};
Estimate estimate(std::span<const double> q, std::span<const double> k, double scale) {
  double dot = 0, magnitude = 0;
  for (std::size_t t = 0; t < q.size(); ++t) {
    dot += q[t] * k[t];
    magnitude += std::abs(q[t] * k[t]);
  }
  const double nu = static_cast<double>(q.size() + 3) * 0x1p-53;
  const double gamma = nu / (1 - nu) * (1 + 0x1p-40);
  return {dot * scale, gamma * magnitude * (1 + 0x1p-40) * std::abs(scale) * (1 + 0x1p-40) + 0x1p-1000};
}

double scale_of(const tensor::HeadScores& head, std::size_t dim) {
  return head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

}  // namespace

double rounded_score(std::span<const double> query, std::span<const double> key,
                     const tensor::HeadScores& head, const FloatFormat& target) {
  Rational dot = exact_dot(query, key);
  if (const std::optional<Rational> scale = rational_scale(head, query.size())) {
    mpq_mul(dot.get(), dot.get(), scale->get());
    return round_exact_ratio(mpq_numref(dot.get()), mpq_denref(dot.get()), target);
  }
  const int sign = mpq_sgn(dot.get());
  if (sign == 0) return 0.0;
  Rational square;  // dot^2 / d: its square root is |dot| / sqrt(d), irrational (d is no square)
  mpq_mul(square.get(), dot.get(), dot.get());
  Rational dim;
  mpq_set_ui(dim.get(), static_cast<unsigned long>(query.size()), 1);
  mpq_div(square.get(), square.get(), dim.get());
  double result = 0;
  run_ziv_passes(
      ZivSchedule::for_format(target), 16, nullptr,
      [&](mpfr_prec_t precision) {
        MpfrNumber low(precision), high(precision);
        mpfr_set_q(low.get(), square.get(), MPFR_RNDD);
        mpfr_set_q(high.get(), square.get(), MPFR_RNDU);
        mpfr_sqrt(low.get(), low.get(), MPFR_RNDD);
        mpfr_sqrt(high.get(), high.get(), MPFR_RNDU);
        if (sign < 0) {
          mpfr_neg(low.get(), low.get(), MPFR_RNDN);  // exact
          mpfr_neg(high.get(), high.get(), MPFR_RNDN);
          mpfr_swap(low.get(), high.get());
        }
        const std::optional<double> decided = round_if_decided(low.get(), high.get(), target);
        if (decided) result = *decided;
        return decided.has_value();
      },
      [] { return "a max logit"; });
  return result;
}

double max_logit(const Matrix& queries, const Matrix& keys, const tensor::HeadScores& head,
                 const FloatFormat& target) {
  const double scale = scale_of(head, queries.cols);
  const std::size_t rows = head.queries != 0 ? head.queries : queries.rows;
  std::vector<std::size_t> seen;
  double floor = minus_infinity;  // the largest lower end of an enclosure
  for (std::size_t i = 0; i < rows; ++i) {
    head.visible_keys(i, seen);
    for (const std::size_t j : seen) {
      const Estimate e = estimate(queries.row(i), keys.row(j), scale);
      if (std::isfinite(e.score - e.error)) floor = std::max(floor, e.score - e.error);
    }
  }
  double best = minus_infinity;
  for (std::size_t i = 0; i < rows; ++i) {
    head.visible_keys(i, seen);
    for (const std::size_t j : seen) {
      const Estimate e = estimate(queries.row(i), keys.row(j), scale);
      if (!(e.score + e.error < floor))  // NaN (no estimate) included
        best = std::max(best, rounded_score(queries.row(i), keys.row(j), head, target));
    }
  }
  return best;
}

}  // namespace sharpcheck::reference
