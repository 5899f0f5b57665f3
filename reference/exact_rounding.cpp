#include "reference/exact_rounding.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>

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

int end_sign(mpfr_srcptr end) {
  if (mpfr_sgn(end) != 0) return mpfr_sgn(end);
  // An end below MPFR's exponent range rounds to a zero of its own sign (a lower end toward -inf
  // gives -min; an upper end of a negative value toward +inf gives -0): -0 is an end below 0.
  return mpfr_signbit(end) != 0 ? -1 : 0;
}

std::optional<double> round_if_decided(mpfr_srcptr lo, mpfr_srcptr hi, const FloatFormat& format) {
  if (mpfr_nan_p(lo) != 0 || mpfr_nan_p(hi) != 0) {  // a NaN input: NaN is the answer
    return std::numeric_limits<double>::quiet_NaN();
  }
  return decided_rounding(round_to_format(lo, format), round_to_format(hi, format), end_sign(lo),
                          end_sign(hi));
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

double gap_in_z(double top, double other, double theta) {
  MpfrNumber difference(64), magnitude(64);
  mpfr_set_d(magnitude.get(), std::abs(theta), MPFR_RNDN);  // exact
  mpfr_set_d(difference.get(), top, MPFR_RNDN);             // exact
  mpfr_sub_d(difference.get(), difference.get(), other, MPFR_RNDZ);
  mpfr_abs(difference.get(), difference.get(), MPFR_RNDN);
  mpfr_div(difference.get(), difference.get(), magnitude.get(), MPFR_RNDZ);
  return mpfr_get_d(difference.get(), MPFR_RNDZ);
}

ZivSchedule ZivSchedule::for_format(const FloatFormat& format) {
  return ZivSchedule{std::max<mpfr_prec_t>(64, format.precision() + 40)};
}

namespace {

// ln(spacing / 4) without forming spacing / 4, which underflows double for fp64's subnormals
// (2^-1076): log(0) = -inf decided nothing there.
double log_quarter(double spacing) { return std::log(spacing) - 2 * std::numbers::ln2; }

// round_near_boundary where |r| reaches the overflow threshold T = max + half the spacing below
// max (|x| >= T overflows: to infinity, or to NaN in e4m3). At |r| = T, r + delta overflows when
// delta points away from 0 and rounds to +-max otherwise; beyond T it overflows while |delta| is
// below |r| - T.
std::optional<double> round_near_overflow(mpq_srcptr r, int side, double log_delta,
                                          const FloatFormat& target) {
  const double top = target.max_finite, step = top - next_down(top, target);
  const int sign = mpq_sgn(r);
  if (target.overflow == OverflowBehaviour::saturate) return std::nullopt;  // never past max: no threshold
  const double overflow = target.has_infinity() ? sign * std::numeric_limits<double>::infinity()
                                                : std::numeric_limits<double>::quiet_NaN();
  mpq_t threshold, excess;
  mpq_inits(threshold, excess, static_cast<mpq_ptr>(nullptr));
  mpq_set_d(threshold, top);
  mpq_set_d(excess, step / 2);  // a power of two: exact
  mpq_add(threshold, threshold, excess);
  mpq_abs(excess, r);
  mpq_sub(excess, excess, threshold);
  std::optional<double> rounded;
  if (mpq_sgn(excess) > 0 && log_delta < std::log(mpq_get_d(excess))) rounded = overflow;
  if (mpq_sgn(excess) == 0 && log_delta < log_quarter(step)) rounded = side == sign ? overflow : sign * top;
  mpq_clears(threshold, excess, static_cast<mpq_ptr>(nullptr));
  return rounded;
}

}  // namespace

std::optional<double> round_near_boundary(mpq_srcptr r, int side, double log_delta,
                                          const FloatFormat& target) {
  mpq_t at, midpoint;
  mpq_inits(at, midpoint, static_cast<mpq_ptr>(nullptr));
  mpq_set_d(at, target.max_finite);
  mpq_abs(midpoint, r);
  const bool past_top = mpq_cmp(midpoint, at) > 0;
  mpq_clears(at, midpoint, static_cast<mpq_ptr>(nullptr));
  if (past_top) {  // between max and the threshold nothing is a boundary: the loop decides it
    const auto overflowing = round_near_overflow(r, side, log_delta, target);
    if (overflowing) return overflowing;
  }
  const double nearest = round_exact_ratio(mpq_numref(r), mpq_denref(r), target);
  if (!std::isfinite(nearest)) return std::nullopt;
  mpq_inits(at, midpoint, static_cast<mpq_ptr>(nullptr));
  mpq_set_d(at, nearest);
  const int where = mpq_cmp(r, at);
  const double other = where > 0 ? next_up(nearest, target) : next_down(nearest, target);
  std::optional<double> rounded;
  if (std::isfinite(other) && log_delta < log_quarter(std::fabs(other - nearest))) {
    if (where == 0) {  // representable: the other side's spacing may be the smaller one
      const double below = next_down(nearest, target), above = next_up(nearest, target);
      if (log_delta < log_quarter(std::min(nearest - below, above - nearest)))
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
