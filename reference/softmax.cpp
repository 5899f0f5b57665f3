#include "reference/softmax.hpp"

#include <gmp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <string>

#include "core/mpfr_number.hpp"
#include "reference/ball_stage.hpp"
#include "reference/double_stage.hpp"
#include "reference/input_checks.hpp"
#include "reference/ziv_loop.hpp"

// Termination of the Ziv loops (why the reference never spins forever).
//
// Lindemann-Weierstrass: for distinct algebraic a_1..a_k, exp(a_1)..exp(a_k) are linearly
// independent over the algebraic numbers. With z_j = e_j / theta rational and distinct values
// grouped (value a_g, multiplicity c_g), a softmax coefficient p = exp(a_g) / sum_h c_h exp(a_h)
// equal to a rational r would give (1 - r c_g) exp(a_g) - sum_{h != g} r c_h exp(a_h) = 0, so
// every coefficient vanishes: with a second distinct value r = 0, and then 1 = 0. Hence p is
// irrational unless all unmasked logits are equal, where p = 1/k exactly. An irrational number
// is neither a format value nor a rounding boundary, so shrinking enclosures eventually decide
// it; the all-equal case is detected up front and rounded exactly.
//   log_softmax: z_j - log S is rational only if S = exp(rational), which by the same argument
//     needs a single distinct value of multiplicity c with log c rational, i.e. k = 1 (result 0).
//   logsumexp: c + theta log S, rational only when k = 1 (result: the logit itself).
//   entropy: H = log S - sum p_j z_j. For k = 1 it is 0 and for all-equal logits log k (irrational
//     for k >= 2). For other rows, irrationality of H is not implied by Lindemann-Weierstrass
//     alone; the loop is capped (ZivSchedule::cap) and reports UndecidedRounding rather than
//     guess, which has not been observed.

namespace sharpcheck::reference {
namespace {

// Rigorous enclosures at one working precision, for the unmasked entries in order:
//   z_j in [z_lo, z_hi] with z_j = (e_j - shift) / theta <= 0,
//   w_j = exp(z_j) in [w_lo, w_hi], and S = sum_j w_j in [sum_lo, sum_hi] (S >= 1).
class ExponentialEnclosure {
 public:
  explicit ExponentialEnclosure(std::size_t count)
      : z_lo(count, 64),
        z_hi(count, 64),
        w_lo(count, 64),
        w_hi(count, 64),
        sum_lo(64),
        sum_hi(64),
        exact_(count, false) {}

  void compute(std::span<const double> logits, const PreparedRow& row, double theta, mpfr_prec_t precision) {
    z_lo.set_precision(precision);
    z_hi.set_precision(precision);
    w_lo.set_precision(precision);
    w_hi.set_precision(precision);
    mpfr_set_prec(sum_lo.get(), precision);
    mpfr_set_prec(sum_hi.get(), precision);
    for (std::size_t a = 0; a < row.active.size(); ++a) {
      enclose_logit(logits[row.active[a]], row.shift, theta, a);
      enclose_exponential(a);
    }
    const auto count = row.active.size();
    mpfr_sum(sum_lo.get(), w_lo.pointers(), count, MPFR_RNDD);
    mpfr_sum(sum_hi.get(), w_hi.pointers(), count, MPFR_RNDU);
  }

  MpfrArray z_lo, z_hi, w_lo, w_hi;
  MpfrNumber sum_lo, sum_hi;

 private:
  void enclose_logit(double logit, double shift, double theta, std::size_t a) {
    mpfr_ptr lo = z_lo[a];
    mpfr_ptr hi = z_hi[a];
    exact_[a] = true;
    mpfr_set_d(lo, logit, MPFR_RNDN);  // exact: precision >= 53
    if (mpfr_sub_d(lo, lo, shift, MPFR_RNDD) != 0) {
      exact_[a] = false;
      mpfr_set_d(hi, logit, MPFR_RNDN);
      mpfr_sub_d(hi, hi, shift, MPFR_RNDU);
    } else {
      mpfr_set(hi, lo, MPFR_RNDN);
    }
    if (theta == 1.0) return;
    // Dividing by a negative theta swaps which end is the lower bound.
    if (theta > 0) {
      const int low_ternary = mpfr_div_d(lo, lo, theta, MPFR_RNDD);
      const int high_ternary = mpfr_div_d(hi, hi, theta, MPFR_RNDU);
      exact_[a] = exact_[a] && low_ternary == 0 && high_ternary == 0;
    } else {
      mpfr_swap(lo, hi);
      const int low_ternary = mpfr_div_d(lo, lo, theta, MPFR_RNDD);
      const int high_ternary = mpfr_div_d(hi, hi, theta, MPFR_RNDU);
      exact_[a] = exact_[a] && low_ternary == 0 && high_ternary == 0;
    }
  }

