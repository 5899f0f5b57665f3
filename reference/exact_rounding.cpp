#include "reference/exact_rounding.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/mpfr_number.hpp"

namespace sharpcheck::reference {

std::optional<double> decided_rounding(double low, double high, int low_sign, int high_sign) {
  // Both ends round to a zero: the value is a zero of the format. Its sign is claimed only where
  // the enclosure lies below 0 (a straddling enclosure gives +0: refining it could refuse a value
  // such as an underflowing entropy whose enclosure always straddles).
  if (low == 0 && high == 0) return low_sign < 0 && high_sign < 0 ? -0.0 : 0.0;
  if (std::isnan(low) || std::isnan(high)) {
    if (std::isnan(low) && std::isnan(high) && low_sign == high_sign && low_sign != 0) return low;
    return std::nullopt;
  }
  if (std::bit_cast<std::uint64_t>(low) != std::bit_cast<std::uint64_t>(high)) return std::nullopt;
  return low;
}

std::optional<double> round_if_decided(mpfr_srcptr lo, mpfr_srcptr hi, const FloatFormat& format) {
  if (mpfr_nan_p(lo) != 0 || mpfr_nan_p(hi) != 0) {  // a NaN input: NaN is the answer
    return std::numeric_limits<double>::quiet_NaN();
  }
  return decided_rounding(round_to_format(lo, format), round_to_format(hi, format), mpfr_sgn(lo),
                          mpfr_sgn(hi));
}

namespace {

// Every value of the format and every midpoint between two neighbours (the rounding boundaries)
// has at most precision + 1 significant bits. Given the quotient rounded toward zero to
// precision + 2 bits and its ternary value: if exact, round it; if not, the true quotient lies
// strictly between q and its neighbour away from zero, an interval holding no boundary in its
// interior, so its midpoint rounds exactly as the quotient does.
double round_truncated_quotient(mpfr_srcptr quotient, int ternary, const FloatFormat& format) {
  if (ternary == 0) return round_to_format(quotient, format);
  const mpfr_prec_t precision = mpfr_get_prec(quotient);
  MpfrNumber neighbour(precision);
  mpfr_set(neighbour.get(), quotient, MPFR_RNDN);
  if (mpfr_sgn(quotient) > 0) {
    mpfr_nextabove(neighbour.get());
  } else {
    mpfr_nextbelow(neighbour.get());
  }
  MpfrNumber midpoint(precision + 1);
  mpfr_add(midpoint.get(), quotient, neighbour.get(), MPFR_RNDN);  // exact in precision + 1 bits
  mpfr_div_2ui(midpoint.get(), midpoint.get(), 1, MPFR_RNDN);
  return round_to_format(midpoint.get(), format);
}

}  // namespace

double round_exact_quotient(mpfr_srcptr numerator, std::uint64_t denominator, const FloatFormat& format) {
  MpfrNumber quotient(format.precision() + 2);
  const int ternary = mpfr_div_ui(quotient.get(), numerator, denominator, MPFR_RNDZ);
  return round_truncated_quotient(quotient.get(), ternary, format);
}

double round_exact_ratio(mpz_srcptr numerator, mpz_srcptr denominator, const FloatFormat& format) {
  const auto bits = [](mpz_srcptr value) {
    return static_cast<mpfr_prec_t>(std::max<std::size_t>(mpz_sizeinbase(value, 2), 2));
  };
  MpfrNumber top(bits(numerator));
  MpfrNumber bottom(bits(denominator));
  mpfr_set_z(top.get(), numerator, MPFR_RNDN);  // exact: precision holds every bit
  mpfr_set_z(bottom.get(), denominator, MPFR_RNDN);
  MpfrNumber quotient(format.precision() + 2);
  const int ternary = mpfr_div(quotient.get(), top.get(), bottom.get(), MPFR_RNDZ);
  return round_truncated_quotient(quotient.get(), ternary, format);
}

ZivSchedule ZivSchedule::for_format(const FloatFormat& format) {
  return ZivSchedule{std::max<mpfr_prec_t>(64, format.precision() + 40)};
}

std::optional<double> round_near_boundary(mpq_srcptr r, int side, double log_delta,
                                          const FloatFormat& target) {
  const double nearest = round_exact_ratio(mpq_numref(r), mpq_denref(r), target);
  if (!std::isfinite(nearest)) return std::nullopt;
  mpq_t at, midpoint;
  mpq_inits(at, midpoint, static_cast<mpq_ptr>(nullptr));
  mpq_set_d(at, nearest);
  const int where = mpq_cmp(r, at);
  const double other = where > 0 ? next_up(nearest, target) : next_down(nearest, target);
  std::optional<double> rounded;
  if (std::isfinite(other) && log_delta < std::log(std::fabs(other - nearest) / 4)) {
    if (where == 0) {  // representable: the other side's spacing may be the smaller one
      const double below = next_down(nearest, target), above = next_up(nearest, target);
      if (log_delta < std::log(std::min(nearest - below, above - nearest) / 4))
        rounded = nearest == 0 ? std::copysign(0.0, side) : nearest;
    } else {
      mpq_set_d(midpoint, other);
      mpq_add(midpoint, midpoint, at);
      mpq_div_2exp(midpoint, midpoint, 1);
      if (mpq_cmp(r, midpoint) == 0) rounded = side > 0 ? std::max(nearest, other) : std::min(nearest, other);
    }
  }
  mpq_clears(at, midpoint, static_cast<mpq_ptr>(nullptr));
  return rounded;
}

}  // namespace sharpcheck::reference
