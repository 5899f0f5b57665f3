// The paper's bounds as chains of real-arithmetic steps. Quantities that are exponentials or
// logarithms are real variables named after the term they stand for ("exp(M/theta)"), related
// only by the named axiom instances each step lists; arguments of exp are variables fixed by
// definitional premises (z * theta = e), so every formula is polynomial and nlsat decides it.
#include <string>

#include "proofs/obligation.hpp"

namespace sharpcheck::proofs {
namespace {

using z3::expr;

expr variable(z3::context& context, const std::string& name) { return context.real_const(name.c_str()); }
expr number(z3::context& context, const char* rational) { return context.real_val(rational); }

// exp is increasing: x <= y implies exp(x) <= exp(y), instantiated for two named terms.
NamedFormula exp_monotone(const std::string& x, const std::string& y, const expr& argument_x,
                          const expr& argument_y, const expr& exp_x, const expr& exp_y) {
  return {"exp monotone: " + x + " <= " + y + " => exp(" + x + ") <= exp(" + y + ")",
          z3::implies(argument_x <= argument_y, exp_x <= exp_y)};
}

// The quantities of Lemma 2.1 for a row of logits in [m, M] at temperature theta.
struct LemmaTerms {
  expr m, M, theta, zm, zM, exp_m, exp_M, exp_delta, exp_minus_delta;
  explicit LemmaTerms(z3::context& c)
      : m(variable(c, "m")),
        M(variable(c, "M")),
        theta(variable(c, "theta")),
        zm(variable(c, "m/theta")),
        zM(variable(c, "M/theta")),
        exp_m(variable(c, "exp(m/theta)")),
        exp_M(variable(c, "exp(M/theta)")),
        exp_delta(variable(c, "exp(delta/theta)")),
        exp_minus_delta(variable(c, "exp(-delta/theta)")) {}

