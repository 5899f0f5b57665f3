#include "reference/double_stage.hpp"

#include <algorithm>
#include <bit>
#include <cfenv>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "reference/certified_exp_constants.hpp"
#include "reference/double_stage_row.hpp"
#include "reference/double_stage_simd.hpp"
#include "reference/exact_rounding.hpp"

// Error bound of certified_exp (u = 2^-53, round to nearest throughout).
//
// Reduction: k = nearbyint(fl(x / ln 2)), r~ = (x - k c_hi) - k c_lo with c_hi + c_lo = ln 2 to
// within 2^-89 (c_hi has 33 significant bits). fl(x fl(1/ln 2)) lies within 2^-42 of x / ln 2
// for |x| <= 708, so |r| <= ln 2 (1/2 + 2^-42) < 0.3467. Each of the three floating-point steps errs by
// at most u times its result (|x - k c_hi| < 0.35, |k c_lo| < 2^-22, |r~| < 0.3467), and
// |k| <= 1022 makes k |ln 2 - c_hi - c_lo| < 2^-79: |r~ - (x - k ln 2)| < 0.71u + 2^-79 < 0.72u,
// which changes e^r by a relative factor within 0.73u.
//
// Polynomial: p(r) = sum_{i <= 13} c_i r^i with c_i = 1/i! rounded to double (relative error u
// each, so at most u e^|r| <= 1.42u absolute). Taylor's remainder is at most
// |r|^14 / 14! e^|r| < 6e-18 < 2^-57 absolute. Horner's rule in double errs by at most
// gamma_26 sum_i |c_i| |r|^i <= 26.1u e^|r| < 37u absolute (Higham, Accuracy and Stability,
// eq. 5.3). Relative to e^r >= e^-0.3467 > 0.707: (37 + 1.42) u / 0.707 + 2^-57 / 0.707 < 55u.
//
// Scaling: p 2^k is exact while the result is normal, which x >= -708 guarantees.
// In all: relative error < 55u + 0.73u + O(u^2) < 56u < 2^-47.
//
// Softmax (decide_softmax_in_double): z~_j = fl(fl(e_j - m) / theta) errs by at most
// (2u + u^2) |z_j|, so w~_j = certified_exp(z~_j) = w_j (1 + eta_j) with
// |eta_j| <= 2^-47 + 2.01u |z_j| (for |z_j| <= 708). Entries with z~_j < -700 are not
// exponentiated: their w_j < e^-699 < 2^-1008 each, bounded as an absolute term. The pairwise
// sum S~ of the w~ (each term passes through at most ceil(log2 n) additions) errs by
// gamma_{ceil(log2 n)} relative (Higham, eq. 4.6; S >= 1: the max entry has w = 1 exactly), and the
// quotient by u. So p~_j = fl(w~_j / S~) = p_j (1 + eps_j) with
// |eps_j| <= (|eta_j| + eta_max + gamma_{ceil(log2 n)} + u + n 2^-1008) (1 + 2^-20): the 2^-20
// covers every product of two of these small terms for n < 2^30.

