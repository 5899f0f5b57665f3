#include "reference/ball_stage.hpp"

#include <mpfr.h>

#include <algorithm>
#include <bit>
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
  // The ends, rounded outward: still an enclosure. 128 bits is far finer than any target, but not
  // than the ball when the value lies within 2^-128 of a rounding boundary (a Differential weight
  // 2^-732 under an fp64 midpoint): then the ends keep the ball's own accuracy, or rounding them
  // outward would straddle the boundary at every precision and the loop could never decide.
  // (An exact ball, radius 0, has the accuracy of its midpoint's bits.)
  const slong accuracy = arb_is_exact(ball) ? arb_bits(ball) : arb_rel_accuracy_bits(ball);
  const mpfr_prec_t bits =
      std::clamp<mpfr_prec_t>(static_cast<mpfr_prec_t>(accuracy) + 16, 128, mpfr_prec_t{1} << 24);
  if (mpfr_get_prec(ends.lo) != bits) {
    mpfr_set_prec(ends.lo, bits);
    mpfr_set_prec(ends.hi, bits);
  }
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

namespace {

// A running sum of n balls at p bits carries n 2^-p of rounding in its radius: about 2^-44 of S
// for a row of 1M at 64 bits, coarser than the double stage's own bound, so a long row's entries
// that stage left all fell through to the MPFR loop (seconds per row). 2 log2 n bits more keep
// the sum's rounding at 2^-p / n.
slong ball_precision(const FloatFormat& target, std::size_t terms) {
  return static_cast<slong>(ZivSchedule::for_format(target).initial) +
         2 * static_cast<slong>(std::bit_width(terms));
}

// The ball stage for a long row of which few entries are left (the double stage decided the rest):
// S from the sorted logits, one exponential per run of equal values (a copy of the row, no hash
// map and no ball per value), then each undecided entry's own exponential over S. A row of 1M
// fp32 logits with a handful undecided held about 150 MB per thread in the grouped form below.
std::size_t decide_few_by_balls(std::span<const double> logits, const PreparedRow& row, slong precision,
                                arb_srcptr multiplier, const FloatFormat& target, std::span<double> result,
                                std::vector<bool>& decided) {
  std::vector<double> sorted;
  sorted.reserve(row.active.size());
  for (const std::size_t j : row.active) sorted.push_back(logits[j]);
  std::sort(sorted.begin(), sorted.end());  // +0 and -0 compare equal: one run, as one value
  Ball shift, sum, w;
  arb_set_d(shift.get(), row.shift);  // doubles convert exactly
  const auto exponential = [&](double logit, arb_ptr out) {
    arb_set_d(out, logit);
    arb_sub(out, out, shift.get(), precision);
    arb_mul(out, out, multiplier, precision);
    arb_exp(out, out, precision);
  };
  for (std::size_t first = 0; first < sorted.size();) {
    std::size_t last = first + 1;
    while (last < sorted.size() && sorted[last] == sorted[first]) ++last;
    exponential(sorted[first], w.get());
    arb_addmul_ui(sum.get(), w.get(), last - first, precision);
    first = last;
  }
  std::size_t decided_count = 0;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    if (decided[a]) continue;
    exponential(logits[row.active[a]], w.get());
    arb_div(w.get(), w.get(), sum.get(), precision);
    if (const auto rounded = round_ball_if_decided(w.get(), target)) {
      result[row.active[a]] = *rounded;
      decided[a] = true;
      ++decided_count;
    }
  }
  return decided_count;
}

}  // namespace

