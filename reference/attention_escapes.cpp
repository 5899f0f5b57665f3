#include "reference/attention_escapes.hpp"

#include <arb.h>
#include <flint/fmpq.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "core/errors.hpp"
#include "reference/ball_stage.hpp"
#include "reference/exponential_polynomial.hpp"
#include "reference/input_checks.hpp"
#include "reference/ziv_loop.hpp"

namespace sharpcheck::reference {
namespace {

// Writes a ball for every element not yet done, at the given precision.
using Encloser = std::function<void(slong, const std::vector<bool>&, BallVector&)>;
// The element's exact value when it is rational (reference/exponential_polynomial.hpp), else nullopt.
using ExactCase = std::function<std::optional<Rational>(std::size_t)>;

double round_rational(const Rational& value, const FloatFormat& target) {
  return round_exact_ratio(mpq_numref(value.get()), mpq_denref(value.get()), target);
}

// Ziv's loop over every element: balls at doubling precision; after the first pass, each element
// still undecided is asked once whether it is rational (then rounded exactly); the rest are
// irrational, no rounding boundary, and are decided as the balls shrink (the header's argument).
void run_ziv(std::vector<double>& values, std::vector<bool>& done, std::size_t size_hint,
             const FloatFormat& target, const std::string& operation, const Encloser& enclose,
             const ExactCase& exact, ZivStatistics* statistics) {
  if (statistics != nullptr) ++statistics->calls;
  const ZivSchedule schedule = ZivSchedule::for_format(target);
  const auto guard = static_cast<mpfr_prec_t>(2 * std::bit_width(size_hint) + 8);
  BallVector balls(values.size());
  bool exact_tried = false;
  const auto all_done = [&] { return std::find(done.begin(), done.end(), false) == done.end(); };
  if (all_done()) return;
  const auto pass = [&](mpfr_prec_t precision) {
    enclose(static_cast<slong>(precision), done, balls);
    for (std::size_t e = 0; e < values.size(); ++e) {
      if (done[e]) continue;
      if (const auto rounded = round_ball_if_decided(balls[e], target)) {
        values[e] = *rounded;
        done[e] = true;
        if (statistics != nullptr) ++statistics->decided_by_balls;
      }
    }
    if (exact_tried) return all_done();
    exact_tried = true;
    for (std::size_t e = 0; e < values.size(); ++e) {
      if (done[e]) continue;
      if (const auto rational = exact(e)) {
        values[e] = round_rational(*rational, target);
        done[e] = true;
        if (statistics != nullptr) ++statistics->exact_cases;
      }
    }
    return all_done();
  };
  run_ziv_passes(schedule, guard, statistics, pass, [&] {
    return operation + ": element " +
           std::to_string(std::find(done.begin(), done.end(), false) - done.begin());
  });
}

void refuse(InputProblem problem, const std::string& what) { throw InputError(problem, what); }

// NaN or +inf anywhere, or -inf where not allowed, is an InputError naming the entry.
void check_entries(const Matrix& m, const std::string& what, bool minus_infinity_masks) {
  for (std::size_t e = 0; e < m.values.size(); ++e) {
    const double x = m.values[e];
    if (std::isfinite(x) || (minus_infinity_masks && x == -INFINITY)) continue;
    refuse(std::isnan(x) ? InputProblem::nan_value : InputProblem::non_finite_value,
           what + " entry (" + std::to_string(e / m.cols) + ", " + std::to_string(e % m.cols) + ") is " +
               (std::isnan(x) ? "NaN"
                : x > 0       ? "+inf"
                              : "-inf"));
  }
}

void set_ball(arb_ptr ball, const Rational& value, slong precision) {
  fmpq_t q;
  fmpq_init(q);
  fmpq_set_mpq(q, value.get());
  arb_set_fmpq(ball, q, precision);
  fmpq_clear(q);
}

// ---- linear attention ----

// phi(x) = x + 1 (x > 0) or e^x.
void enclose_feature(arb_ptr ball, double x, slong precision) {
  arb_set_d(ball, x);
  if (x > 0) {
    arb_add_ui(ball, ball, 1, precision);
  } else {
    arb_exp(ball, ball, precision);
  }
}

// s_ij = sum_t phi(q_it) phi(k_jt) as exponentials: (q+1)(k+1) e^0, (q+1) e^k, (k+1) e^q or e^(q+k).
ExponentialPolynomial similarity_terms(const Matrix& q, const Matrix& k, std::size_t i, std::size_t j) {
  ExponentialPolynomial terms;
  for (std::size_t t = 0; t < q.cols; ++t) {
    const double a = q(i, t), b = k(j, t);
    Rational exponent(0.0), coefficient(1.0), one(1.0);
    const auto factor = [&](double x) {
      Rational value(x);
      if (x > 0) {
        mpq_add(value.get(), value.get(), one.get());
        mpq_mul(coefficient.get(), coefficient.get(), value.get());
      } else {
        mpq_add(exponent.get(), exponent.get(), value.get());
      }
    };
    factor(a);
    factor(b);
    terms.add(exponent, coefficient);
  }
  return terms;
}

}  // namespace

LinearAttention linear_attention(const Matrix& q, const Matrix& k, const Matrix& v, bool causal,
                                 const FloatFormat& target, ZivStatistics* statistics) {
  if (q.cols == 0 || q.cols != k.cols || v.rows != k.rows || q.rows == 0 || k.rows == 0 || v.cols == 0)
    refuse(InputProblem::shape_mismatch, "linear_attention: Q " + std::to_string(q.rows) + "x" +
                                             std::to_string(q.cols) + ", K " + std::to_string(k.rows) + "x" +
                                             std::to_string(k.cols) + ", V " + std::to_string(v.rows) + "x" +
                                             std::to_string(v.cols));
  check_entries(q, "linear_attention: Q", false);
  check_entries(k, "linear_attention: K", false);
  check_entries(v, "linear_attention: V", false);
  const std::size_t m = q.rows, n = k.rows, d = q.cols, dv = v.cols;
  const auto sees = [&](std::size_t i, std::size_t j) { return !causal || j <= i; };
  std::vector<double> values(m * n + m * dv, 0.0);
  std::vector<bool> done(values.size(), false);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) done[i * n + j] = !sees(i, j);
  }
  const auto enclose = [&](slong p, const std::vector<bool>& decided, BallVector& out) {
    BallVector fq(m * d), fk(n * d), s(n), vb(n * dv);
    for (std::size_t e = 0; e < m * d; ++e) enclose_feature(fq[e], q.values[e], p);
    for (std::size_t e = 0; e < n * d; ++e) enclose_feature(fk[e], k.values[e], p);
    for (std::size_t e = 0; e < n * dv; ++e) arb_set_d(vb[e], v.values[e]);
    Ball total, sum;
    for (std::size_t i = 0; i < m; ++i) {
      arb_zero(total.get());
      for (std::size_t j = 0; j < n && sees(i, j); ++j) {
        arb_dot(s[j], nullptr, 0, fq[i * d], 1, fk[j * d], 1, static_cast<slong>(d), p);
        arb_add(total.get(), total.get(), s[j], p);
      }
      for (std::size_t j = 0; j < n && sees(i, j); ++j) {
        if (!decided[i * n + j]) arb_div(out[i * n + j], s[j], total.get(), p);
      }
      for (std::size_t c = 0; c < dv; ++c) {
        const std::size_t e = m * n + i * dv + c;
        if (decided[e]) continue;
        const std::size_t visible = causal ? std::min(i + 1, n) : n;
        arb_dot(sum.get(), nullptr, 0, s[0], 1, vb[c], static_cast<slong>(dv), static_cast<slong>(visible),
                p);
        arb_div(out[e], sum.get(), total.get(), p);
      }
    }
  };
  const auto exact = [&](std::size_t e) -> std::optional<Rational> {
    const bool weight = e < m * n;
    const std::size_t i = weight ? e / n : (e - m * n) / dv;
    ExponentialPolynomial numerator, denominator;
    for (std::size_t j = 0; j < n && sees(i, j); ++j) {
      const ExponentialPolynomial s_ij = similarity_terms(q, k, i, j);
      denominator.add_scaled(s_ij, Rational(1.0));
      if (weight && j == e % n) numerator.add_scaled(s_ij, Rational(1.0));
      if (!weight) numerator.add_scaled(s_ij, Rational(v(j, (e - m * n) % dv)));
    }
    return rational_ratio(std::move(numerator), std::move(denominator));
  };
  run_ziv(values, done, n * d, target, "linear_attention", enclose, exact, statistics);
  LinearAttention result{Matrix(m, n), Matrix(m, dv)};
  std::copy_n(values.begin(), m * n, result.weights.values.begin());
  std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(m * n), m * dv, result.outputs.values.begin());
  return result;
}

