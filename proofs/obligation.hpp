// A proof obligation as data: a named step of one of the paper's arguments (or of a kernel's
// correctness argument), its premises, the transcendental facts it assumes (stated as named
// axiom instances, since Z3 has no exp or log), its conclusion, and a deliberately false twin.
//
// Checking asserts premises, axioms and the negated conclusion: unsat means proved, sat means
// refuted (the model is the counterexample), unknown or a time-out means not proved. Three
// values, never two.
#pragma once

#include <z3++.h>

#include <functional>
#include <string>
#include <vector>

namespace sharpcheck::proofs {

struct NamedFormula {
  std::string name;
  z3::expr formula;
};

// An obligation instantiated in one Z3 context.
struct Statement {
  std::vector<NamedFormula> premises;
  std::vector<NamedFormula> axioms;  // explicit instances of exp/log facts; listed in every report
  z3::expr conclusion;
};

enum class Theory {
  nonlinear_reals,  // Z3's nlsat (qfnra-nlsat tactic): complete for real polynomial arithmetic
  floating_point,   // Z3's bit-precise FloatingPoint theory
};

struct Obligation {
  std::string name;
  std::string paper_step;  // e.g. "Lemma 2.1, step 2"
  Theory theory;
  std::function<Statement(z3::context&)> statement;
  // The false twin: a weaker premise or a stronger conclusion, which must come back refuted.
  std::string mutation;
  std::function<Statement(z3::context&)> mutant;
};

// Every obligation sharpcheck checks, in report order.
[[nodiscard]] std::vector<Obligation> all_obligations();
[[nodiscard]] std::vector<Obligation> real_arithmetic_obligations();
[[nodiscard]] std::vector<Obligation> floating_point_obligations();

// Z3 finds the smallest positive s with fl(s + 1) = s in FP(exponent_bits, significand_bits):
// it asks for any such s, then for one below the last, until none is left (bf16: 256, fp16: 2048).
[[nodiscard]] double smallest_stagnation_point(unsigned exponent_bits, unsigned significand_bits);

}  // namespace sharpcheck::proofs
