#include "reference/ball_stage.hpp"

#include <mpfr.h>

#include <unordered_map>

#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {

std::optional<double> round_ball_if_decided(arb_srcptr ball, const FloatFormat& format) {
  if (!arb_is_finite(ball)) return std::nullopt;
  thread_local struct Ends {
    Ends() { mpfr_inits2(128, lo, hi, static_cast<mpfr_ptr>(nullptr)); }
    ~Ends() { mpfr_clears(lo, hi, static_cast<mpfr_ptr>(nullptr)); }
    mpfr_t lo, hi;
  } ends;
  // The ends, rounded outward to 128 bits: still an enclosure, and far finer than any target.
  arb_get_interval_mpfr(ends.lo, ends.hi, ball);
  return round_if_decided(ends.lo, ends.hi, format);
}

DistinctLogits distinct_logits(std::span<const double> logits, const PreparedRow& row) {
  DistinctLogits distinct;
  std::unordered_map<double, std::size_t> position;  // +0 and -0 are one key, as they are one value
  distinct.of_active.reserve(row.active.size());
  for (const std::size_t j : row.active) {
    const auto [slot, inserted] = position.try_emplace(logits[j], distinct.values.size());
    if (inserted) {
      distinct.values.push_back(logits[j]);
      distinct.counts.push_back(0);
    }
    ++distinct.counts[slot->second];
    distinct.of_active.push_back(slot->second);
  }
  return distinct;
}

void enclose_inverse_temperature(arb_ptr multiplier, double theta, slong precision) {
  arb_set_d(multiplier, theta);
  arb_inv(multiplier, multiplier, precision);
}

void enclose_exponentials(const DistinctLogits& distinct, double shift, arb_srcptr multiplier,
                          slong precision, BallVector& exponentials, arb_ptr sum, BallVector* arguments) {
  Ball shift_ball;
  arb_set_d(shift_ball.get(), shift);  // doubles convert exactly
  arb_zero(sum);
  for (std::size_t v = 0; v < distinct.values.size(); ++v) {
    arb_ptr w = exponentials[v];
    arb_set_d(w, distinct.values[v]);
    arb_sub(w, w, shift_ball.get(), precision);
    arb_mul(w, w, multiplier, precision);
    if (arguments != nullptr) arb_set((*arguments)[v], w);
    arb_exp(w, w, precision);
    arb_addmul_ui(sum, w, distinct.counts[v], precision);
  }
}

std::size_t decide_softmax_by_balls(std::span<const double> logits, const PreparedRow& row, double theta,
                                    const FloatFormat& target, std::span<double> result,
                                    std::vector<bool>& decided) {
  const auto precision = static_cast<slong>(ZivSchedule::for_format(target).initial);
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallVector weights(distinct.values.size());
  Ball multiplier, sum, coefficient;
  enclose_inverse_temperature(multiplier.get(), theta, precision);
  enclose_exponentials(distinct, row.shift, multiplier.get(), precision, weights, sum.get());
  std::vector<std::optional<double>> per_value(distinct.values.size());
  for (std::size_t v = 0; v < distinct.values.size(); ++v) {
    arb_div(coefficient.get(), weights[v], sum.get(), precision);
    per_value[v] = round_ball_if_decided(coefficient.get(), target);
  }
  std::size_t decided_count = 0;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    const auto& rounded = per_value[distinct.of_active[a]];
    if (decided[a] || !rounded) continue;
    result[row.active[a]] = *rounded;
    decided[a] = true;
    ++decided_count;
  }
  return decided_count;
}

