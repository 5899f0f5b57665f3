// The two ways the reference turns real numbers into correctly rounded format values:
// an enclosure [lo, hi] that rounding decides (the Ziv test), and an exactly known quotient.
#pragma once

#include <gmp.h>
#include <mpfr.h>

#include <cstdint>
#include <optional>

#include "formats/float_format.hpp"

namespace sharpcheck::reference {

// Ziv's test. If every real in [lo, hi] rounds to the same value of the format, returns it;
// otherwise nullopt (the enclosure straddles a rounding boundary and must be narrowed).
// Rounding to nearest is monotone, so it suffices that lo and hi round to the same bits.
[[nodiscard]] std::optional<double> round_if_decided(mpfr_srcptr lo, mpfr_srcptr hi,
                                                     const FloatFormat& format);

// The sign of an enclosure's end, -0 counting as below 0: an end beyond MPFR's exponent range
// (e^-1e30 and smaller, as Arb carries them) comes out as a zero of its own sign.
[[nodiscard]] int end_sign(mpfr_srcptr end);

// What an enclosure decides, given its ends' roundings (low, high) and their signs (-1, 0, +1).
// Equal bits are not enough: a format whose overflow is NaN (fp8 e4m3) rounds both ends of an
// enclosure reaching past -max and +max to the same NaN although finite values lie between, and
// -0 and +0 compare equal as floats. So: a common finite value; a zero when both ends round to
// one (-0 when the whole enclosure is below 0, else +0: a straddling zero's sign is not claimed); the
// overflow value only when both ends lie on one side; nullopt for anything else.
[[nodiscard]] std::optional<double> decided_rounding(double low, double high, int low_sign, int high_sign);

// Correct rounding of numerator / denominator, where numerator is an exact MPFR value and the
// denominator a positive integer. Handles quotients that are exactly a rounding boundary.
[[nodiscard]] double round_exact_quotient(mpfr_srcptr numerator, std::uint64_t denominator,
                                          const FloatFormat& format);
// The same for a ratio of two integers (denominator positive), of any size.
[[nodiscard]] double round_exact_ratio(mpz_srcptr numerator, mpz_srcptr denominator,
                                       const FloatFormat& format);

// The rounding of r + delta, where r is rational and delta a real of sign `side` (+1 or -1) with
// ln |delta| <= log_delta: an exponentially small tail (weights of e^-1e9) that no Ziv precision
// separates from r. If r is a representable value or a midpoint of the target and |delta| is below
// a quarter of the spacing there, it is r itself (a zero signed by `side`, the exact result's sign)
// or the neighbour on delta's side of the midpoint; nullopt otherwise (r is neither, and Ziv's loop
// decides it, or |delta| may be larger).
[[nodiscard]] std::optional<double> round_near_boundary(mpq_srcptr r, int side, double log_delta,
                                                        const FloatFormat& target);

// A lower bound on |top - other| / |theta| (logits' gap in z = e / theta), rounded toward zero in
// MPFR: a difference of doubles may overflow double while the true gap is small. For the tail rules.
[[nodiscard]] double gap_in_z(double top, double other, double theta);

// Working precisions of the Ziv loops: start near the target's precision plus guard bits,
// grow geometrically, and stop at a cap beyond which the reference reports UndecidedRounding.
struct ZivSchedule {
  mpfr_prec_t initial;
  mpfr_prec_t cap = 1 << 17;
  [[nodiscard]] static ZivSchedule for_format(const FloatFormat& format);
  [[nodiscard]] static mpfr_prec_t next(mpfr_prec_t precision) { return precision * 2; }
};

// What a reference call did, for tests and benchmarks that check the loop's behaviour.
struct ZivStatistics {
  long calls = 0;
  long escalations = 0;        // precision increases past the initial one
  long exact_cases = 0;        // results decided by the exact (rational) branch
  long decided_in_double = 0;  // results the certified double stage decided (softmax, <= 24-bit targets)
  long decided_by_balls = 0;   // results the Arb stage decided (the rest went to the MPFR loop)
  mpfr_prec_t highest_precision = 0;
  // Adds another call's counts (work split over threads or heads).
  void merge(const ZivStatistics& other) {
    calls += other.calls;
    escalations += other.escalations;
    exact_cases += other.exact_cases;
    decided_in_double += other.decided_in_double;
    decided_by_balls += other.decided_by_balls;
    if (other.highest_precision > highest_precision) highest_precision = other.highest_precision;
  }
};

}  // namespace sharpcheck::reference