namespace sharpcheck::reference {
namespace {

double power_of_two(int k) { return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52); }

// Adds the values pairwise in place (destroying them): each passes through at most ceil(log2 n)
// additions, which is what the error bound above counts.
double pairwise_sum(std::vector<double>& values) {
  std::size_t count = values.size();
  if (count == 0) return 0;
  while (count > 1) {
    const std::size_t half = count / 2;
    for (std::size_t i = 0; i < half; ++i) values[i] = values[2 * i] + values[2 * i + 1];
    if (count % 2 == 1) values[half] = values[count - 1];
    count = half + count % 2;
  }
  return values[0];
}

bool is_fp32(const FloatFormat& target) { return &target == &fp32 || target.name == fp32.name; }

// A coefficient w~ / S~ within relative `error` of the true one (the bounds above), rounded if
// that decides it. An exponential of 0 stands for an argument below -700: the coefficient lies
// in [0, 2^-1008] (w < 2^-1008 and S >= 1).
std::optional<double> decide_coefficient(double exponential, double sum, double error,
                                         const FloatFormat& target) {
  if (exponential == 0) return round_if_decided(0, 0x1p-1008, target);
  const double coefficient = exponential / sum;
  // The ends in double err by u each; widen by 4u more to stay outside the true interval.
  return round_if_decided(coefficient * (1 - error - 4 * unit_roundoff),
                          coefficient * (1 + error + 4 * unit_roundoff), target);
}

// Softmax coefficients for a target other than fp32: the vectorised intervals, each rounded here.
// values[a] is the rounded coefficient, or NaN where undecided; returns how many were decided.
std::size_t decide_coefficients(std::span<const double> weights, std::span<const double> magnitudes,
                                double sum, double shared, const FloatFormat& target,
                                std::span<double> values) {
  thread_local std::vector<double> low, high;
  low.resize(weights.size());
  high.resize(weights.size());
  bracket_coefficients(weights, magnitudes, sum, shared, low, high);
  std::size_t decided = 0;
  for (std::size_t a = 0; a < weights.size(); ++a) {
    const auto rounded = round_if_decided(low[a], high[a], target);
    values[a] = rounded ? *rounded : std::numeric_limits<double>::quiet_NaN();
    decided += rounded ? 1 : 0;
  }
  return decided;
}

}  // namespace

bool certified_arithmetic() {
  if (std::fegetround() != FE_TONEAREST) return false;
#if defined(__SSE__) || defined(__x86_64__)
  // MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6): torch.set_flush_denormal(True)
  // or code built with -ffast-math sets them for the thread.
  // Its rounding control (bits 13 and 14) too: glibc's fegetround reads the x87 control word only.
  if ((_mm_getcsr() & 0xE040U) != 0) return false;
#elif defined(__aarch64__)
  if ((__builtin_aarch64_get_fpcr() & (1U << 24)) != 0) return false;  // FPCR.FZ
#endif
  return true;
}

std::optional<double> round_if_decided(double low, double high, const FloatFormat& target) {
  const auto sign = [](double x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); };
  if (is_fp32(target)) {
    // Hardware conversion rounds to nearest even, subnormals included: exactly fp32's rounding.
    return decided_rounding(static_cast<float>(low), static_cast<float>(high), sign(low), sign(high));
  }
  return decided_rounding(round_to_format(low, target), round_to_format(high, target), sign(low), sign(high));
}

double certified_exp(double x) {
  namespace constants = certified_exp_constants;
  const double k = std::nearbyint(x * constants::inverse_ln2);
  const double r = (x - k * constants::ln2_high) - k * constants::ln2_low;
  double p = constants::taylor[constants::degree];
  for (int i = constants::degree - 1; i >= 0; --i) p = p * r + constants::taylor[i];
  return p * power_of_two(static_cast<int>(k));
}