namespace {

// Row softmax balls of exact rational logits z over the entries `visible` (others untouched).
void enclose_softmax(const std::vector<Rational>& z, const std::vector<std::size_t>& visible, slong p,
                     BallVector& scratch, arb_ptr total) {
  double largest = -INFINITY;
  for (const std::size_t j : visible) largest = std::max(largest, mpq_get_d(z[j].get()));
  Ball shift;
  arb_set_d(shift.get(), largest);
  arb_zero(total);
  for (const std::size_t j : visible) {
    set_ball(scratch[j], z[j], p);
    arb_sub(scratch[j], scratch[j], shift.get(), p);
    arb_exp(scratch[j], scratch[j], p);
    arb_add(total, total, scratch[j], p);
  }
}

ExponentialPolynomial exponentials(const std::vector<Rational>& z, const std::vector<std::size_t>& visible) {
  ExponentialPolynomial sum;
  for (const std::size_t j : visible) sum.add(z[j], Rational(1.0));
  return sum;
}

}  // namespace

Matrix selective_attention_weights(const Matrix& logits, const Matrix& selection, const FloatFormat& target,
                                   ZivStatistics* statistics) {
  const std::size_t n = logits.rows;
  if (n == 0 || logits.cols != n || selection.rows != n || selection.cols != n)
    refuse(InputProblem::shape_mismatch,
           "selective_attention_weights: logits and selection must both be n x n");
  check_entries(logits, "selective_attention_weights: logits", true);
  check_entries(selection, "selective_attention_weights: selection", true);
  // z_ij = logits_ij - F_ij exactly, F accumulated down the rows.
  std::vector<std::vector<Rational>> z(n, std::vector<Rational>(n));
  std::vector<std::vector<std::size_t>> visible(n);
  std::vector<Rational> penalty(n, Rational(0.0));
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) {  // token i - 1's selection now applies: S'_{i-1, j} for 1 <= j < i - 1
      for (std::size_t j = 1; j + 1 < i; ++j) {
        const double chosen = selection(i - 1, j);
        if (chosen > 0) mpq_add(penalty[j].get(), penalty[j].get(), Rational(chosen).get());
      }
    }
    for (std::size_t j = 0; j <= i; ++j) {
      if (logits(i, j) == -INFINITY) continue;
      mpq_sub(z[i][j].get(), Rational(logits(i, j)).get(), penalty[j].get());
      visible[i].push_back(j);
    }
    if (visible[i].empty())
      refuse(InputProblem::out_of_range,
             "selective_attention_weights: row " + std::to_string(i) + " sees no key (every logit -inf)");
  }
  std::vector<double> values(n * n, 0.0);
  std::vector<bool> done(n * n, true);
  for (std::size_t i = 0; i < n; ++i) {
    for (const std::size_t j : visible[i]) done[i * n + j] = false;
  }
  const auto enclose = [&](slong p, const std::vector<bool>&, BallVector& out) {
    BallVector scratch(n);
    Ball total;
    for (std::size_t i = 0; i < n; ++i) {
      enclose_softmax(z[i], visible[i], p, scratch, total.get());
      for (const std::size_t j : visible[i]) arb_div(out[i * n + j], scratch[j], total.get(), p);
    }
  };
  const auto exact = [&](std::size_t e) {
    ExponentialPolynomial numerator;
    numerator.add(z[e / n][e % n], Rational(1.0));
    return rational_ratio(std::move(numerator), exponentials(z[e / n], visible[e / n]));
  };
  run_ziv(values, done, n, target, "selective_attention_weights", enclose, exact, statistics);
  Matrix result(n, n);
  result.values = values;
  return result;
}

