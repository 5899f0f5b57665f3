#include "reference/dispersion_escapes.hpp"

#include <arb.h>
#include <gmp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <string>

#include "core/mpfr_number.hpp"
#include "core/rational.hpp"
#include "reference/ball_stage.hpp"
#include "reference/exact_rounding.hpp"
#include "reference/input_checks.hpp"
#include "reference/ziv_loop.hpp"

// Termination of the Ziv loops. z_j = e_j / theta is rational (doubles are dyadic rationals).
//
// Sigmoid: sigma(x) = 1 / (1 + exp(-x)) is rational iff exp(-x) is, which for rational x needs
//   x = 0 (Lindemann). With a given bias b (a double) x = z + b is rational: the exact case is
//   z = -b, giving 1/2. With b = -ln n (n >= 2), sigma = 1 / (1 + n exp(-z)) is rational iff z = 0,
//   giving 1 / (n + 1). Both are rounded exactly; every other weight is irrational.
// Stick-breaking: 1 / A_j = (1 + exp(-z_j)) prod_{k > j} (1 + exp(z_k)) expands into a sum of
//   exp(sum of a subset of the exponents) with positive integer coefficients once equal exponent
//   sums are grouped. By Lindemann-Weierstrass it is rational only if every such sum is 0, i.e.
//   z_j = 0 and every later unmasked z_k = 0, where A_j = 2^-(m + 1) exactly (m later keys).
// SSMax: the weights are n^(x_j) with x_j = s (e_j - m) rational. Write n = r^g, r not a perfect
//   power, and g x_j = A_j / Q. y = r^(1/Q) has minimal polynomial t^Q - r (Capelli's theorem:
//   r > 1 is no p-th power), so 1, y, ..., y^(Q-1) are linearly independent over the rationals.
//   Splitting A_j = Q q_j + rho_j, a coefficient r^(q_j) y^(rho_j) / sum_i r^(q_i) y^(rho_i) is
//   rational only if every rho_i equals rho_j, and the largest entry has A = 0: so only if every
//   g x_j is an integer. Then the coefficients are ratios of integers, computed exactly.
// Adaptive temperature: with beta = 1 (H <= 0.5 or poly(H) <= 1) the result is softmax(z), whose
//   termination softmax.cpp proves. With beta = poly(H) > 1 nothing is known of beta's kind as a
//   number, so the argument fails; the loop is capped.
// Length-scaled logits: with f = 1 this is softmax. With f = ln n / ln L rational (n and L powers
//   of one integer) it is softmax at a rational temperature: Lindemann-Weierstrass again. With f
//   irrational (then transcendental, by Gelfond-Schneider) the argument fails; the loop is capped.

namespace sharpcheck::reference {
namespace {

// Outputs indexed by "slots" (distinct values, or entries for stick-breaking), decided by Ziv's
// strategy over balls at growing precision. Slots decided up front (exact cases) are skipped.
class BallZiv {
 public:
  // `enclose(precision, decided, balls)` writes balls[s] for every slot s not yet decided.
  using Encloser = std::function<void(slong, const std::vector<bool>&, BallVector&)>;
  // Tried once, when the first pass leaves slots undecided: decides every remaining slot exactly
  // and returns true, or returns false (the loop goes on).
  using ExactFallback = std::function<bool(std::vector<double>&)>;

  BallZiv(std::size_t slots, const FloatFormat& target, std::size_t n, const RowOptions& options,
          std::string_view operation)
      : values(slots, 0.0),
        decided(slots, false),
        target_(target),
        n_(n),
        options_(options),
        operation_(operation) {}

  void decide_exactly(std::size_t slot, double value) {
    values[slot] = value;
    decided[slot] = true;
    if (options_.statistics != nullptr) ++options_.statistics->exact_cases;
  }

