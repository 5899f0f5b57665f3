// The exact cases of attention, and why the Ziv loop terminates on everything else.
//
// Termination, by Lindemann-Weierstrass (distinct algebraic exponents have linearly independent
// exponentials over the algebraic numbers). Entry j of a row has the logit
// x_j = (s a_j + b_j) / theta with a_j = Q_i . K_j rational (exact dot product of doubles),
// b_j = additive - slope * distance rational, theta rational, and s = scale / 1 (a double) or
// 1/sqrt(d), algebraic; a sink is one more entry with a = 0, b = sink and value 0. Group the
// entries by equal x (group g: exponent x_g, c_g entries, value sums W_g per column). Then:
//  - an output o = sum_g W_g e^{x_g} / sum_g c_g e^{x_g} equal to a rational r gives
//    sum_g (W_g - r c_g) e^{x_g} = 0, so W_g = r c_g for every g: o is rational exactly when every
//    group has the same mean, and then o is that mean;
//  - a weight e^{x_j} / sum_g c_g e^{x_g} is rational only with one group, and is then 1/c;
//  - the log-sum-exp L = ln sum_g c_g e^{x_g} equal to a rational r gives
//    sum_g c_g e^{x_g} - e^r = 0, so one group, c = 1 and x = r: L is rational exactly when the
//    row has one entry and its logit is rational, and then L is that logit;
//  - the base-2 log-sum-exp L / ln 2 = r rational makes sum_g c_g e^{x_g} = 2^r algebraic, so
//    the only group has x = 0 and the sum is c: L2 = log2(c), rational exactly when c is a power
//    of two (an integer then), irrational otherwise.
// Every other result is irrational and so not a rounding boundary (those are rational), and
// Ziv's loop decides it at a finite precision.
//
// Grouping needs exact equality of the x_j. When s is rational (a given scale, or d a perfect
// square) x_j theta = s a_j + b_j is compared as a rational. When s = 1/sqrt(d) is irrational,
// s a + b = s a' + b' holds exactly when a = a' and b = b', so the pairs (a, b) are compared.
//
// Soft-capping makes the exponent cap tanh(s a / cap) + b, transcendental where s a != 0, and
// Lindemann-Weierstrass no longer applies: the argument is incomplete. Grouping by (a, b) is
// still sound (equal pairs give equal logits), so the equal-means and one-group cases above are
// still found and rounded exactly; a rational result outside them cannot be excluded, so if the
// loop fails to decide one it reaches its cap and reports UndecidedRounding, never a guess.
#include <gmp.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/mpfr_number.hpp"
#include "core/rational.hpp"
#include "reference/attention_row.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {
namespace {

int compare(const Rational& x, const Rational& y) { return mpq_cmp(x.get(), y.get()); }

double round_rational(const Rational& value, const FloatFormat& target) {
  return round_exact_ratio(mpq_numref(value.get()), mpq_denref(value.get()), target);
}

struct Entry {
  Rational dot;   // s a when s is rational, else a
  Rational bias;  // b
  Rational key;   // s a + b when s is rational and there is no soft-cap (the logit times theta)
};

struct ExactRow {
  std::vector<Entry> entries;
  bool by_value = false;  // group by `key` (else by the pair (dot, bias))
  std::vector<std::vector<std::size_t>> groups;
};

ExactRow group_entries(const AttentionRow& row) {
  ExactRow exact;
  const std::optional<Rational> scale = rational_scale(row.scores, row.keys.cols);
  exact.by_value = scale.has_value() && row.scores.softcap == 0.0;
  exact.entries.resize(row.entries());
  for (std::size_t e = 0; e < exact.entries.size(); ++e) {
    Entry& entry = exact.entries[e];
    if (e < row.active.size()) {
      entry.dot = exact_dot(row.query, row.keys.row(row.active[e]));  // a_j = Q_i . K_j
      // s a where s is rational: with a soft-cap the pairs are (s a, b), so that scale 0 makes
      // every capped score 0 whatever a is (grouping by a would split a row of equal logits).
      if (scale) mpq_mul(entry.dot.get(), entry.dot.get(), scale->get());
      if (!row.bias.empty()) entry.bias = exact_bias(row.bias[e]);
    } else {
      entry.bias = Rational(*row.scores.sink);
    }
    if (exact.by_value) mpq_add(entry.key.get(), entry.dot.get(), entry.bias.get());
  }
  const auto less = [&exact](std::size_t x, std::size_t y) {
    const Entry& p = exact.entries[x];
    const Entry& q = exact.entries[y];
    if (exact.by_value) return compare(p.key, q.key) < 0;
    const int by_dot = compare(p.dot, q.dot);
    return by_dot != 0 ? by_dot < 0 : compare(p.bias, q.bias) < 0;
  };
  std::vector<std::size_t> order(exact.entries.size());
  for (std::size_t e = 0; e < order.size(); ++e) order[e] = e;
  std::sort(order.begin(), order.end(), less);
  for (std::size_t position = 0; position < order.size(); ++position) {
    if (position == 0 || less(order[position - 1], order[position])) exact.groups.emplace_back();
    exact.groups.back().push_back(order[position]);
  }
  return exact;
}

// Column c of value v_e (the sink's value is 0).
double value_of(const AttentionRow& row, std::size_t entry, std::size_t column) {
  return entry < row.active.size() ? row.values(row.active[entry], column) : 0.0;
}

long decide_outputs_exactly(const AttentionRow& row, const ExactRow& exact, const FloatFormat& target,
                            AttentionRowResults& results) {
  long decided = 0;
  Rational sum;
  Rational value;
  Rational left;
  Rational right;
  for (std::size_t column = 0; column < row.values.cols; ++column) {
    if (results.output_done[column]) continue;
    std::vector<Rational> group_sums(exact.groups.size());
    for (std::size_t g = 0; g < exact.groups.size(); ++g) {
      for (const std::size_t e : exact.groups[g]) {
        mpq_set_d(value.get(), value_of(row, e, column));
        mpq_add(group_sums[g].get(), group_sums[g].get(), value.get());
      }
    }
    bool equal_means = true;
    for (std::size_t g = 1; g < exact.groups.size() && equal_means; ++g) {
      mpq_set_ui(value.get(), exact.groups[0].size(), 1);
      mpq_mul(left.get(), group_sums[g].get(), value.get());
      mpq_set_ui(value.get(), exact.groups[g].size(), 1);
      mpq_mul(right.get(), group_sums[0].get(), value.get());
      equal_means = mpq_equal(left.get(), right.get()) != 0;
    }
    if (!equal_means) continue;
    mpq_set_ui(value.get(), exact.groups[0].size(), 1);
    mpq_div(sum.get(), group_sums[0].get(), value.get());
    results.output[column] = round_rational(sum, target);
    results.output_done[column] = true;
    ++decided;
  }
  return decided;
}

bool is_zero(const Rational& x) { return mpq_sgn(x.get()) == 0; }

// A group's exponent x_g = (softcap(s a) + b) / theta in double, and a bound on its error (the
// rationals' conversions, the scale's square root and the soft-cap's tanh, each within a few
// ulps; 1e-12 of the terms' sizes is far above them).
struct Exponent {
  double value = 0, error = 0;
};

Exponent group_exponent(const AttentionRow& row, const ExactRow& exact, std::size_t g) {
  const Entry& entry = exact.entries[exact.groups[g].front()];
  const double theta = row.scores.theta;
  if (exact.by_value) {
    const double x = mpq_get_d(entry.key.get()) / theta;
    return {x, 1e-12 * std::fabs(x) + 1e-300};
  }
  const bool scaled = rational_scale(row.scores, row.keys.cols).has_value();  // dot holds s a then
  const double dot = mpq_get_d(entry.dot.get());
  const double irrational =
      row.scores.scale_is_ln2 ? std::numbers::ln2 : 1 / std::sqrt(static_cast<double>(row.keys.cols));
  const double sa = scaled ? dot : dot * irrational;
  const double cap = row.scores.softcap;
  const double capped = cap != 0.0 ? cap * std::tanh(sa / cap) : sa;
  const double bias = mpq_get_d(entry.bias.get());
  return {(capped + bias) / theta,
          1e-12 * (std::fabs(sa) + std::fabs(capped) + std::fabs(bias)) / std::fabs(theta) + 1e-300};
}

double log_of_magnitude(const Rational& x) {
  MpfrNumber m(64);
  mpfr_set_q(m.get(), x.get(), MPFR_RNDN);
  mpfr_abs(m.get(), m.get(), MPFR_RNDN);
  mpfr_log(m.get(), m.get(), MPFR_RNDN);
  return mpfr_get_d(m.get(), MPFR_RNDN);
}

// A tie broken by exponentially small weights (an additive mask of -1e9 or finfo.min on keys
// whose values break a row's equal means): o = sum_g W_g e^x_g / sum_g c_g e^x_g with the top
// group's mean r = W_t / c_t, so o - r = sum_g d_g e^x_g / sum_g c_g e^x_g with d_g = W_g - r c_g
// (rational; 0 for every group of mean r). Where the deviating group g* of largest exponent
// dominates the others (sum_{g != g*} |d_g| e^(x_g - x_g*) <= |d_g*| / 2), o - r has d_g*'s sign
// and |o - r| <= 1.5 |d_g*| e^(x_g* - x_t) / c_t; beyond a few thousand below the top no precision
// Ziv's loop can reach separates o from r, but this decides it whenever r is a midpoint.
long decide_outputs_by_their_tail(const AttentionRow& row, const ExactRow& exact, const FloatFormat& target,
                                  AttentionRowResults& results) {
  const std::size_t groups = exact.groups.size();
  if (groups < 2) return 0;
  std::vector<Exponent> x(groups);
  std::size_t top = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    x[g] = group_exponent(row, exact, g);
    if (!std::isfinite(x[g].value)) return 0;
    if (x[g].value > x[top].value) top = g;
  }
  for (std::size_t g = 0; g < groups; ++g)  // the top group must be the top whatever the errors
    if (g != top && x[g].value + x[g].error >= x[top].value - x[top].error) return 0;
  long decided = 0;
  Rational value, r, count;
  std::vector<Rational> deviation(groups);
  for (std::size_t column = 0; column < row.values.cols; ++column) {
    if (results.output_done[column]) continue;
    std::size_t leading = groups;  // g*
    for (std::size_t g = 0; g < groups; ++g) {
      Rational sum;
      for (const std::size_t e : exact.groups[g]) {
        mpq_set_d(value.get(), value_of(row, e, column));
        mpq_add(sum.get(), sum.get(), value.get());
      }
      if (g == top) {
        mpq_set_ui(count.get(), exact.groups[g].size(), 1);
        mpq_div(r.get(), sum.get(), count.get());
      }
      deviation[g] = sum;  // W_g, made d_g below once r is known
    }
    for (std::size_t g = 0; g < groups; ++g) {
      mpq_set_ui(count.get(), exact.groups[g].size(), 1);
      mpq_mul(value.get(), r.get(), count.get());
      mpq_sub(deviation[g].get(), deviation[g].get(), value.get());
      if (!is_zero(deviation[g]) && (leading == groups || x[g].value > x[leading].value)) leading = g;
    }
    if (leading == groups) continue;  // equal means: decide_outputs_exactly's case
    const double log_lead = log_of_magnitude(deviation[leading]);
    double others = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      if (g == leading || is_zero(deviation[g])) continue;
      others += std::exp(log_of_magnitude(deviation[g]) - log_lead + x[g].value - x[leading].value +
                         x[g].error + x[leading].error) +
                1e-300;
    }
    if (!(others <= 0.5)) continue;
    const double log_delta = log_lead + std::log(1.5) + x[leading].value - x[top].value + x[leading].error +
                             x[top].error - std::log(static_cast<double>(exact.groups[top].size()));
    const auto rounded = round_near_boundary(r.get(), mpq_sgn(deviation[leading].get()), log_delta, target);
    if (!rounded) continue;
    results.output[column] = *rounded;
    results.output_done[column] = true;
    ++decided;
  }
  return decided;
}

