#include "reference/exact_rounding.hpp"

#include <algorithm>
#include <bit>

#include "core/mpfr_number.hpp"

namespace sharpcheck::reference {

std::optional<double> round_if_decided(mpfr_srcptr lo, mpfr_srcptr hi, const FloatFormat& format) {
  const double low = round_to_format(lo, format);
  const double high = round_to_format(hi, format);
  if (std::bit_cast<std::uint64_t>(low) != std::bit_cast<std::uint64_t>(high)) return std::nullopt;
  return low;
}

double round_exact_quotient(mpfr_srcptr numerator, std::uint64_t denominator, const FloatFormat& format) {
  // Every value of the format and every midpoint between two neighbours (the rounding
  // boundaries) has at most precision + 1 significant bits. Divide to precision + 2 bits toward
  // zero: if that is exact, round it; if not, the quotient lies strictly between q and its
  // neighbour away from zero, an interval holding no boundary in its interior, so its midpoint
  // rounds exactly as the quotient does.
  const mpfr_prec_t precision = format.precision() + 2;
  MpfrNumber quotient(precision);
  const int ternary = mpfr_div_ui(quotient.get(), numerator, denominator, MPFR_RNDZ);
  if (ternary == 0) return round_to_format(quotient.get(), format);
  MpfrNumber neighbour(precision);
  mpfr_set(neighbour.get(), quotient.get(), MPFR_RNDN);
  if (mpfr_sgn(quotient.get()) > 0) {
    mpfr_nextabove(neighbour.get());
  } else {
    mpfr_nextbelow(neighbour.get());
  }
  MpfrNumber midpoint(precision + 1);
  mpfr_add(midpoint.get(), quotient.get(), neighbour.get(), MPFR_RNDN);  // exact in precision + 1 bits
  mpfr_div_2ui(midpoint.get(), midpoint.get(), 1, MPFR_RNDN);
  return round_to_format(midpoint.get(), format);
}

ZivSchedule ZivSchedule::for_format(const FloatFormat& format) {
  return ZivSchedule{std::max<mpfr_prec_t>(64, format.precision() + 40)};
}

}  // namespace sharpcheck::reference