  void run(const Encloser& enclose, const ExactFallback& exact = {}) {
    if (options_.statistics != nullptr) ++options_.statistics->calls;
    if (std::all_of(decided.begin(), decided.end(), [](bool d) { return d; })) return;
    const ZivSchedule schedule = ZivSchedule::for_format(target_);
    // Sums of n balls lose about log2 n bits, and a stick-breaking exponent of size ~n another
    // log2 n: start with both as guard bits so the first pass usually decides.
    const auto guard = static_cast<mpfr_prec_t>(2 * std::bit_width(n_));
    BallVector balls(values.size());
    bool fallback_tried = !exact;
    const auto pass = [&](mpfr_prec_t precision) {
      enclose(static_cast<slong>(precision), decided, balls);
      bool all = true;
      for (std::size_t s = 0; s < values.size(); ++s) {
        if (decided[s]) continue;
        if (const auto rounded = round_ball_if_decided(balls[s], target_)) {
          values[s] = *rounded;
          decided[s] = true;
          if (options_.statistics != nullptr) ++options_.statistics->decided_by_balls;
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (!fallback_tried) {
        fallback_tried = true;
        if (exact(values)) {
          if (options_.statistics != nullptr) ++options_.statistics->exact_cases;
          return true;
        }
      }
      return false;
    };
    run_ziv_passes(schedule, guard, options_.statistics, pass,
                   [&] { return std::string(operation_) + ": rounding to " + std::string(target_.name); });
  }

  std::vector<double> values;
  std::vector<bool> decided;

 private:
  const FloatFormat& target_;
  std::size_t n_;
  const RowOptions& options_;
  std::string_view operation_;
};

// Scatters per-distinct-value results to the row (masked entries stay 0).
std::vector<double> scatter(std::size_t row_size, const PreparedRow& row, const DistinctLogits& distinct,
                            const std::vector<double>& per_value) {
  std::vector<double> result(row_size, 0.0);
  for (std::size_t a = 0; a < row.active.size(); ++a)
    result[row.active[a]] = per_value[distinct.of_active[a]];
  return result;
}

std::vector<double> uniform_row(std::size_t row_size, const PreparedRow& row, const FloatFormat& target,
                                const RowOptions& options) {
  MpfrNumber one(64);
  mpfr_set_ui(one.get(), 1, MPFR_RNDN);
  const double coefficient = round_exact_quotient(one.get(), row.active.size(), target);
  std::vector<double> result(row_size, 0.0);
  for (const std::size_t j : row.active) result[j] = coefficient;
  if (options.statistics != nullptr) {
    ++options.statistics->calls;
    ++options.statistics->exact_cases;
  }
  return result;
}

// out[v] = exp(multiplier (v - shift)) / sum_w count_w exp(multiplier (w - shift)), every value
// of multiplier (v - shift) <= 0 (the caller's shift and multiplier's sign see to it).
void enclose_scaled_softmax(const DistinctLogits& distinct, double shift, arb_srcptr multiplier,
                            slong precision, BallVector& out) {
  Ball sum;
  enclose_exponentials(distinct, shift, multiplier, precision, out, sum.get());
  for (std::size_t v = 0; v < distinct.values.size(); ++v) arb_div(out[v], out[v], sum.get(), precision);
}

// The paper's polynomial with its decimal constants, at a ball H.
void enclose_adaptive_polynomial(arb_ptr result, arb_srcptr entropy, slong precision) {
  static constexpr long thousandths[] = {-37, 481, -2300, 4917, -1791};  // H^4 .. H^0, in 1/1000
  Ball coefficient;
  arb_zero(result);
  for (const long c : thousandths) {
    arb_mul(result, result, entropy, precision);
    arb_set_si(coefficient.get(), c);
    arb_div_ui(coefficient.get(), coefficient.get(), 1000, precision);
    arb_add(result, result, coefficient.get(), precision);
  }
}

// n = r^g with r not a perfect power (g maximal).
std::pair<std::uint64_t, unsigned> perfect_power_base(std::uint64_t n) {
  const auto power_is = [](std::uint64_t base, unsigned exponent, std::uint64_t target) {
    std::uint64_t value = 1;
    for (unsigned i = 0; i < exponent; ++i) {
      if (value > target / base) return false;  // the next product would pass target
      value *= base;
    }
    return value == target;
  };
  for (unsigned g = 63; g >= 2; --g) {
    const auto guess = static_cast<std::uint64_t>(std::llround(std::pow(static_cast<double>(n), 1.0 / g)));
    for (const std::uint64_t r : {guess - 1, guess, guess + 1}) {
      if (r >= 2 && power_is(r, g, n)) return {r, g};
    }
  }
  return {n, 1};
}

// SSMax's rational case (see the termination note): if every g (v - shift) / theta is an integer,
// rounds every coefficient exactly and returns true.
bool scalable_softmax_exactly(const DistinctLogits& distinct, double shift, double theta,
                              std::uint64_t length, const FloatFormat& target, std::vector<double>& values) {
  constexpr double largest_exact_bits = 1 << 16;
  const auto [base, power] = perfect_power_base(length);
  std::vector<long> exponents;
  Rational scaled, shift_q(shift), theta_q(theta);
  for (const double value : distinct.values) {
    mpq_set_d(scaled.get(), value);
    mpq_sub(scaled.get(), scaled.get(), shift_q.get());
    mpq_div(scaled.get(), scaled.get(), theta_q.get());
    Rational g(static_cast<double>(power));
    mpq_mul(scaled.get(), scaled.get(), g.get());
    if (mpz_cmp_ui(mpq_denref(scaled.get()), 1) != 0) return false;  // irrational: the loop decides
    if (!mpz_fits_slong_p(mpq_numref(scaled.get()))) return false;
    exponents.push_back(mpz_get_si(mpq_numref(scaled.get())));  // <= 0
  }
  const long lowest = *std::min_element(exponents.begin(), exponents.end());
  if (-static_cast<double>(lowest) * std::log2(static_cast<double>(base)) > largest_exact_bits) return false;
  // Numerators r^(G_v - lowest) and their count-weighted sum, as GMP integers.
  std::vector<__mpz_struct> numerators(exponents.size());
  mpz_t denominator;
  mpz_init(denominator);
  for (std::size_t v = 0; v < exponents.size(); ++v) {
    mpz_init(&numerators[v]);
    mpz_ui_pow_ui(&numerators[v], base, static_cast<unsigned long>(exponents[v] - lowest));
    mpz_addmul_ui(denominator, &numerators[v], distinct.counts[v]);
  }
  for (std::size_t v = 0; v < exponents.size(); ++v) {
    values[v] = round_exact_ratio(&numerators[v], denominator, target);
    mpz_clear(&numerators[v]);
  }
  mpz_clear(denominator);
  return true;
}

std::uint64_t row_length(std::optional<std::uint64_t> length, const PreparedRow& row,
                         std::string_view operation) {
  if (length && *length == 0) {
    throw InputError(InputProblem::out_of_range,
                     std::string(operation) + ": the length n must be at least 1");
  }
  return length.value_or(row.active.size());
}

}  // namespace

std::vector<double> adaptive_temperature_softmax(std::span<const double> logits, const FloatFormat& target,
                                                 const RowOptions& options) {
  constexpr std::string_view operation = "adaptive_temperature_softmax";
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, operation);
  if (row.active.empty()) return std::vector<double>(logits.size(), 0.0);
  if (row.all_equal) return uniform_row(logits.size(), row, target, options);  // 1/k whatever beta is
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallZiv ziv(distinct.values.size(), target, row.active.size(), options, operation);
  ziv.run([&](slong precision, const std::vector<bool>&, BallVector& out) {
    Ball multiplier, entropy, term, tiny, half, one, beta;
    enclose_inverse_temperature(multiplier.get(), options.theta, precision);
    enclose_scaled_softmax(distinct, row.shift, multiplier.get(), precision, out);
    // H = -sum_v count_v p_v log(p_v + 1e-9)
    arb_set_ui(tiny.get(), 1);
    arb_div_ui(tiny.get(), tiny.get(), 1000000000, precision);
    arb_zero(entropy.get());
    for (std::size_t v = 0; v < distinct.values.size(); ++v) {
      arb_add(term.get(), out[v], tiny.get(), precision);
      arb_log(term.get(), term.get(), precision);
      arb_mul(term.get(), term.get(), out[v], precision);
      arb_submul_ui(entropy.get(), term.get(), distinct.counts[v], precision);
    }
    // beta: 1 where H <= 0.5 or poly(H) <= 1 (poly(0.5) = 0.15, so the two rules agree near
    // H = 0.5 and beta is continuous there); else max(poly(H), 1).
    arb_set_d(half.get(), 0.5);
    arb_one(one.get());
    if (arb_le(entropy.get(), half.get())) return;  // beta = 1 exactly: out already holds softmax(z)
    enclose_adaptive_polynomial(beta.get(), entropy.get(), precision);
    if (arb_le(beta.get(), one.get())) return;
    arb_max(beta.get(), beta.get(), one.get(), precision);
    if (!arb_gt(entropy.get(), half.get())) arb_union(beta.get(), beta.get(), one.get(), precision);
    arb_mul(multiplier.get(), multiplier.get(), beta.get(), precision);
    enclose_scaled_softmax(distinct, row.shift, multiplier.get(), precision, out);
  });
  return scatter(logits.size(), row, distinct, ziv.values);
}

std::vector<double> scalable_softmax(std::span<const double> logits, const FloatFormat& target,
                                     const RowOptions& options, std::optional<std::uint64_t> length) {
  constexpr std::string_view operation = "scalable_softmax";
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, operation);
  if (row.active.empty()) return std::vector<double>(logits.size(), 0.0);
  const std::uint64_t n = row_length(length, row, operation);
  if (row.all_equal || n == 1)
    return uniform_row(logits.size(), row, target, options);  // log 1 = 0: all weights 1
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallZiv ziv(distinct.values.size(), target, row.active.size(), options, operation);
  ziv.run(
      [&](slong precision, const std::vector<bool>&, BallVector& out) {
        Ball multiplier, inverse_temperature;
        arb_log_ui(multiplier.get(), n, precision);
        enclose_inverse_temperature(inverse_temperature.get(), options.theta, precision);
        arb_mul(multiplier.get(), multiplier.get(), inverse_temperature.get(), precision);
        enclose_scaled_softmax(distinct, row.shift, multiplier.get(), precision, out);
      },
      [&](std::vector<double>& values) {
        return scalable_softmax_exactly(distinct, row.shift, options.theta, n, target, values);
      });
  return scatter(logits.size(), row, distinct, ziv.values);
}

std::vector<double> sigmoid_attention_weights(std::span<const double> logits, const FloatFormat& target,
                                              const RowOptions& options, std::optional<double> bias,
                                              std::optional<std::uint64_t> length) {
  constexpr std::string_view operation = "sigmoid_attention_weights";
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, operation);
  if (bias && !std::isfinite(*bias)) {
    throw InputError(InputProblem::non_finite_value,
                     std::string(operation) + ": the bias is " + hex_float(*bias));
  }
  if (row.active.empty()) return std::vector<double>(logits.size(), 0.0);
  const std::uint64_t n = row_length(length, row, operation);
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallZiv ziv(distinct.values.size(), target, row.active.size(), options, operation);
  MpfrNumber one(64);
  mpfr_set_ui(one.get(), 1, MPFR_RNDN);
  Rational minus_bias_times_theta(bias.value_or(0.0));
  {
    Rational theta(options.theta);
    mpq_mul(minus_bias_times_theta.get(), minus_bias_times_theta.get(), theta.get());
    mpq_neg(minus_bias_times_theta.get(), minus_bias_times_theta.get());
  }
  for (std::size_t v = 0; v < distinct.values.size(); ++v) {
    if (bias) {
      Rational value(distinct.values[v]);
      if (mpq_equal(value.get(), minus_bias_times_theta.get()) != 0) {  // z + b = 0
        ziv.decide_exactly(v, round_exact_quotient(one.get(), 2, target));
      }
    } else if (distinct.values[v] == 0.0) {  // sigma(-ln n) = 1 / (n + 1)
      ziv.decide_exactly(v, round_exact_quotient(one.get(), n + 1, target));
    }
  }
  ziv.run([&](slong precision, const std::vector<bool>& decided, BallVector& out) {
    Ball offset, inverse_temperature;
    if (bias) {
      arb_set_d(offset.get(), *bias);
    } else {
      arb_log_ui(offset.get(), n, precision);
      arb_neg(offset.get(), offset.get());
    }
    enclose_inverse_temperature(inverse_temperature.get(), options.theta, precision);
    for (std::size_t v = 0; v < distinct.values.size(); ++v) {
      if (decided[v]) continue;
      // sigma(x) = 1 / (1 + exp(-x))
      arb_ptr x = out[v];
      arb_set_d(x, distinct.values[v]);
      arb_mul(x, x, inverse_temperature.get(), precision);
      arb_add(x, x, offset.get(), precision);
      arb_neg(x, x);
      arb_exp(x, x, precision);
      arb_add_ui(x, x, 1, precision);
      arb_inv(x, x, precision);
    }
  });
  return scatter(logits.size(), row, distinct, ziv.values);
}