std::size_t decide_softmax_in_double(std::span<const double> logits, const PreparedRow& row, double theta,
                                     const FloatFormat& target, std::span<double> result,
                                     std::vector<bool>& decided) {
  if (target.precision() > 24 || !certified_arithmetic()) return 0;
  const std::size_t count = row.active.size();
  const bool contiguous = count == logits.size();  // no entry masked: active is 0, 1, ..., n - 1
  thread_local std::vector<double> gathered, weights, magnitudes, values, partial_sums;
  if (!contiguous) {
    gathered.resize(count);
    for (std::size_t a = 0; a < count; ++a) gathered[a] = logits[row.active[a]];
  }
  weights.resize(count);
  magnitudes.resize(count);
  values.resize(count);
  // A difference of two finite logits can overflow (logits near +-DBL_MAX): its true value is
  // finite and z = d / theta may be anything, so this stage's bound does not hold. Stand aside;
  // the ball and MPFR stages compute the difference exactly. (z = d / theta overflowing is fine:
  // the true z is below -DBL_MAX and its weight is far below 2^-1008.)
  const ShiftedExponentials found = exponentiate_shifted(
      contiguous ? logits : std::span<const double>(gathered), row.shift, theta, weights, magnitudes);
  if (!found.finite) return 0;
  partial_sums.assign(weights.begin(), weights.end());
  const double sum = pairwise_sum(partial_sums);
  const double depth = std::ceil(std::log2(static_cast<double>(count)));
  const double summation = depth * unit_roundoff / (1 - depth * unit_roundoff);
  const double shared = certified_exp_error + 2.01 * unit_roundoff * found.largest_magnitude + summation +
                        unit_roundoff + static_cast<double>(found.tiny) * 0x1p-1008;
  const std::size_t decided_count =
      is_fp32(target) ? decide_coefficients_in_fp32(weights, magnitudes, sum, shared, values)
                      : decide_coefficients(weights, magnitudes, sum, shared, target, values);
  if (contiguous && decided_count == count) {  // the common case: every coefficient, in place
    std::copy(values.begin(), values.end(), result.begin());
    decided.assign(count, true);
    return count;
  }
  for (std::size_t a = 0; a < count; ++a) {
    if (std::isnan(values[a])) continue;
    result[row.active[a]] = values[a];
    decided[a] = true;
  }
  return decided_count;
}

double bias_in_double(const tensor::HeadScores::BiasTerms& terms) {
  return std::fma(-terms.slope, static_cast<double>(terms.distance), terms.additive);
}

// The logit's error: the dot product's (dot_error, scaled), the scale's (1/sqrt(d) is within 2u: a
// correctly rounded sqrt and a division) and the product's (3.01u |t|), the bias's one fma (u |b|),
// the sum's rounding (u (|t| + |b|): 5.1u |t| and 2.1u |b| in all), and the division by theta
// (2.1u |z|); the factor 1 + 2^-40 covers the rounding of this bound's own arithmetic. Below
// double's normal range a rounding errs absolutely instead, by up to 2^-1075: the product t, the
// fma of the bias and the product |scale| dot_error (which may underflow to 0) add 3 2^-1074 before
// the division by theta (a tiny theta makes that large, and the stage then stands aside), and a
// subnormal z one more 2^-1074.
LogitInDouble logit_in_double(double dot, double dot_error, double scale, double bias, double theta) {
  const double scaled = dot * scale;
  const double z = (scaled + bias) / theta;
  const double error = ((std::fabs(scale) * dot_error + 5.1 * unit_roundoff * std::fabs(scaled) +
                         2.1 * unit_roundoff * std::fabs(bias) + 0x1.8p-1073) /
                            std::fabs(theta) +
                        2.1 * unit_roundoff * std::fabs(z) + 0x1p-1074) *
                       (1 + 0x1p-40);
  return {z, error};
}

double sink_logit_error(double z) { return 1.01 * unit_roundoff * std::fabs(z) + 0x1p-1074; }

void bound_attention_exponentials(std::size_t count, std::vector<double>& scratch,
                                  AttentionRowInDouble& row) {
  const double largest =
      *std::max_element(row.logits.begin(), row.logits.begin() + static_cast<std::ptrdiff_t>(count));
  std::size_t tiny = 0;
  for (std::size_t a = 0; a < count; ++a) {
    const double x = row.logits[a] - largest;
    if (x < -700) {
      row.exponentials[a] = 0;
      ++tiny;
      continue;
    }
    row.exponentials[a] = certified_exp(std::min(x, 0.0));
    row.errors[a] = certified_exp_error + (row.errors[a] + unit_roundoff * std::fabs(x)) * (1 + 0x1p-20);
    row.eta_max = std::max(row.eta_max, row.errors[a]);
  }
  scratch.assign(row.exponentials.begin(), row.exponentials.begin() + static_cast<std::ptrdiff_t>(count));
  row.sum = pairwise_sum(scratch);
  row.depth = std::ceil(std::log2(static_cast<double>(count)));
  row.tiny_mass = static_cast<double>(tiny) * 0x1p-1008;
  row.sum_error = row.eta_max + gamma_of(row.depth) + row.tiny_mass;
}