  void enclose_exponential(std::size_t a) {
    if (exact_[a]) {
      // z is exact: one exp rounded to nearest, and its ternary value says on which side of
      // the result the true value lies (strictly, unless it is exact).
      const int ternary = mpfr_exp(w_lo[a], z_lo[a], MPFR_RNDN);
      mpfr_set(w_hi[a], w_lo[a], MPFR_RNDN);
      if (ternary > 0) mpfr_nextbelow(w_lo[a]);
      if (ternary < 0) mpfr_nextabove(w_hi[a]);
      return;
    }
    mpfr_exp(w_lo[a], z_lo[a], MPFR_RNDD);
    mpfr_exp(w_hi[a], z_hi[a], MPFR_RNDU);
  }

  std::vector<bool> exact_;  // z_lo == z_hi == z_j exactly
};

// Runs Ziv's loop: encloses at growing precision until `decide` reports every output decided.
template <typename Decide>
void run_ziv_loop(std::span<const double> logits, const PreparedRow& row, const FloatFormat& target,
                  const RowOptions& options, std::string_view operation, Decide&& decide) {
  const ZivSchedule schedule = ZivSchedule::for_format(target);
  ExponentialEnclosure enclosure(row.active.size());
  run_ziv_passes(
      schedule, 0, options.statistics,
      [&](mpfr_prec_t precision) {
        enclosure.compute(logits, row, options.theta, precision);
        return decide(enclosure, precision);
      },
      [&] { return std::string(operation) + ": rounding to " + std::string(target.name); });
}

void count_call(const RowOptions& options, bool exact) {
  if (options.statistics == nullptr) return;
  ++options.statistics->calls;
  if (exact) ++options.statistics->exact_cases;
}

// One pass of an element-wise Ziv loop: for each unmasked element not yet decided, `enclose`
// writes its enclosure into [lo, hi]; decided elements are rounded into result. True when all are.
template <typename Enclose>
bool decide_elements(const PreparedRow& row, const FloatFormat& target, mpfr_prec_t precision,
                     std::vector<bool>& decided, std::vector<double>& result, Enclose&& enclose) {
  thread_local MpfrNumber lo(64);
  thread_local MpfrNumber hi(64);
  mpfr_set_prec(lo.get(), precision);
  mpfr_set_prec(hi.get(), precision);
  bool all_decided = true;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    if (decided[a]) continue;
    enclose(a, lo.get(), hi.get());
    if (const auto rounded = round_if_decided(lo.get(), hi.get(), target)) {
      result[row.active[a]] = *rounded;
      decided[a] = true;
    } else {
      all_decided = false;
    }
  }
  return all_decided;
}

// With two or more unmasked logits every log-softmax value is below 0 (S > exp(z_j) strictly), but
// the sum's lower end may have lost the other terms (1 + e^-200 rounds down to 1 at any precision
// below 290 bits), so the enclosure reaches 0 and its zero's sign would not be claimed: the exact
// value underflowing to -0 came out +0. Every value of [lo, 0) rounds as lo does when lo rounds to
// -0, so the enclosure is then narrowed to lo; otherwise it is left for Ziv's loop to refine.
void below_zero(mpfr_ptr lo, mpfr_ptr hi, const FloatFormat& target) {
  if (mpfr_sgn(hi) < 0 || mpfr_sgn(lo) >= 0) return;
  const double rounded = round_to_format(lo, target);
  if (rounded == 0 && std::signbit(rounded)) mpfr_set(hi, lo, MPFR_RNDN);
}

// log S in [log_lo, log_hi] from the sum's enclosure.
void enclose_log_sum(const ExponentialEnclosure& enclosure, mpfr_prec_t precision, MpfrNumber& log_lo,
                     MpfrNumber& log_hi) {
  mpfr_set_prec(log_lo.get(), precision);
  mpfr_set_prec(log_hi.get(), precision);
  mpfr_log(log_lo.get(), enclosure.sum_lo.get(), MPFR_RNDD);
  mpfr_log(log_hi.get(), enclosure.sum_hi.get(), MPFR_RNDU);
}

// How many unmasked logits equal the top one (row.shift), and a lower bound on the gap from it to
// the others in z = e / theta: |shift - e_j| / |theta| rounded toward zero in MPFR (a difference of
// doubles may overflow double while the true gap is small).
struct TopOfRow {
  std::size_t count = 0;
  double gap = INFINITY;
};

TopOfRow top_of_row(std::span<const double> logits, const PreparedRow& row, double theta) {
  TopOfRow top;
  std::optional<double> nearest;  // the other logit nearest the top (the least gap), compared exactly
  for (const std::size_t j : row.active) {
    if (logits[j] == row.shift) {
      ++top.count;
    } else if (!nearest || (theta > 0 ? logits[j] > *nearest : logits[j] < *nearest)) {
      nearest = logits[j];  // every other logit lies on one side of the top: the least gap is here
    }
  }
  if (nearest) top.gap = gap_in_z(row.shift, *nearest, theta);
  return top;
}

// ln of a bound on log S - log k_top <= T / k_top <= (n - 1) e^-gap for a row whose top logit is alone
// (k_top = 1: log(1 + T) <= T); ln 2 more covers these logarithms' own roundings.
double log_tail_bound(const PreparedRow& row, const TopOfRow& top) {
  return std::log(static_cast<double>(row.active.size())) - top.gap * (1 - 0x1p-40) + std::numbers::ln2;
}

// logsumexp = shift + theta log S. When the top logit is alone, S = 1 + T with 0 < T <= (n - 1)
// e^-gap, so the result is shift plus a tail of theta's sign and |theta| log(1 + T) <= |theta| T
// at most. Where shift is a rounding boundary of the target (a midpoint: 1 + 2^-8 in bf16) every
// enclosure holds it and no precision decides; the tail's side does (round_near_boundary, as
// log_softmax_backward's tails). Otherwise nothing (Ziv's loop).
std::optional<double> logsumexp_by_tail(std::span<const double> logits, const PreparedRow& row, double theta,
                                        const FloatFormat& target) {
  const TopOfRow top = top_of_row(logits, row, theta);
  if (top.count != 1) return std::nullopt;  // S >= 2: no small tail
  const double log_tail = std::log(std::abs(theta)) + log_tail_bound(row, top);
  mpq_t r;
  mpq_init(r);
  mpq_set_d(r, row.shift);
  const std::optional<double> rounded = round_near_boundary(r, theta > 0 ? 1 : -1, log_tail, target);
  mpq_clear(r);
  return rounded;
}

// log_softmax_j = (e_j - shift) / theta - log S. When the top logit is alone, log S = log(1 + T)
// is a tail below (n - 1) e^-gap, so the result is the rational r_j = (e_j - shift) / theta less
// that tail. Where r_j is a rounding boundary (logits 1e30 apart in fp64 make r_j a double's
// midpoint often) no enclosure decides; the tail's side (down) does. Decides what it can of the
// undecided entries; true when all are decided.
bool decide_log_softmax_by_tail(std::span<const double> logits, const PreparedRow& row, double theta,
                                const FloatFormat& target, std::vector<bool>& decided,
                                std::vector<double>& result) {
  const TopOfRow top = top_of_row(logits, row, theta);
  if (top.count != 1) return false;
  const double log_tail = log_tail_bound(row, top);
  mpq_t r, divisor;
  mpq_inits(r, divisor, static_cast<mpq_ptr>(nullptr));
  mpq_set_d(divisor, theta);
  bool all = true;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    if (decided[a]) continue;
    mpq_set_d(r, logits[row.active[a]]);
    mpq_set_d(divisor, row.shift);
    mpq_sub(r, r, divisor);  // exact
    mpq_set_d(divisor, theta);
    mpq_div(r, r, divisor);
    if (const auto rounded = round_near_boundary(r, -1, log_tail, target)) {
      result[row.active[a]] = *rounded;
      decided[a] = true;
    } else {
      all = false;
    }
  }
  mpq_clears(r, divisor, static_cast<mpq_ptr>(nullptr));
  return all;
}

}  // namespace