std::size_t decide_softmax_by_balls(std::span<const double> logits, const PreparedRow& row, double theta,
                                    const FloatFormat& target, std::span<double> result,
                                    std::vector<bool>& decided) {
  const slong precision = ball_precision(target, row.active.size());
  const auto left = static_cast<std::size_t>(std::count(decided.begin(), decided.end(), false));
  if (left * 8 < row.active.size()) {
    Ball multiplier;
    enclose_inverse_temperature(multiplier.get(), theta, precision);
    return decide_few_by_balls(logits, row, precision, multiplier.get(), target, result, decided);
  }
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
  const slong precision = ball_precision(target, row.active.size());
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

namespace {

// Entry a's logit (softcap(scale * q . k_a) + bias_a) / theta as a ball; the sink's is sink / theta.
void enclose_attention_logits(const AttentionRow& row, slong precision, BallVector& logits) {
  const std::size_t dimension = row.keys.cols;
  BallVector query_balls(dimension), key_balls(dimension);
  for (std::size_t t = 0; t < dimension; ++t) arb_set_d(query_balls[t], row.query[t]);
  Ball scale, cap, term;
  if (row.scores.scale_is_ln2) {
    arb_const_log2(scale.get(), precision);
  } else if (row.scores.scale) {
    arb_set_d(scale.get(), *row.scores.scale);
  } else {
    arb_set_ui(scale.get(), dimension);
    arb_rsqrt(scale.get(), scale.get(), precision);
  }
  arb_set_d(cap.get(), row.scores.softcap);
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    for (std::size_t t = 0; t < dimension; ++t) arb_set_d(key_balls[t], row.keys(row.active[a], t));
    arb_dot(logits[a], nullptr, 0, query_balls.data(), 1, key_balls.data(), 1, static_cast<slong>(dimension),
            precision);
    arb_mul(logits[a], logits[a], scale.get(), precision);
    if (row.scores.softcap != 0.0) {
      arb_div(logits[a], logits[a], cap.get(), precision);
      arb_tanh(logits[a], logits[a], precision);
      arb_mul(logits[a], logits[a], cap.get(), precision);
    }
    if (!row.bias.empty()) {
      const auto& terms = row.bias[a];
      arb_set_d(term.get(), terms.slope);
      arb_mul_si(term.get(), term.get(), static_cast<slong>(terms.distance), precision);
      arb_sub(logits[a], logits[a], term.get(), precision);
      arb_set_d(term.get(), terms.additive);
      arb_add(logits[a], logits[a], term.get(), precision);
    }
  }
  if (row.has_sink()) arb_set_d(logits[row.active.size()], *row.scores.sink);
  Ball theta;
  arb_set_d(theta.get(), row.scores.theta);
  for (std::size_t a = 0; a < row.entries(); ++a) arb_div(logits[a], logits[a], theta.get(), precision);
}

}  // namespace

void decide_attention_row_by_balls(const AttentionRow& row, const FloatFormat& target,
                                   AttentionRowResults& results) {
  const std::size_t count = row.entries();
  const slong precision = ball_precision(target, count);
  BallVector exponentials(count), column(row.active.size());
  enclose_attention_logits(row, precision, exponentials);
  Ball shift, sum, quotient;
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
  for (std::size_t a = 0; a < results.weight_done.size(); ++a) {
    if (results.weight_done[a]) continue;
    arb_div(quotient.get(), exponentials[a], sum.get(), precision);
    if (const auto rounded = round_ball_if_decided(quotient.get(), target)) {
      results.weights[row.active[a]] = *rounded;
      results.weight_done[a] = true;
    }
  }
  for (std::size_t c = 0; c < row.values.cols; ++c) {
    if (results.output_done[c]) continue;
    for (std::size_t a = 0; a < row.active.size(); ++a) arb_set_d(column[a], row.values(row.active[a], c));
    arb_dot(quotient.get(), nullptr, 0, exponentials.data(), 1, column.data(), 1,
            static_cast<slong>(row.active.size()), precision);
    arb_div(quotient.get(), quotient.get(), sum.get(), precision);
    if (const auto rounded = round_ball_if_decided(quotient.get(), target)) {
      results.output[c] = *rounded;
      results.output_done[c] = true;
    }
  }
  if (results.lse != nullptr && !results.lse_done) {
    arb_log(quotient.get(), sum.get(), precision);
    arb_add(quotient.get(), quotient.get(), shift.get(), precision);
    if (results.lse_base2) {
      Ball ln2;
      arb_const_log2(ln2.get(), precision);
      arb_div(quotient.get(), quotient.get(), ln2.get(), precision);
    }
    if (const auto rounded = round_ball_if_decided(quotient.get(), *results.lse_target)) {
      *results.lse = *rounded;
      results.lse_done = true;
    }
  }
}

}  // namespace sharpcheck::reference