long decide_weights_exactly(const AttentionRow& row, const ExactRow& exact, const FloatFormat& target,
                            AttentionRowResults& results) {
  if (exact.groups.size() != 1 || results.weights.empty()) return 0;
  Rational weight;
  mpq_set_ui(weight.get(), 1, row.entries());
  const double rounded = round_rational(weight, target);
  long decided = 0;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    if (results.weight_done[a]) continue;
    results.weights[row.active[a]] = rounded;
    results.weight_done[a] = true;
    ++decided;
  }
  return decided;
}

// Entry e's logit x = (s a + b) / theta where it is rational (grouped by value, or a = 0 whatever s
// is, soft-cap(0) being 0); nullopt where it is irrational.
std::optional<Rational> rational_logit(const AttentionRow& row, const ExactRow& exact, std::size_t e) {
  const Entry& entry = exact.entries[e];
  Rational logit;
  if (exact.by_value) {
    logit = entry.key;
  } else if (is_zero(entry.dot)) {
    logit = entry.bias;
  } else {
    return std::nullopt;
  }
  Rational theta(row.scores.theta);
  mpq_div(logit.get(), logit.get(), theta.get());
  return logit;
}

// One entry far above the rest (a key beside others hidden by a finite mask): L = x_top +
// ln(1 + S), S = sum_{g != top} c_g e^(x_g - x_top), so L lies above x_top by at most S, checked
// with rounded-outward exponents; where x_top is rational and a midpoint of the LSE's format
// (or representable) and S is below a quarter of the spacing, L rounds up from it (or to it).
bool decide_lse_by_its_tail(const AttentionRow& row, const ExactRow& exact, AttentionRowResults& results) {
  const std::size_t groups = exact.groups.size();
  if (groups < 2) return false;
  std::vector<Exponent> x(groups);
  std::size_t top = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    x[g] = group_exponent(row, exact, g);
    if (!std::isfinite(x[g].value)) return false;
    if (x[g].value > x[top].value) top = g;
  }
  if (exact.groups[top].size() != 1) return false;
  double tail = 1e-300;
  for (std::size_t g = 0; g < groups; ++g) {
    if (g == top) continue;
    tail += static_cast<double>(exact.groups[g].size()) *
            std::exp(x[g].value - x[top].value + x[g].error + x[top].error) * (1 + 1e-12);
  }
  const std::optional<Rational> logit = rational_logit(row, exact, exact.groups[top].front());
  if (!logit) return false;
  const auto rounded = round_near_boundary(logit->get(), 1, std::log(tail), *results.lse_target);
  if (!rounded) return false;
  *results.lse = *rounded;
  return results.lse_done = true;
}