std::vector<double> softmax(std::span<const double> logits, const FloatFormat& target,
                            const RowOptions& options) {
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, "softmax");
  std::vector<double> result(logits.size(), 0.0);
  if (row.active.empty()) return result;
  if (row.all_equal) {  // the only rational case: exactly 1/k
    MpfrNumber one(64);
    mpfr_set_ui(one.get(), 1, MPFR_RNDN);
    const double coefficient = round_exact_quotient(one.get(), row.active.size(), target);
    for (const std::size_t index : row.active) result[index] = coefficient;
    count_call(options, true);
    return result;
  }
  std::vector<bool> decided(row.active.size(), false);
  count_call(options, false);
  if (!options.mpfr_only) {
    const std::size_t in_double =
        decide_softmax_in_double(logits, row, options.theta, target, result, decided);
    if (options.statistics != nullptr) options.statistics->decided_in_double += static_cast<long>(in_double);
    if (in_double == row.active.size()) return result;
    const std::size_t by_balls = decide_softmax_by_balls(logits, row, options.theta, target, result, decided);
    if (options.statistics != nullptr) options.statistics->decided_by_balls += static_cast<long>(by_balls);
    if (in_double + by_balls == row.active.size()) return result;
  }
  run_ziv_loop(logits, row, target, options, "softmax",
               [&](ExponentialEnclosure& enclosure, mpfr_prec_t precision) {
                 return decide_elements(row, target, precision, decided, result,
                                        [&](std::size_t a, mpfr_ptr lo, mpfr_ptr hi) {
                                          mpfr_div(lo, enclosure.w_lo[a], enclosure.sum_hi.get(), MPFR_RNDD);
                                          mpfr_div(hi, enclosure.w_hi[a], enclosure.sum_lo.get(), MPFR_RNDU);
                                        });
               });
  return result;
}