std::vector<double> stick_breaking_weights(std::span<const double> logits, const FloatFormat& target,
                                           const RowOptions& options) {
  constexpr std::string_view operation = "stick_breaking_weights";
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, operation);
  if (row.active.empty()) return std::vector<double>(logits.size(), 0.0);
  const std::size_t count = row.active.size();
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallZiv ziv(count, target, count, options, operation);
  // The exact case: a run of zero logits at the end of the row gives 1/2, 1/4, 1/8, ...
  MpfrNumber power_of_two(2);
  for (std::size_t m = 1; m <= count && logits[row.active[count - m]] == 0.0; ++m) {
    mpfr_set_ui_2exp(power_of_two.get(), 1, -static_cast<mpfr_exp_t>(m), MPFR_RNDN);
    ziv.decide_exactly(count - m, round_to_format(power_of_two.get(), target));
  }
  ziv.run([&](slong precision, const std::vector<bool>& decided, BallVector& out) {
    // softplus(+z) and softplus(-z) per distinct value, each by the form that does not cancel:
    // softplus(x) = log1p(exp(x)) for x <= 0 and x + log1p(exp(-x)) for x > 0.
    const std::size_t values = distinct.values.size();
    BallVector plus(values), minus(values);
    Ball inverse_temperature, scratch, later;
    enclose_inverse_temperature(inverse_temperature.get(), options.theta, precision);
    const auto softplus = [&](arb_ptr result, arb_srcptr x, bool positive) {
      arb_set(scratch.get(), x);
      if (positive) arb_neg(scratch.get(), scratch.get());
      arb_exp(scratch.get(), scratch.get(), precision);
      arb_log1p(result, scratch.get(), precision);
      if (positive) arb_add(result, result, x, precision);
    };
    for (std::size_t v = 0; v < values; ++v) {
      Ball z, negated;
      arb_set_d(z.get(), distinct.values[v]);
      arb_mul(z.get(), z.get(), inverse_temperature.get(), precision);
      arb_neg(negated.get(), z.get());
      const bool positive = distinct.values[v] * options.theta > 0;
      softplus(plus[v], z.get(), positive);
      softplus(minus[v], negated.get(), !positive && distinct.values[v] != 0.0);
    }
    // log A_a = -softplus(-z_a) - sum_{later keys} softplus(z_k)
    arb_zero(later.get());
    for (std::size_t a = count; a-- > 0;) {
      const std::size_t v = distinct.of_active[a];
      if (!decided[a]) {
        arb_add(out[a], minus[v], later.get(), precision);
        arb_neg(out[a], out[a]);
        arb_exp(out[a], out[a], precision);
      }
      arb_add(later.get(), later.get(), plus[v], precision);
    }
  });
  std::vector<double> result(logits.size(), 0.0);
  for (std::size_t a = 0; a < count; ++a) result[row.active[a]] = ziv.values[a];
  return result;
}