bool decide_lse_exactly(const AttentionRow& row, const ExactRow& exact, AttentionRowResults& results) {
  if (results.lse == nullptr || results.lse_done) return false;
  const std::size_t count = row.entries();
  if (results.lse_base2) {
    const Entry& first = exact.entries[0];
    const bool all_zero = exact.groups.size() == 1 && is_zero(first.bias) && is_zero(first.dot);
    if (!all_zero || !std::has_single_bit(count)) return false;
    *results.lse =
        round_to_format(static_cast<double>(std::bit_width(count) - 1), *results.lse_target);  // log2 of 2^k
    return results.lse_done = true;
  }
  if (count == 1) {
    const std::optional<Rational> logit = rational_logit(row, exact, 0);
    if (!logit) return false;  // an irrational logit: the loop decides it
    *results.lse = round_rational(*logit, *results.lse_target);
    return results.lse_done = true;
  }
  return decide_lse_by_its_tail(row, exact, results);
}
// Base-2 scores (scale_is_ln2: x_j = a_j ln 2 / theta; no bias, cap or sink). e^x_j = 2^(a_j / theta)
// is algebraic, not covered by the argument at the top: where every e_j = (a_j - a_top) / theta is
// an integer (|e_j| <= 4096), the weights 2^e_j / sum_k 2^e_k are rational, so each output is the
// rational sum_j 2^e_j v_j / sum_j 2^e_j, rounded here exactly (a midpoint, such as partials of
// LSE 0, -1, -1 merging 1 and 2^-24 twice to 1/2 + 2^-25, no loop decides), and the base-2
// log-sum-exp a_top / theta + log2 sum_j 2^e_j is rational when that sum is a power of two.
long decide_base2_exactly(const AttentionRow& row, const ExactRow& exact, const FloatFormat& target,
                          AttentionRowResults& results) {
  if (!row.scores.scale_is_ln2 || row.scores.softcap != 0.0 || row.has_sink() || exact.entries.empty())
    return 0;
  const Rational theta(row.scores.theta);
  std::size_t top = 0;
  for (std::size_t e = 0; e < exact.entries.size(); ++e) {
    if (!is_zero(exact.entries[e].bias)) return 0;
    const int order = compare(exact.entries[e].dot, exact.entries[top].dot);
    if (row.scores.theta > 0 ? order > 0 : order < 0) top = e;
  }
  std::vector<Rational> weights(exact.entries.size());
  Rational sum, term;
  for (std::size_t e = 0; e < exact.entries.size(); ++e) {
    mpq_sub(term.get(), exact.entries[e].dot.get(), exact.entries[top].dot.get());
    mpq_div(term.get(), term.get(), theta.get());  // e_j <= 0
    if (mpz_cmp_ui(mpq_denref(term.get()), 1) != 0 || mpz_cmpabs_ui(mpq_numref(term.get()), 4096) > 0)
      return 0;
    mpq_set_ui(weights[e].get(), 1, 1);
    mpq_div_2exp(weights[e].get(), weights[e].get(), mpz_get_ui(mpq_numref(term.get())));  // |e_j|
    mpq_add(sum.get(), sum.get(), weights[e].get());
  }
  long decided = 0;
  for (std::size_t column = 0; column < row.values.cols; ++column) {
    if (results.output_done[column]) continue;
    Rational numerator, value;
    for (std::size_t e = 0; e < exact.entries.size(); ++e) {
      mpq_set_d(value.get(), value_of(row, e, column));
      mpq_mul(value.get(), value.get(), weights[e].get());
      mpq_add(numerator.get(), numerator.get(), value.get());
    }
    mpq_div(numerator.get(), numerator.get(), sum.get());
    results.output[column] = round_rational(numerator, target);
    results.output_done[column] = true;
    ++decided;
  }
  // sum = n / 2^k (n odd or k = 0): a power of two exactly when n is one.
  if (results.lse != nullptr && !results.lse_done && results.lse_base2 &&
      mpz_popcount(mpq_numref(sum.get())) == 1) {
    const long log2_sum = static_cast<long>(mpz_sizeinbase(mpq_numref(sum.get()), 2)) - 1 -
                          (static_cast<long>(mpz_sizeinbase(mpq_denref(sum.get()), 2)) - 1);
    Rational lse;
    mpq_div(lse.get(), exact.entries[top].dot.get(), theta.get());
    mpq_set_si(term.get(), log2_sum, 1);
    mpq_add(lse.get(), lse.get(), term.get());
    *results.lse = round_rational(lse, *results.lse_target);
    results.lse_done = true;
    ++decided;
  }
  return decided;
}

}  // namespace

