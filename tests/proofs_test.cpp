// The proof runner's three verdicts, its watchdog, and the stagnation search.
#include <gtest/gtest.h>

#include "proofs/obligation.hpp"
#include "proofs/runner.hpp"

namespace sharpcheck::proofs {
namespace {

Obligation obligation_with(std::function<Statement(z3::context&)> statement, Theory theory) {
  return {"test", "test step", theory, statement, "none", statement};
}

TEST(Runner, AFalseClaimIsRefutedWithACounterexample) {
  const auto claim = obligation_with(
      [](z3::context& c) {
        const z3::expr x = c.real_const("x");
        return Statement{{{"x > 0", x > 0}}, {}, x > 1};
      },
      Theory::nonlinear_reals);
  const auto report = check_obligation(claim, {});
  EXPECT_EQ(report.proof.verdict, Verdict::refuted);
  EXPECT_NE(report.proof.detail.find("x"), std::string::npos) << report.proof.detail;
  EXPECT_FALSE(report.passed());
}

TEST(Runner, ContradictoryPremisesAreReportedAsVacuous) {
  const auto claim = obligation_with(
      [](z3::context& c) {
        const z3::expr x = c.real_const("x");
        return Statement{{{"x > 1", x > 1}, {"x < 0", x < 0}}, {}, x == 7};
      },
      Theory::nonlinear_reals);
  const auto report = check_obligation(claim, {});
  EXPECT_EQ(report.proof.verdict, Verdict::proved);  // anything follows from false premises...
  EXPECT_FALSE(report.non_vacuous());                // ...which is why vacuity is checked
  EXPECT_FALSE(report.passed());
}

// A bit-precise fact about 64-bit floating-point multiplication and division that Z3 cannot settle
// in 1 ms: the watchdog turns it into "unknown", never a hang and never "proved".
TEST(Runner, ACheckPastItsTimeLimitIsUnknownNotProved) {
  const auto hard = obligation_with(
      [](z3::context& c) {
        const z3::expr x = c.fpa_const("x", 11, 53);
        const z3::expr y = c.fpa_const("y", 11, 53);
        return Statement{{{"finite", !x.mk_is_nan() && !y.mk_is_nan() && !x.mk_is_inf() && !y.mk_is_inf()}},
                         {},
                         ((x * y) / y) == x || y.mk_is_zero()};
      },
      Theory::floating_point);
  RunOptions options;
  options.timeout_ms = 1;
  const auto report = check_obligation(hard, options);
  EXPECT_NE(report.proof.verdict, Verdict::proved);
  EXPECT_LT(report.proof.seconds, 10.0);
}

TEST(Obligations, EveryOneHasAPaperStepAMutationAndATwin) {
  const auto obligations = all_obligations();
  EXPECT_GE(obligations.size(), 39u);
  for (const auto& obligation : obligations) {
    EXPECT_FALSE(obligation.paper_step.empty()) << obligation.name;
    EXPECT_FALSE(obligation.mutation.empty()) << obligation.name;
    EXPECT_TRUE(static_cast<bool>(obligation.mutant)) << obligation.name;
  }
}

TEST(Stagnation, Z3FindsTheSmallestStuckSumInBf16AndFp16) {
  EXPECT_EQ(smallest_stagnation_point(8, 8), 256.0);
  EXPECT_EQ(smallest_stagnation_point(5, 11), 2048.0);
}

}  // namespace
}  // namespace sharpcheck::proofs
