// Bit-precise facts about the floating-point steps kernels rely on, in Z3's FloatingPoint theory
// with round-to-nearest-even: fp32 = FP(8, 24), bf16 = FP(8, 8), fp16 = FP(5, 11) (Z3 counts
// the implicit bit in the significand width).
#include <limits>
#include <string>

#include "proofs/obligation.hpp"

namespace sharpcheck::proofs {
namespace {

using z3::expr;

struct FloatSort {
  const char* name;
  unsigned exponent_bits;
  unsigned significand_bits;
};
constexpr FloatSort fp32_sort{"fp32", 8, 24};
constexpr FloatSort bf16_sort{"bf16", 8, 8};
constexpr FloatSort fp16_sort{"fp16", 5, 11};

expr constant(z3::context& c, double value, const FloatSort& sort) {
  return {c, Z3_mk_fpa_numeral_double(c, value, c.fpa_sort(sort.exponent_bits, sort.significand_bits))};
}

expr finite(const expr& x) { return !x.mk_is_nan() && !x.mk_is_inf(); }

// For finite x <= m: fl(x - m) <= 0 and fl(m - m) is +0, so the shifted maximum's exp is
// exactly exp(+0) = 1 and the denominator of a shifted softmax is at least 1.
Statement max_shift_is_safe(z3::context& c, const FloatSort& sort, bool mutant) {
  const expr x = c.fpa_const("x", sort.exponent_bits, sort.significand_bits);
  const expr m = c.fpa_const("m", sort.exponent_bits, sort.significand_bits);
  const expr zero = constant(c, 0.0, sort);
  const expr difference = x - m;
  const expr conclusion = mutant ? difference < zero : difference <= zero && (m - m) == zero;
  return {{{"x and m finite", finite(x) && finite(m)}, {"x <= m (m is the row maximum)", x <= m}},
          {},
          conclusion};
}

Statement denominator_at_least_one(z3::context& c, bool mutant) {
  const FloatSort& sort = fp32_sort;
  const expr w = c.fpa_const("w", sort.exponent_bits, sort.significand_bits);
  const expr one = constant(c, 1.0, sort);
  const expr zero = constant(c, 0.0, sort);
  const expr total = one + w;
  return {{{"w finite and >= 0 (a sum of exponentials)", finite(w) && w >= zero}},
          {},
          mutant ? total > one : total >= one};
}

// The smallest s > 0 with fl(s + 1) = s: a running sum of ones in the format stops there.
Statement stagnation_point(z3::context& c, const FloatSort& sort, double point, bool mutant) {
  const expr s = c.fpa_const("s", sort.exponent_bits, sort.significand_bits);
  const expr one = constant(c, 1.0, sort);
  const expr zero = constant(c, 0.0, sort);
  const expr stuck = constant(c, point, sort);
  // Claims: fl(point + 1) = point, and no finite s in (0, point) has fl(s + 1) = s. The mutant
  // claims the stagnation point is larger (twice as large), which s = point refutes.
  const expr below = mutant ? constant(c, 2 * point, sort) : stuck;
  return {{{"s finite, 0 < s < " + std::to_string(static_cast<long>(mutant ? 2 * point : point)),
            finite(s) && s > zero && s < below}},
          {},
          (stuck + one) == stuck && (s + one) != s};
}

// Rounding a double in [0, 1] into a narrower format stays in [0, 1].
Statement rounding_stays_in_unit_interval(z3::context& c, const FloatSort& sort, bool mutant) {
  const expr x = c.fpa_const("x", 11, 53);
  const expr zero64 = constant(c, 0.0, {"fp64", 11, 53});
  const expr one64 = constant(c, 1.0, {"fp64", 11, 53});
  const expr rounded = z3::fpa_to_fpa(x, c.fpa_sort(sort.exponent_bits, sort.significand_bits));
  const expr zero = constant(c, 0.0, sort);
  const expr one = constant(c, 1.0, sort);
  return {{{"x an fp64 value in [0, 1]", x >= zero64 && x <= one64}},
          {},
          mutant ? rounded >= zero && rounded < one : rounded >= zero && rounded <= one};
}

// Normalising by a reciprocal: for an integer n in [1, 2048], fl(fl(1/n) n) lies within one fp16
// step of 1 (the product of two relative errors of at most 2^-11 each).
Statement reciprocal_times_count(z3::context& c, bool mutant) {
  const FloatSort& sort = fp16_sort;
  const expr n = c.fpa_const("n", sort.exponent_bits, sort.significand_bits);
  const expr one = constant(c, 1.0, sort);
  const expr reciprocal = one / n;
  const expr product = reciprocal * n;
  const expr integral{c, Z3_mk_fpa_round_to_integral(c, c.fpa_rounding_mode(), n)};
  const double step = mutant ? 0.0 : 0x1p-10;
  return {{{"n an integer in [1, 2048]", n == integral && n >= one && n <= constant(c, 2048.0, sort)}},
          {},
          reciprocal > constant(c, 0.0, sort) && product >= constant(c, 1.0 - step, sort) &&
              product <= constant(c, 1.0 + step, sort)};
}

}  // namespace

std::vector<Obligation> floating_point_obligations() {
  std::vector<Obligation> obligations;
  const auto add = [&](std::string name, std::string step, std::string mutation,
                       const std::function<Statement(z3::context&, bool)>& make) {
    obligations.push_back({std::move(name), std::move(step), Theory::floating_point,
                           [make](z3::context& c) { return make(c, false); }, std::move(mutation),
                           [make](z3::context& c) { return make(c, true); }});
  };
  for (const FloatSort* sort : {&fp32_sort, &bf16_sort, &fp16_sort}) {
    add(std::string("fl(x - max) <= 0 and fl(max - max) = +0 in ") + sort->name, "Kernel step: the max shift",
        "conclusion: fl(x - max) < 0",
        [sort](z3::context& c, bool m) { return max_shift_is_safe(c, *sort, m); });
  }
  add("fl(1 + w) >= 1 for w >= 0 in fp32", "Kernel step: the denominator is at least 1",
      "conclusion: fl(1 + w) > 1", denominator_at_least_one);
  add("smallest s with fl(s + 1) = s is 256 in bf16",
      "Accumulation horizon (bf16: a sum of ones stops at 256)", "claims the point is 512",
      [](z3::context& c, bool m) { return stagnation_point(c, bf16_sort, 256.0, m); });
  add("smallest s with fl(s + 1) = s is 2048 in fp16",
      "Accumulation horizon (fp16: a sum of ones stops at 2048)", "claims the point is 4096",
      [](z3::context& c, bool m) { return stagnation_point(c, fp16_sort, 2048.0, m); });
  for (const FloatSort* sort : {&fp32_sort, &bf16_sort, &fp16_sort}) {
    add(std::string("round(x) in [0, 1] for x in [0, 1], fp64 to ") + sort->name,
        "Kernel step: rounding a probability keeps it a probability", "conclusion: round(x) < 1",
        [sort](z3::context& c, bool m) { return rounding_stays_in_unit_interval(c, *sort, m); });
  }
  add("fl(fl(1/n) n) within 2^-10 of 1 for integers n <= 2048 in fp16",
      "Kernel step: normalising by a reciprocal", "conclusion: fl(fl(1/n) n) = 1 exactly",
      reciprocal_times_count);
  return obligations;
}

double smallest_stagnation_point(unsigned exponent_bits, unsigned significand_bits) {
  z3::context c;
  const FloatSort sort{"search", exponent_bits, significand_bits};
  const expr s = c.fpa_const("s", exponent_bits, significand_bits);
  z3::solver solver(c);
  solver.add(finite(s) && s > constant(c, 0.0, sort) && (s + constant(c, 1.0, sort)) == s);
  double smallest = std::numeric_limits<double>::infinity();
  while (solver.check() == z3::sat) {
    const expr value = solver.get_model().eval(s, true);
    // Convert the model's value exactly: it is a finite float of at most 53 significand bits.
    smallest = std::stod(expr(c, Z3_mk_fpa_to_real(c, value)).simplify().get_decimal_string(40));
    solver.add(s < constant(c, smallest, sort));
  }
  return smallest;
}

std::vector<Obligation> all_obligations() {
  std::vector<Obligation> obligations = real_arithmetic_obligations();
  for (auto& obligation : floating_point_obligations()) obligations.push_back(std::move(obligation));
  return obligations;
}

}  // namespace sharpcheck::proofs