// Entry a's logit z_a = (fl(q . k_a) fl(scale) + fl(bias_a)) / theta in double, with its absolute
// error (logit_in_double): the dot product errs by gamma_d sum |q_t k_t| plus d 2^-1074 for products
// that underflow, whatever the order of its sum and with or without fused multiply-adds (Higham,
// Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.1), and the computed sum of |q_t k_t|
// (absolutes[a], any order) is within gamma_{d+1} of the true one, so gamma_{d+3} absolutes[a] +
// (d + 1) 2^-1074 bounds it (gamma_d (1 + gamma_{d+1}) <= gamma_{d+3} for d < 2^27). The sink is
// entry `active.size()`, exact but for the division. False when a logit is not finite or its error
// is too large for this stage (the later stages take the row).
bool bound_attention_logits(const AttentionRow& source, std::span<const double> dots,
                            std::span<const double> absolutes, AttentionRowInDouble& row) {
  const std::size_t dimension = source.keys.cols;
  const double dot_gamma = gamma_of(static_cast<double>(dimension) + 3);
  const double underflow = static_cast<double>(dimension + 1) * 0x1p-1074;
  const double scale =
      source.scores.scale ? *source.scores.scale : 1.0 / std::sqrt(static_cast<double>(dimension));
  const double theta = source.scores.theta;
  for (std::size_t a = 0; a < source.active.size(); ++a) {
    const double bias = source.bias.empty() ? 0.0 : bias_in_double(source.bias[a]);
    const LogitInDouble logit =
        logit_in_double(dots[a], dot_gamma * absolutes[a] + underflow, scale, bias, theta);
    row.logits[a] = logit.z;
    row.errors[a] = logit.error;
    if (!std::isfinite(logit.z) || !std::isfinite(logit.error) || logit.error > 0x1p-30) return false;
  }
  if (source.has_sink()) {
    const std::size_t a = source.active.size();
    row.logits[a] = *source.scores.sink / theta;
    row.errors[a] = sink_logit_error(row.logits[a]);
    if (!std::isfinite(row.logits[a]) || row.errors[a] > 0x1p-30) return false;
  }
  return true;
}

namespace {

// Whether every value of column c that the row sees is 0 (a zero-padded head dimension).
bool column_is_zero(const AttentionRow& source, std::size_t c) {
  return std::all_of(source.active.begin(), source.active.end(),
                     [&](std::size_t key) { return source.values(key, c) == 0; });
}

// max |v_jc| over the keys the row sees.
double largest_value_seen(const AttentionRow& source) {
  double largest = 0;
  for (const std::size_t key : source.active) {
    for (const double x : source.values.row(key)) largest = std::max(largest, std::fabs(x));
  }
  return largest;
}

}  // namespace