std::vector<double> softmax(std::span<const float> logits, const FloatFormat& target,
                            const RowOptions& options) {
  const std::vector<double> widened(logits.begin(), logits.end());
  return softmax(std::span<const double>(widened), target, options);
}

std::vector<double> log_softmax(std::span<const double> logits, const FloatFormat& target,
                                const RowOptions& options) {
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, "log_softmax");
  std::vector<double> result(logits.size(), -std::numeric_limits<double>::infinity());
  if (row.active.empty()) return result;
  if (row.active.size() == 1) {  // log 1 = 0, the only rational case
    result[row.active[0]] = 0.0;
    count_call(options, true);
    return result;
  }
  std::vector<bool> decided(row.active.size(), false);
  MpfrNumber log_lo(64);
  MpfrNumber log_hi(64);
  run_ziv_loop(logits, row, target, options, "log_softmax",
               [&](ExponentialEnclosure& enclosure, mpfr_prec_t precision) {
                 enclose_log_sum(enclosure, precision, log_lo, log_hi);
                 return decide_elements(row, target, precision, decided, result,
                                        [&](std::size_t a, mpfr_ptr lo, mpfr_ptr hi) {
                                          mpfr_sub(lo, enclosure.z_lo[a], log_hi.get(), MPFR_RNDD);
                                          mpfr_sub(hi, enclosure.z_hi[a], log_lo.get(), MPFR_RNDU);
                                          below_zero(lo, hi, target);
                                        }) ||
                        decide_log_softmax_by_tail(logits, row, options.theta, target, decided, result);
               });
  count_call(options, false);
  return result;
}