  [[nodiscard]] std::vector<NamedFormula> premises() const {
    return {{"m <= M", m <= M},
            {"theta > 0", theta > 0},
            {"definition: m/theta", zm * theta == m},
            {"definition: M/theta", zM * theta == M}};
  }
  [[nodiscard]] std::vector<NamedFormula> axioms() const {
    return {{"exp positive: exp(m/theta) > 0", exp_m > 0},
            {"exp(a - b) = exp(a)/exp(b): exp(delta/theta) exp(m/theta) = exp(M/theta)",
             exp_delta * exp_m == exp_M},
            {"exp(a - b) = exp(a)/exp(b): exp(-delta/theta) exp(M/theta) = exp(m/theta)",
             exp_minus_delta * exp_M == exp_m}};
  }
};

// One coefficient p = exp(e_k/theta) / S of a row of n logits in [m, M], with the sum bounds
// given either symbolically (n real) or by an explicit sum of n terms.
Statement lemma_coefficient(z3::context& c, int unrolled_terms, bool upper, bool mutant) {
  const LemmaTerms t(c);
  Statement statement{t.premises(), t.axioms(), c.bool_val(true)};
  const expr n = unrolled_terms > 0 ? c.real_val(unrolled_terms) : variable(c, "n");
  const expr p = variable(c, "p");
  const expr sum = variable(c, "S");
  std::vector<expr> exponentials;
  const int terms = unrolled_terms > 0 ? unrolled_terms : 1;
  for (int i = 1; i <= terms; ++i) {
    const std::string index = unrolled_terms > 0 ? std::to_string(i) : "k";
    const expr e = variable(c, "e_" + index);
    const expr z = variable(c, "e_" + index + "/theta");
    const expr w = variable(c, "exp(e_" + index + "/theta)");
    statement.premises.push_back({"m <= e_" + index + " <= M", t.m <= e && e <= t.M});
    statement.premises.push_back({"definition: e_" + index + "/theta", z * t.theta == e});
    statement.axioms.push_back(exp_monotone("m/theta", "e_" + index + "/theta", t.zm, z, t.exp_m, w));
    statement.axioms.push_back(exp_monotone("e_" + index + "/theta", "M/theta", z, t.zM, w, t.exp_M));
    exponentials.push_back(w);
  }
  if (unrolled_terms > 0) {
    expr total = exponentials[0];
    for (std::size_t i = 1; i < exponentials.size(); ++i) total = total + exponentials[i];
    statement.premises.push_back({"definition: S = sum of the n exponentials", sum == total});
  } else {
    statement.premises.push_back({"n >= 1", n >= 1});
    statement.premises.push_back({"S >= n exp(m/theta) (n terms, each >= exp(m/theta))", sum >= n * t.exp_m});
    statement.premises.push_back({"S <= n exp(M/theta) (n terms, each <= exp(M/theta))", sum <= n * t.exp_M});
  }
  statement.premises.push_back({"definition: p = exp(e_k/theta) / S", p * sum == exponentials[0]});
  if (upper) {
    // p <= exp(delta/theta)/n; the mutant claims the false p <= 1/n.
    statement.conclusion = mutant ? p * n <= 1 : p * n <= t.exp_delta;
  } else {
    statement.conclusion = mutant ? p * n >= 1 : p * n >= t.exp_minus_delta;
  }
  return statement;
}

Statement shifted_exponential_in_range(z3::context& c, bool mutant) {
  const expr m = variable(c, "m");
  const expr M = variable(c, "M");
  const expr e = variable(c, "e_k");
  const expr theta = variable(c, "theta");
  const expr shifted = variable(c, "(e_k-M)/theta");
  const expr minus_delta = variable(c, "-delta/theta");
  const expr w = variable(c, "exp((e_k-M)/theta)");
  const expr lower = variable(c, "exp(-delta/theta)");
  const expr one = c.real_val(1);
  Statement statement{{{"m <= e_k <= M", m <= e && e <= M},
                       {"theta > 0", theta > 0},
                       {"definition: (e_k-M)/theta", shifted * theta == e - M},
                       {"definition: -delta/theta", minus_delta * theta == m - M}},
                      {exp_monotone("-delta/theta", "(e_k-M)/theta", minus_delta, shifted, lower, w),
                       {"exp monotone with exp(0) = 1: (e_k-M)/theta <= 0 => exp((e_k-M)/theta) <= 1",
                        z3::implies(shifted <= 0, w <= one)}},
                      c.bool_val(true)};
  statement.conclusion = mutant ? lower <= w && w < one : lower <= w && w <= one;
  return statement;
}

Statement threshold(z3::context& c, bool mutant) {
  const expr n = variable(c, "n");
  const expr epsilon = variable(c, "eps");
  const expr bound = variable(c, "exp(delta/theta)");
  return {{{"0 < eps <= 1", epsilon > 0 && epsilon <= 1},
           {"n >= 1", n >= 1},
           {"n > exp(delta/theta)/eps", n * epsilon > bound}},
          {{"exp(x) >= 1 for x = delta/theta >= 0", bound >= 1}},
          mutant ? bound < epsilon * n / 2 : bound < epsilon * n};
}

Statement tight_bound_holds(z3::context& c, bool mutant) {
  const LemmaTerms t(c);
  const expr n = variable(c, "n");
  const expr p = variable(c, "p_k");
  const expr w = variable(c, "exp(e_k/theta)");
  const expr rest = variable(c, "R");
  return {{{"n >= 1", n >= 1},
           {"R >= (n-1) exp(m/theta) (the n-1 other terms, each >= exp(m/theta))", rest >= (n - 1) * t.exp_m},
           {"exp(e_k/theta) <= exp(M/theta) (e_k <= M)", w <= t.exp_M},
           {"definition: p_k = exp(e_k/theta) / (exp(e_k/theta) + R)", p * (w + rest) == w}},
          {{"exp positive: exp(m/theta) > 0", t.exp_m > 0}, {"exp positive: exp(e_k/theta) > 0", w > 0}},
          // p_k <= exp(M)/(exp(M) + (n-1) exp(m)) = 1/(1 + (n-1) exp(-delta/theta)).
          mutant ? p * (t.exp_M + n * t.exp_m) <= t.exp_M : p * (t.exp_M + (n - 1) * t.exp_m) <= t.exp_M};
}

Statement tight_bound_below_lemma(z3::context& c, bool mutant) {
  const expr n = variable(c, "n");
  const expr tight = variable(c, "tight");
  const expr b = variable(c, "exp(-delta/theta)");
  const expr d = variable(c, "exp(delta/theta)");
  return {{{"n >= 1", n >= 1},
           {"definition: tight = 1/(1 + (n-1) exp(-delta/theta))", tight * (1 + (n - 1) * b) == 1}},
          {{"exp(a) exp(-a) = 1 with a = delta/theta", b * d == 1},
           {"exp(x) >= 1 for x = delta/theta >= 0", d >= 1},
           {"exp positive: exp(-delta/theta) > 0", b > 0}},
          mutant ? tight * n <= 1 : tight * n <= d};
}

Statement entropy_bound(z3::context& c, bool mutant) {
  const expr entropy = variable(c, "H");
  const expr n = variable(c, "n");
  const expr largest = variable(c, "max p");
  const expr log_largest = variable(c, "log(max p)");
  const expr log_n = variable(c, "log n");
  const expr spread = variable(c, "delta/theta");
  const expr exp_spread = variable(c, "exp(delta/theta)");
  const expr log_bound = variable(c, "log(exp(delta/theta)/n)");
  return {{{"H >= -log max p (Shannon entropy is at least the min-entropy)", entropy >= -log_largest},
           {"max p <= exp(delta/theta)/n (Lemma 2.1)", largest * n <= exp_spread},
           {"n >= 1", n >= 1},
           {"max p > 0", largest > 0}},
          {{"log monotone: max p <= exp(delta/theta)/n => log(max p) <= log(exp(delta/theta)/n)",
            z3::implies(largest * n <= exp_spread, log_largest <= log_bound)},
           {"log(exp(a)/n) = a - log n", log_bound == spread - log_n}},
          mutant ? entropy >= log_n : entropy >= log_n - spread};
}

expr squared_norm(const std::vector<expr>& v) {
  expr total = v[0] * v[0];
  for (std::size_t i = 1; i < v.size(); ++i) total = total + v[i] * v[i];
  return total;
}

Statement cauchy_schwarz(z3::context& c, int dimension, bool mutant) {
  std::vector<expr> a;
  std::vector<expr> b;
  for (int i = 1; i <= dimension; ++i) {
    a.push_back(variable(c, "a_" + std::to_string(i)));
    b.push_back(variable(c, "b_" + std::to_string(i)));
  }
  expr dot = a[0] * b[0];
  for (int i = 1; i < dimension; ++i) dot = dot + a[i] * b[i];
  const expr bound = squared_norm(a) * squared_norm(b);
  return {{}, {}, mutant ? 2 * dot * dot <= bound : dot * dot <= bound};
}

Statement logit_bound(z3::context& c, bool mutant) {
  const expr e = variable(c, "e_i = (Qy).(Kx_i)");
  const expr u = variable(c, "||Qy||");
  const expr v = variable(c, "||Kx_i||");
  const expr sq = variable(c, "sigma_max(Q)");
  const expr sk = variable(c, "sigma_max(K)");
  const expr ny = variable(c, "||y||");
  const expr nx = variable(c, "||x_i||");
  const expr largest = variable(c, "max_j ||x_j||");
  const expr bound = sq * sk * ny * largest;
  return {{{"|e_i| <= ||Qy|| ||Kx_i|| (Cauchy-Schwarz)", e <= u * v && -e <= u * v},
           {"||Qy|| <= sigma_max(Q) ||y|| (definition of sigma_max)", u <= sq * ny},
           {"||Kx_i|| <= sigma_max(K) ||x_i|| (definition of sigma_max)", v <= sk * nx},
           {"||x_i|| <= max_j ||x_j||", nx <= largest},
           {"norms and singular values are non-negative",
            u >= 0 && v >= 0 && sq >= 0 && sk >= 0 && ny >= 0 && nx >= 0}},
          {},
          mutant ? 2 * e <= bound : e <= bound && -e <= bound};
}

Statement spread_from_magnitude(z3::context& c, bool mutant) {
  const expr largest = variable(c, "max e");
  const expr smallest = variable(c, "min e");
  const expr bound = variable(c, "B");
  return {{{"|max e| <= B", largest <= bound && -largest <= bound},
           {"|min e| <= B", smallest <= bound && -smallest <= bound}},
          {},
          mutant ? largest - smallest <= bound : largest - smallest <= 2 * bound};
}

// The paper's adaptive-temperature polynomial (coefficients as written in its code).
expr adaptive_polynomial(const expr& h) {
  z3::context& c = h.ctx();
  return (((number(c, "-37/1000") * h + number(c, "481/1000")) * h - number(c, "23/10")) * h +
          number(c, "4917/1000")) *
             h -
         number(c, "1791/1000");
}

Statement polynomial_on_interval(z3::context& c, const char* low, const char* high, bool above_one,
                                 bool mutant, const char* mutant_low) {
  const expr h = variable(c, "H");
  const expr lower = number(c, mutant ? mutant_low : low);
  Statement statement{
      {{std::string(mutant ? mutant_low : low) + " <= H" + (high ? std::string(" <= ") + high : ""),
        high ? lower <= h && h <= number(c, high) : lower <= h}},
      {},
      above_one ? adaptive_polynomial(h) > 1 : adaptive_polynomial(h) < 1};
  return statement;
}

}  // namespace

std::vector<Obligation> real_arithmetic_obligations() {
  using std::to_string;
  std::vector<Obligation> obligations;
  const auto add = [&](std::string name, std::string step, std::string mutation,
                       const std::function<Statement(z3::context&, bool)>& make) {
    obligations.push_back({std::move(name), std::move(step), Theory::nonlinear_reals,
                           [make](z3::context& c) { return make(c, false); }, std::move(mutation),
                           [make](z3::context& c) { return make(c, true); }});
  };
  add("shifted exponential in [exp(-delta/theta), 1]", "Lemma 2.1, step 1",
      "conclusion: exp(...) < 1 (strict)", shifted_exponential_in_range);
  add("coefficient <= exp(delta/theta)/n (n symbolic)", "Lemma 2.1, step 2 (upper)", "conclusion: p <= 1/n",
      [](z3::context& c, bool m) { return lemma_coefficient(c, 0, true, m); });
  add("coefficient >= exp(-delta/theta)/n (n symbolic)", "Lemma 2.1, step 2 (lower)", "conclusion: p >= 1/n",
      [](z3::context& c, bool m) { return lemma_coefficient(c, 0, false, m); });
  for (int n = 2; n <= 8; ++n) {
    add("coefficient <= exp(delta/theta)/n, n = " + to_string(n) + " explicit terms", "Lemma 2.1, unrolled",
        "conclusion: p <= 1/n", [n](z3::context& c, bool m) { return lemma_coefficient(c, n, true, m); });
    add("coefficient >= exp(-delta/theta)/n, n = " + to_string(n) + " explicit terms", "Lemma 2.1, unrolled",
        "conclusion: p >= 1/n", [n](z3::context& c, bool m) { return lemma_coefficient(c, n, false, m); });
  }
  add("n > exp(delta/theta)/eps => every coefficient bound < eps", "Theorem 2.2, threshold",
      "conclusion: bound < eps/2", threshold);
  add("largest coefficient <= 1/(1 + (n-1) exp(-delta/theta))", "Tight bound, attained by the extremal row",
      "conclusion: with n in place of n-1", tight_bound_holds);
  add("1/(1 + (n-1) exp(-delta/theta)) <= exp(delta/theta)/n", "Tight bound is within Lemma 2.1",
      "conclusion: tight bound <= 1/n", tight_bound_below_lemma);
  add("H >= log n - delta/theta", "Entropy bound, from H >= -log max p", "conclusion: H >= log n",
      entropy_bound);
  for (int d = 2; d <= 4; ++d) {
    add("(a.b)^2 <= |a|^2 |b|^2, d = " + to_string(d), "Proposition 3.1, Cauchy-Schwarz",
        "conclusion: 2 (a.b)^2 <= |a|^2 |b|^2",
        [d](z3::context& c, bool m) { return cauchy_schwarz(c, d, m); });
  }
  add("|e_i| <= sigma(Q) sigma(K) ||y|| max||x||", "Proposition 3.1, combination",
      "conclusion: 2 e_i <= the bound", logit_bound);
  add("max e - min e <= 2 max |e_i|", "Proposition 3.1, spread", "conclusion: <= max |e_i|",
      spread_from_magnitude);
  add("poly(H) > 1 on [0.8486, 5.9445]", "Adaptive temperature: beta > 1 inside the brackets",
      "premise: H from 0.80", [](z3::context& c, bool m) {
        return polynomial_on_interval(c, "8486/10000", "59445/10000", true, m, "80/100");
      });
  add("poly(H) < 1 on [0, 0.8485]", "Adaptive temperature: beta clamps to 1 below the lower root",
      "premise: up to 0.90", [](z3::context& c, bool m) {
        return m ? polynomial_on_interval(c, "0", "90/100", false, false, nullptr)
                 : polynomial_on_interval(c, "0", "8485/10000", false, false, nullptr);
      });
  add("poly(H) < 1 for H >= 5.9446", "Adaptive temperature: beta clamps to 1 above the upper root",
      "premise: from 5.90", [](z3::context& c, bool m) {
        return polynomial_on_interval(c, "59446/10000", nullptr, false, m, "590/100");
      });
  return obligations;
}

}  // namespace sharpcheck::proofs