// Each output column N_c / S, N_c = sum_j w_j v_jc, with its bound, rounded where the bound decides
// it. numerators[c] is N_c summed in double over the row's keys in any order (with or without fused
// multiply-adds) and magnitudes[c] is sum_j |w_j v_jc| summed likewise: the numerator is within
// gamma_{count+1} of the true magnitude (Higham 4.2: a sum of count products, each rounded once,
// whatever the order; adding a zero term is exact), which is below magnitudes[c] (1 +
// gamma_{count+2}); a product that underflows adds at most 2^-1074 more (count 2^-1074 in all).
// count is the number of keys the row sees: the keys a block's product spans beyond them have
// w = 0, and their terms are exact zeros.
void decide_attention_outputs(const AttentionRow& source, const FloatFormat& target,
                              const AttentionRowInDouble& row, std::span<const double> numerators,
                              std::span<const double> magnitudes, AttentionRowResults& results) {
  const std::size_t count = source.active.size();  // the sink (if any) has no value
  const double largest_value = row.tiny_mass != 0 ? largest_value_seen(source) : 0.0;
  const double recursive = gamma_of(static_cast<double>(count) + 1);
  for (std::size_t c = 0; c < source.values.cols; ++c) {
    if (results.output_done[c]) continue;
    // A magnitude of 0 with some value not 0 is a product that underflowed: that column goes on.
    if (magnitudes[c] == 0 && column_is_zero(source, c)) {  // every value 0: exactly +0
      results.output[c] = 0.0;
      results.output_done[c] = true;
      continue;
    }
    const double magnitude = magnitudes[c] * (1 + gamma_of(static_cast<double>(count) + 2));
    const double result = numerators[c] / row.sum;
    if (!std::isfinite(result) || !std::isfinite(magnitude)) continue;
    const double bound =
        ((row.eta_max + recursive) * magnitude / row.sum +
         (row.sum_error + unit_roundoff) * std::fabs(result) +
         (row.tiny_mass * largest_value + static_cast<double>(count) * 0x1p-1074) / row.sum) *
            (1 + 0x1p-20) +
        4 * unit_roundoff * std::fabs(result);
    const auto rounded = round_if_decided(result - bound, result + bound, target);
    // A zero whose interval holds both signs goes on to the Ziv stage, whose exponent range can put
    // it on one side (an output of about -e^-800 underflows double and always straddles 0 here).
    if (!rounded || (*rounded == 0 && result - bound < 0 && result + bound > 0)) continue;
    results.output[c] = *rounded;
    results.output_done[c] = true;
  }
}

// The natural log-sum-exp L = m + ln S, m the largest computed logit (an exact shift: any shift
// gives the same L). Each term of S carries its eta_j, which includes its logit's own error, so
// S is within sum_error relative and ln S within 1.01 sum_error absolute; ln (1 ulp) and the
// final addition round twice more. Base 2 is left to the later stages.
void decide_lse_in_double(const AttentionRowInDouble& row, std::size_t count, AttentionRowResults& results) {
  if (results.lse == nullptr || results.lse_done || results.lse_base2 || results.lse_target->precision() > 24)
    return;
  if (row.sum_error > 0x1p-30) return;
  const double largest =
      *std::max_element(row.logits.begin(), row.logits.begin() + static_cast<std::ptrdiff_t>(count));
  const double log_sum = std::log(row.sum);
  const double lse = largest + log_sum;
  const double bound =
      (1.01 * row.sum_error + 2 * unit_roundoff * std::fabs(log_sum) + 2 * unit_roundoff * std::fabs(lse)) *
      (1 + 0x1p-20);
  if (!std::isfinite(lse)) return;
  if (const auto rounded = round_if_decided(lse - bound, lse + bound, *results.lse_target)) {
    *results.lse = *rounded;
    results.lse_done = true;
  }
}

void decide_attention_weights(const AttentionRow& source, const FloatFormat& target,
                              const AttentionRowInDouble& row, AttentionRowResults& results) {
  if (results.weights.empty()) return;
  for (std::size_t a = 0; a < source.active.size(); ++a) {
    if (results.weight_done[a]) continue;
    const double error = (row.errors[a] + row.sum_error + unit_roundoff) * (1 + 0x1p-20);
    const auto rounded = decide_coefficient(row.exponentials[a], row.sum, error, target);
    if (!rounded) continue;
    results.weights[source.active[a]] = *rounded;
    results.weight_done[a] = true;
  }
}

bool attention_double_stage_applies(const AttentionRow& source, const FloatFormat& target) {
  // Soft-capping's tanh has no certified double version here: the ball stage takes those rows.
  return target.precision() <= 24 && certified_arithmetic() && !source.active.empty() &&
         source.scores.softcap == 0.0;
}

}  // namespace sharpcheck::reference