double length_scale_factor(std::uint64_t n, std::uint64_t training_length) {
  if (n <= training_length) return 1.0;
  return std::log(static_cast<double>(n)) / std::log(static_cast<double>(training_length));
}

std::vector<double> length_scaled_softmax(std::span<const double> logits, const FloatFormat& target,
                                          std::uint64_t training_length, const RowOptions& options,
                                          std::optional<std::uint64_t> length) {
  constexpr std::string_view operation = "length_scaled_softmax";
  if (training_length < 2) {
    throw InputError(InputProblem::out_of_range,
                     std::string(operation) +
                         ": the training length L must be at least 2 (ln L divides), got " +
                         std::to_string(training_length));
  }
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, operation);
  if (row.active.empty()) return std::vector<double>(logits.size(), 0.0);
  const std::uint64_t n = row_length(length, row, operation);
  if (n <= training_length) return softmax(logits, target, options);  // f = 1 exactly
  if (row.all_equal) return uniform_row(logits.size(), row, target, options);
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallZiv ziv(distinct.values.size(), target, row.active.size(), options, operation);
  ziv.run([&](slong precision, const std::vector<bool>&, BallVector& out) {
    Ball multiplier, scratch;
    arb_log_ui(multiplier.get(), n, precision);
    arb_log_ui(scratch.get(), training_length, precision);
    arb_div(multiplier.get(), multiplier.get(), scratch.get(), precision);
    enclose_inverse_temperature(scratch.get(), options.theta, precision);
    arb_mul(multiplier.get(), multiplier.get(), scratch.get(), precision);
    enclose_scaled_softmax(distinct, row.shift, multiplier.get(), precision, out);
  });
  return scatter(logits.size(), row, distinct, ziv.values);
}

}  // namespace sharpcheck::reference
