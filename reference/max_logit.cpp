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

// A bound on a score's error in double: the products and the naive sum carry at most
// gamma_d sum |q k| (any order; u = 2^-53), the scale (1/sqrt(d): the root and the quotient round)
// two more u and the product one, so gamma_{d+3} sum |q k| |scale| bounds it, and the bound's own
// roundings (a few u of it) are covered by the factors (1 + 2^-40); 2^-1000 covers underflow of the
// products (inputs are values of formats far above it). A score that overflows double has no
// estimate (NaN or infinite): it is always rounded exactly.
double error_of(double magnitude, std::size_t dim, double scale) {
  const double nu = static_cast<double>(dim + 3) * 0x1p-53;
  const double gamma = nu / (1 - nu) * (1 + 0x1p-40);
  return gamma * magnitude * (1 + 0x1p-40) * std::abs(scale) * (1 + 0x1p-40) + 0x1p-1000;
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
  const double scale = scale_in_double(head, queries.cols);
  double floor = minus_infinity;  // the largest lower end of an enclosure
  for_each_visible_score(queries, keys, head, [&](std::size_t, std::size_t, double score, double magnitude) {
    const double low = score - error_of(magnitude, queries.cols, scale);
    if (std::isfinite(low)) floor = std::max(floor, low);
  });
  double best = minus_infinity;
  for_each_visible_score(
      queries, keys, head, [&](std::size_t i, std::size_t j, double score, double magnitude) {
        if (!(score + error_of(magnitude, queries.cols, scale) < floor))  // NaN (no estimate) included
          best = std::max(best, rounded_score(queries.row(i), keys.row(j), head, target));
      });
  return best;
}

}  // namespace sharpcheck::reference