std::optional<Rational> rational_scale(const tensor::HeadScores& scores, std::size_t dim) {
  if (scores.scale_is_ln2) return std::nullopt;  // ln 2 is irrational
  if (scores.scale) return Rational(*scores.scale);
  const auto d = static_cast<unsigned long>(dim);
  const auto root = static_cast<unsigned long>(std::llround(std::sqrt(static_cast<double>(d))));
  if (root * root != d) return std::nullopt;
  Rational scale;
  mpq_set_ui(scale.get(), 1, root);
  return scale;
}

// Each product of two doubles is a dyadic rational m 2^e with |m| < 2^106: the products are summed
// as integers over their least exponent and the sum made a rational once (mpq_add per term
// canonicalised, a gcd each time, which made the backward's exact stage on a head of equal keys
// take minutes).
Rational exact_dot(std::span<const double> x, std::span<const double> y) {
  const auto split = [](double v, std::int64_t& mantissa) {
    int exponent = 0;
    mantissa = static_cast<std::int64_t>(std::ldexp(std::frexp(v, &exponent), 53));  // exact: 53 bits
    return exponent - 53;
  };
  int least = INT_MAX;
  for (std::size_t t = 0; t < x.size(); ++t) {
    if (x[t] == 0.0 || y[t] == 0.0) continue;
    std::int64_t m = 0;
    least = std::min(least, split(x[t], m) + split(y[t], m));
  }
  Rational sum;
  if (least == INT_MAX) return sum;
  mpz_t total, term;
  mpz_init(total);
  mpz_init(term);
  for (std::size_t t = 0; t < x.size(); ++t) {
    if (x[t] == 0.0 || y[t] == 0.0) continue;
    std::int64_t mx = 0, my = 0;
    const int exponent = split(x[t], mx) + split(y[t], my);
    mpz_set_si(term, static_cast<long>(mx));
    mpz_mul_si(term, term, static_cast<long>(my));
    mpz_mul_2exp(term, term, static_cast<mp_bitcnt_t>(exponent - least));
    mpz_add(total, total, term);
  }
  mpq_set_z(sum.get(), total);
  if (least < 0)
    mpq_div_2exp(sum.get(), sum.get(), static_cast<mp_bitcnt_t>(-least));
  else
    mpq_mul_2exp(sum.get(), sum.get(), static_cast<mp_bitcnt_t>(least));
  mpz_clear(total);
  mpz_clear(term);
  return sum;
}

Rational exact_bias(const tensor::HeadScores::BiasTerms& terms) {
  Rational bias(terms.additive);
  Rational alibi(terms.slope);
  Rational distance;
  mpq_set_si(distance.get(), terms.distance, 1);
  mpq_mul(alibi.get(), alibi.get(), distance.get());
  mpq_sub(bias.get(), bias.get(), alibi.get());
  return bias;
}

long apply_attention_exact_cases(const AttentionRow& row, const FloatFormat& target,
                                 AttentionRowResults& results) {
  const ExactRow exact = group_entries(row);
  long decided = decide_base2_exactly(row, exact, target, results);
  decided += decide_outputs_exactly(row, exact, target, results);
  decided += decide_outputs_by_their_tail(row, exact, target, results);
  decided += decide_weights_exactly(row, exact, target, results);
  if (decide_lse_exactly(row, exact, results)) ++decided;  // in its own format
  return decided;
}

}  // namespace sharpcheck::reference