double logsumexp(std::span<const double> logits, const FloatFormat& target, const RowOptions& options) {
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, "logsumexp");
  if (row.active.empty()) return -std::numeric_limits<double>::infinity();
  if (row.active.size() == 1) {  // theta * log 1 + e = e, the only rational case
    count_call(options, true);
    return round_to_format(logits[row.active[0]], target);
  }
  if (const auto by_tail = logsumexp_by_tail(logits, row, options.theta, target)) {
    count_call(options, false);
    return *by_tail;
  }
  double result = 0.0;
  MpfrNumber log_lo(64);
  MpfrNumber log_hi(64);
  MpfrNumber lo(64);
  MpfrNumber hi(64);
  run_ziv_loop(logits, row, target, options, "logsumexp",
               [&](ExponentialEnclosure& enclosure, mpfr_prec_t precision) {
                 enclose_log_sum(enclosure, precision, log_lo, log_hi);
                 mpfr_set_prec(lo.get(), precision);
                 mpfr_set_prec(hi.get(), precision);
                 // theta * log S: a negative theta swaps the ends.
                 if (options.theta > 0) {
                   mpfr_mul_d(lo.get(), log_lo.get(), options.theta, MPFR_RNDD);
                   mpfr_mul_d(hi.get(), log_hi.get(), options.theta, MPFR_RNDU);
                 } else {
                   mpfr_mul_d(lo.get(), log_hi.get(), options.theta, MPFR_RNDD);
                   mpfr_mul_d(hi.get(), log_lo.get(), options.theta, MPFR_RNDU);
                 }
                 mpfr_add_d(lo.get(), lo.get(), row.shift, MPFR_RNDD);
                 mpfr_add_d(hi.get(), hi.get(), row.shift, MPFR_RNDU);
                 const auto rounded = round_if_decided(lo.get(), hi.get(), target);
                 if (rounded) result = *rounded;
                 return rounded.has_value();
               });
  count_call(options, false);
  return result;
}

double entropy(std::span<const double> logits, const FloatFormat& target, const RowOptions& options) {
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, "entropy");
  if (row.active.size() <= 1) {  // a single unmasked entry carries all the mass: H = 0
    count_call(options, true);
    return 0.0;
  }
  if (!options.mpfr_only) {
    if (const auto by_balls = decide_entropy_by_balls(logits, row, options.theta, target)) {
      count_call(options, false);
      if (options.statistics != nullptr) ++options.statistics->decided_by_balls;
      return *by_balls;
    }
  }
  double result = 0.0;
  const std::size_t count = row.active.size();
  MpfrArray products(count, 64);
  MpfrNumber log_lo(64);
  MpfrNumber log_hi(64);
  MpfrNumber lo(64);
  MpfrNumber hi(64);
  MpfrNumber scratch(64);
  run_ziv_loop(logits, row, target, options, "entropy",
               [&](ExponentialEnclosure& enclosure, mpfr_prec_t precision) {
                 // H = log S + U / S with U = -sum_j w_j z_j >= 0 (every z_j <= 0). For w >= 0 and z <= 0
                 // the product w z lies in [w_hi z_lo, w_lo z_hi].
                 enclose_log_sum(enclosure, precision, log_lo, log_hi);
                 products.set_precision(precision);
                 mpfr_set_prec(lo.get(), precision);
                 mpfr_set_prec(hi.get(), precision);
                 mpfr_set_prec(scratch.get(), precision);
                 for (std::size_t a = 0; a < count; ++a)
                   mpfr_mul(products[a], enclosure.w_lo[a], enclosure.z_hi[a], MPFR_RNDU);
                 mpfr_sum(scratch.get(), products.pointers(), count, MPFR_RNDU);
                 mpfr_neg(scratch.get(), scratch.get(), MPFR_RNDN);  // U_lo, exact negation
                 mpfr_div(lo.get(), scratch.get(), enclosure.sum_hi.get(), MPFR_RNDD);
                 mpfr_add(lo.get(), lo.get(), log_lo.get(), MPFR_RNDD);
                 for (std::size_t a = 0; a < count; ++a)
                   mpfr_mul(products[a], enclosure.w_hi[a], enclosure.z_lo[a], MPFR_RNDD);
                 mpfr_sum(scratch.get(), products.pointers(), count, MPFR_RNDD);
                 mpfr_neg(scratch.get(), scratch.get(), MPFR_RNDN);  // U_hi
                 mpfr_div(hi.get(), scratch.get(), enclosure.sum_lo.get(), MPFR_RNDU);
                 mpfr_add(hi.get(), hi.get(), log_hi.get(), MPFR_RNDU);
                 const auto rounded = round_if_decided(lo.get(), hi.get(), target);
                 if (rounded) result = *rounded;
                 return rounded.has_value();
               });
  count_call(options, false);
  return result;
}

}  // namespace sharpcheck::reference