Matrix differential_attention_weights(const Matrix& logits1, const Matrix& logits2, double lambda,
                                      const FloatFormat& target, ZivStatistics* statistics) {
  const std::size_t m = logits1.rows, n = logits1.cols;
  if (m == 0 || n == 0 || logits2.rows != m || logits2.cols != n)
    refuse(InputProblem::shape_mismatch,
           "differential_attention_weights: the two logit matrices differ in shape");
  check_entries(logits1, "differential_attention_weights: logits1", true);
  check_entries(logits2, "differential_attention_weights: logits2", true);
  if (!std::isfinite(lambda))
    refuse(InputProblem::non_finite_value, "differential_attention_weights: lambda");
  std::vector<std::vector<Rational>> a(m, std::vector<Rational>(n)), b(m, std::vector<Rational>(n));
  std::vector<std::vector<std::size_t>> first(m), second(m);
  std::vector<double> values(m * n, 0.0);
  std::vector<bool> done(m * n, true);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (logits1(i, j) != -INFINITY) first[i].push_back(j), a[i][j] = Rational(logits1(i, j));
      if (logits2(i, j) != -INFINITY) second[i].push_back(j), b[i][j] = Rational(logits2(i, j));
      done[i * n + j] = logits1(i, j) == -INFINITY && logits2(i, j) == -INFINITY;
    }
    if (first[i].empty() || second[i].empty())
      refuse(InputProblem::out_of_range,
             "differential_attention_weights: row " + std::to_string(i) + " is fully masked in one softmax");
  }
  const auto enclose = [&](slong p, const std::vector<bool>& decided, BallVector& out) {
    BallVector p1(n), p2(n);
    Ball total1, total2, scale, term;
    arb_set_d(scale.get(), lambda);
    for (std::size_t i = 0; i < m; ++i) {
      enclose_softmax(a[i], first[i], p, p1, total1.get());
      enclose_softmax(b[i], second[i], p, p2, total2.get());
      for (std::size_t j = 0; j < n; ++j) {
        if (decided[i * n + j]) continue;
        arb_zero(out[i * n + j]);
        if (logits1(i, j) != -INFINITY) arb_div(out[i * n + j], p1[j], total1.get(), p);
        if (logits2(i, j) == -INFINITY) continue;
        arb_div(term.get(), p2[j], total2.get(), p);
        arb_submul(out[i * n + j], scale.get(), term.get(), p);
      }
    }
  };
  // w_j = (e^{a_j} S2 - lambda e^{b_j} S1) / (S1 S2): every exponent a sum a_k + b_l.
  const auto exact = [&](std::size_t e) -> std::optional<Rational> {
    const std::size_t i = e / n, j = e % n;
    if (first[i].size() * second[i].size() > std::size_t{2048} * 2048)
      return std::nullopt;  // the header's gap
    ExponentialPolynomial numerator, denominator;
    Rational sum, minus_lambda(-lambda);
    for (const std::size_t k : first[i]) {
      for (const std::size_t l : second[i]) {
        mpq_add(sum.get(), a[i][k].get(), b[i][l].get());
        denominator.add(sum, Rational(1.0));
        if (k == j) numerator.add(sum, Rational(1.0));
        if (l == j) numerator.add(sum, minus_lambda);
      }
    }
    return rational_ratio(std::move(numerator), std::move(denominator));
  };
  run_ziv(values, done, n, target, "differential_attention_weights", enclose, exact, statistics);
  Matrix result(m, n);
  result.values = values;
  return result;
}

double differential_lambda_init(int layer) { return 0.8 - 0.6 * std::exp(-0.3 * (layer - 1)); }

}  // namespace sharpcheck::reference
