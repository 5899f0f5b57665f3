// Checks obligations with Z3, each check in a child process under a watchdog, so that a solver
// that never returns (Z3 4.8's timeout does not always fire) cannot stop the run.
#pragma once

#include <string>
#include <vector>

#include "proofs/obligation.hpp"

namespace sharpcheck::proofs {

enum class Verdict { proved, refuted, unknown };
[[nodiscard]] const char* verdict_name(Verdict verdict);

struct CheckOutcome {
  Verdict verdict = Verdict::unknown;
  std::string detail;  // the counterexample or witness model, or why the check did not finish
  double seconds = 0;
};

struct ObligationReport {
  std::string name;
  std::string paper_step;
  std::string mutation;
  Theory theory = Theory::nonlinear_reals;
  std::vector<std::string> premises;
  std::vector<std::string> axioms;
  CheckOutcome proof;           // premises, axioms and the negated conclusion: unsat = proved
  CheckOutcome premises_check;  // premises and axioms alone: must be satisfiable (non-vacuous)
  CheckOutcome mutant;          // the false twin: must be refuted
  [[nodiscard]] bool non_vacuous() const { return premises_check.verdict == Verdict::refuted; }
  [[nodiscard]] bool passed() const {
    return proof.verdict == Verdict::proved && non_vacuous() && mutant.verdict == Verdict::refuted;
  }
};

struct RunOptions {
  unsigned timeout_ms = 10000;  // per check; the watchdog kills the child a second after this
};

[[nodiscard]] ObligationReport check_obligation(const Obligation& obligation, const RunOptions& options);

}  // namespace sharpcheck::proofs