std::optional<double> decide_entropy_by_balls(std::span<const double> logits, const PreparedRow& row,
                                              double theta, const FloatFormat& target) {
  // H = log S - sum_v count_v w_v z_v / S with z_v = (v - shift) / theta.
  const auto precision = static_cast<slong>(ZivSchedule::for_format(target).initial);
  const DistinctLogits distinct = distinct_logits(logits, row);
  BallVector weights(distinct.values.size());
  BallVector arguments(distinct.values.size());
  Ball multiplier, sum, weighted, term, entropy;
  enclose_inverse_temperature(multiplier.get(), theta, precision);
  enclose_exponentials(distinct, row.shift, multiplier.get(), precision, weights, sum.get(), &arguments);
  arb_zero(weighted.get());
  for (std::size_t v = 0; v < distinct.values.size(); ++v) {
    arb_mul(term.get(), arguments[v], weights[v], precision);
    arb_addmul_ui(weighted.get(), term.get(), distinct.counts[v], precision);
  }
  arb_div(weighted.get(), weighted.get(), sum.get(), precision);
  arb_log(entropy.get(), sum.get(), precision);
  arb_sub(entropy.get(), entropy.get(), weighted.get(), precision);
  return round_ball_if_decided(entropy.get(), target);
}

void decide_attention_row_by_balls(std::span<const double> query, const Matrix& keys, const Matrix& values,
                                   std::span<const std::size_t> active, std::optional<double> scale,
                                   double theta, const FloatFormat& target, std::span<double> output,
                                   std::span<double> weights, std::vector<bool>& output_done,
                                   std::vector<bool>& weight_done) {
  const auto precision = static_cast<slong>(ZivSchedule::for_format(target).initial);
  const std::size_t dimension = keys.cols;
  const std::size_t count = active.size();
  BallVector query_balls(dimension), key_balls(dimension), exponentials(count), column(count);
  for (std::size_t t = 0; t < dimension; ++t) arb_set_d(query_balls[t], query[t]);
  Ball multiplier, temperature, shift, sum, quotient;
  if (scale) {
    arb_set_d(multiplier.get(), *scale);
  } else {
    arb_set_ui(multiplier.get(), dimension);
    arb_rsqrt(multiplier.get(), multiplier.get(), precision);
  }
  arb_set_d(temperature.get(), theta);
  arb_div(multiplier.get(), multiplier.get(), temperature.get(), precision);
  // Logits z_a = (q . k_a) * scale / theta; the dot product of exact inputs is enclosed by arb_dot.
  for (std::size_t a = 0; a < count; ++a) {
    for (std::size_t t = 0; t < dimension; ++t) arb_set_d(key_balls[t], keys(active[a], t));
    arb_dot(exponentials[a], nullptr, 0, query_balls.data(), 1, key_balls.data(), 1,
            static_cast<slong>(dimension), precision);
    arb_mul(exponentials[a], exponentials[a], multiplier.get(), precision);
  }
  // Shift by the largest midpoint (any exact constant cancels; this one keeps exp in range).
  arf_t largest;
  arf_init(largest);
  arf_set(largest, arb_midref(exponentials[0]));
  for (std::size_t a = 1; a < count; ++a) arf_max(largest, largest, arb_midref(exponentials[a]));
  arb_set_arf(shift.get(), largest);
  arf_clear(largest);
  arb_zero(sum.get());
  for (std::size_t a = 0; a < count; ++a) {
    arb_sub(exponentials[a], exponentials[a], shift.get(), precision);
    arb_exp(exponentials[a], exponentials[a], precision);
    arb_add(sum.get(), sum.get(), exponentials[a], precision);
  }
  for (std::size_t a = 0; a < weight_done.size(); ++a) {
    arb_div(quotient.get(), exponentials[a], sum.get(), precision);
    if (const auto rounded = round_ball_if_decided(quotient.get(), target)) {
      weights[active[a]] = *rounded;
      weight_done[a] = true;
    }
  }
  for (std::size_t c = 0; c < values.cols; ++c) {
    for (std::size_t a = 0; a < count; ++a) arb_set_d(column[a], values(active[a], c));
    arb_dot(quotient.get(), nullptr, 0, exponentials.data(), 1, column.data(), 1, static_cast<slong>(count),
            precision);
    arb_div(quotient.get(), quotient.get(), sum.get(), precision);
    if (const auto rounded = round_ball_if_decided(quotient.get(), target)) {
      output[c] = *rounded;
      output_done[c] = true;
    }
  }
}

}  // namespace sharpcheck::reference
