#include "proofs/runner.hpp"

#include <string>
#include <utility>

#include "core/child_process.hpp"

namespace sharpcheck::proofs {
namespace {

enum class Mode { prove, satisfy_premises, refute_mutant };

// Runs in the child: builds the statement in a fresh context and reports "sat", "unsat" or
// "unknown" on the first line, then the model or reason.
std::string solve(const Obligation& obligation, Mode mode, unsigned timeout_ms) {
  try {
    z3::context context;
    const Statement statement =
        mode == Mode::refute_mutant ? obligation.mutant(context) : obligation.statement(context);
    z3::solver solver = obligation.theory == Theory::nonlinear_reals
                            ? z3::tactic(context, "qfnra-nlsat").mk_solver()
                            : z3::solver(context);
    z3::params parameters(context);
    parameters.set("timeout", timeout_ms);
    solver.set(parameters);
    for (const auto& premise : statement.premises) solver.add(premise.formula);
    for (const auto& axiom : statement.axioms) solver.add(axiom.formula);
    if (mode != Mode::satisfy_premises) solver.add(!statement.conclusion);
    switch (solver.check()) {
      case z3::unsat:
        return "unsat\n";
      case z3::sat:
        return "sat\n" + solver.get_model().to_string();
      case z3::unknown:
        return "unknown\n" + solver.reason_unknown();
    }
  } catch (const z3::exception& error) {
    return std::string("unknown\nZ3 error: ") + error.msg();
  }
  return "unknown\n";
}

CheckOutcome check_in_child(const Obligation& obligation, Mode mode, const RunOptions& options) {
  // A second beyond the solver's own limit, which Z3 4.8 does not always honour.
  const ChildOutcome child = run_in_child(
      [&] {
        return std::pair{solve(obligation, mode, options.timeout_ms), 0};
      },
      options.timeout_ms / 1000.0 + 1.0);
  const double seconds = child.seconds;
  switch (child.ending) {
    case ChildOutcome::Ending::could_not_start:
      return {Verdict::unknown, "could not start a solver process", 0};
    case ChildOutcome::Ending::timed_out:
      return {Verdict::unknown, "timed out after " + std::to_string(options.timeout_ms) + " ms", seconds};
    case ChildOutcome::Ending::killed_by_signal:
      return {Verdict::unknown, "solver process died: " + child.signal, seconds};
    case ChildOutcome::Ending::out_of_memory:
    case ChildOutcome::Ending::interrupted:
      return {Verdict::unknown, "solver process " + describe_ending(child, {}), seconds};
    case ChildOutcome::Ending::exited:
      break;
  }
  const std::string& answer = child.output;
  const std::size_t line_end = answer.find('\n');
  const std::string first = answer.substr(0, line_end);
  const std::string rest = line_end == std::string::npos ? "" : answer.substr(line_end + 1);
  // Proving: unsat means the negated conclusion has no model. For the premises and the mutant a
  // model is what is wanted, and "refuted" records that one exists.
  if (first == "unsat")
    return {mode == Mode::prove ? Verdict::proved : Verdict::unknown, "no model exists", seconds};
  if (first == "sat") return {Verdict::refuted, rest, seconds};
  return {Verdict::unknown, rest.empty() ? "solver answered unknown" : rest, seconds};
}

}  // namespace

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::proved:
      return "proved";
    case Verdict::refuted:
      return "refuted";
    case Verdict::unknown:
      return "unknown";
  }
  return "unknown";
}

ObligationReport check_obligation(const Obligation& obligation, const RunOptions& options) {
  ObligationReport report;
  report.name = obligation.name;
  report.paper_step = obligation.paper_step;
  report.mutation = obligation.mutation;
  report.theory = obligation.theory;
  {
    z3::context context;
    const Statement statement = obligation.statement(context);
    for (const auto& premise : statement.premises) report.premises.push_back(premise.name);
    for (const auto& axiom : statement.axioms) report.axioms.push_back(axiom.name);
  }
  report.proof = check_in_child(obligation, Mode::prove, options);
  report.premises_check = check_in_child(obligation, Mode::satisfy_premises, options);
  report.mutant = check_in_child(obligation, Mode::refute_mutant, options);
  return report;
}

}  // namespace sharpcheck::proofs
