// Batch invariance as a verdict (ops/paged_attention/invariance.hpp), through the paged_attention
// record as the gate runs it: the honest paged kernels are reported invariant and accurate; the
// split-KV twin whose split count comes from the batch is accurate and reported with exactly the
// requests its heuristic moves (those of more than two 64-key blocks, whose splits differ between a
// batch of 1 and one of 17), and the kernel property behind it is checked here directly on packed
// batches, apart from the check's own comparison; an LSE that moves alone is named; a kernel that is
// invariant and wrong still fails.
#include <gtest/gtest.h>

#include <bit>
#include <set>
#include <string>
#include <vector>

#include "gate/case_tools.hpp"
#include "ops/paged_attention/invariance.hpp"
#include "ops/paged_attention/paged_attention_op.hpp"

namespace sharpcheck {
namespace {

constexpr const char* scenario_name = "invariance_17_requests_decode_and_speculative";

gate::CaseOutcome invariance_case(const char* kernel_name) {
  const ops::paged::Kernel& kernel = *ops::paged::find_kernel(kernel_name);
  const ops::paged::Scenario& scenario = *ops::paged::find_scenario(scenario_name);
  gate::GateSettings settings;
  gate::GateCase gate_case =
      gate::make_case(kernel_name, std::string("paged_") + scenario_name, ops::paged::total_keys(scenario),
                      settings, kernel.deliberately_broken, nullptr);
  gate_case.operation = "paged_attention";
  gate::CaseOutcome outcome;
  outcome.gate_case = gate_case;
  ops::paged_attention_operation.run(gate_case, settings, outcome);
  return outcome;
}

std::set<std::size_t> changed_requests(const gate::CaseOutcome& outcome) {
  std::set<std::size_t> changed;
  for (const auto& c : outcome.invariance->changes) changed.insert(c.request);
  return changed;
}

TEST(BatchInvariance, HonestPagedKernelsAreReportedInvariantAndAccurate) {
  for (const char* name : {"paged_flash2_bf16", "paged_split_kv_bf16"}) {
    const gate::CaseOutcome outcome = invariance_case(name);
    ASSERT_TRUE(outcome.invariance.has_value()) << name;
    EXPECT_TRUE(outcome.passed()) << name << ": " << (outcome.failures.empty() ? "" : outcome.failures[0]);
    EXPECT_TRUE(outcome.invariance->changes.empty()) << name;
    EXPECT_EQ(outcome.invariance->requests, 17U);
    // batch of 17, again, 17 alone, last 15, last 16, reversed, other pages: only the first judged
    ASSERT_EQ(outcome.invariance->runs.size(), 23U) << name;
    EXPECT_TRUE(outcome.invariance->runs[0].judged);
    for (std::size_t r = 1; r < outcome.invariance->runs.size(); ++r)
      EXPECT_FALSE(outcome.invariance->runs[r].judged) << name << " " << outcome.invariance->runs[r].name;
    EXPECT_GT(outcome.comparison.elements, 0U);
    EXPECT_LE(outcome.comparison.max_bound_ratio, 1.0) << name;
  }
}

TEST(BatchInvariance, ASplitCountFromTheBatchIsReportedWithTheRequestsItMoves) {
  const gate::CaseOutcome outcome = invariance_case("paged_split_kv_bf16_split_count_from_batch");
  ASSERT_TRUE(outcome.invariance.has_value());
  EXPECT_FALSE(outcome.passed());
  ASSERT_EQ(outcome.failures.size(), 1U);  // accurate in every run, deterministic: only invariance fails
  EXPECT_NE(outcome.failures[0].find("not batch-invariant: 8 of 17 requests"), std::string::npos)
      << outcome.failures[0];
  // Alone a request of more than two 64-key blocks is split per block; in the batch of 17 (68
  // heads on 132 SMs) in two. Up to two blocks the splits agree, so nothing else may change.
  const ops::paged::Scenario& scenario = *ops::paged::find_scenario(scenario_name);
  std::set<std::size_t> moved;
  for (std::size_t r = 0; r < scenario.keys.size(); ++r) {
    if (scenario.keys[r] > 128) moved.insert(r);
  }
  EXPECT_EQ(changed_requests(outcome), moved);
  for (const auto& run : outcome.invariance->runs) {
    if (run.judged) {
      EXPECT_LE(run.max_bound_ratio, 1.0) << run.name;  // and every variant was right
    }
  }
  EXPECT_TRUE(outcome.comparison.violations.empty());
}

// The LSE is compared as the output is: a path chosen by batch bucket that moves only the LSE's
// bits (its output bit for bit the same) is named, with each change marked as the LSE's.
TEST(BatchInvariance, AnLseThatMovesWithTheBatchIsNamedThoughTheOutputDoesNot) {
  const gate::CaseOutcome outcome = invariance_case("paged_split_kv_bf16_lse_path_from_batch");
  ASSERT_TRUE(outcome.invariance.has_value());
  ASSERT_EQ(outcome.failures.size(), 1U) << (outcome.failures.empty() ? "" : outcome.failures[0]);
  EXPECT_NE(outcome.failures[0].find("not batch-invariant"), std::string::npos) << outcome.failures[0];
  EXPECT_NE(outcome.failures[0].find("(lse only: "), std::string::npos) << outcome.failures[0];
  ASSERT_FALSE(outcome.invariance->changes.empty());
  for (const auto& c : outcome.invariance->changes) {
    EXPECT_EQ(c.output, "lse") << "request " << c.request << " in the " << c.run;
    EXPECT_LE(c.max_ulps, 8U) << "request " << c.request;  // two fp32 paths, both accurate
    // batches of 16 and more take the base-2 path: the batch of 15 and each request alone do not
    EXPECT_TRUE(c.run.ends_with(" alone") || c.run.starts_with("batch of 15")) << c.run;
  }
  for (const auto& run : outcome.invariance->runs) {
    if (run.judged) {
      EXPECT_LE(run.max_bound_ratio, 1.0) << run.name;
    }
  }
}

TEST(BatchInvariance, InvariantAndWrongStillFails) {
  const gate::CaseOutcome outcome = invariance_case("paged_flash2_bf16_last_page_short");
  ASSERT_TRUE(outcome.invariance.has_value());
  EXPECT_TRUE(outcome.invariance->changes.empty());
  EXPECT_FALSE(outcome.passed());
  EXPECT_GT(outcome.comparison.max_bound_ratio, 1.0);
}

// The kernel property the check reports, seen directly: request 0 alone and first in a batch of 17.
std::vector<std::uint64_t> first_request_bits(const char* kernel_name, std::size_t batch_size) {
  const ops::paged::Scenario& layout = *ops::paged::find_scenario(scenario_name);
  std::vector<ops::paged::Request> batch;
  for (std::size_t r = 0; r < batch_size; ++r)
    batch.push_back(ops::paged::make_request(r == 0 ? 300 : 50, 1, 100 + r));
  const ops::paged::Problem problem = ops::paged::pack_requests(batch, layout, 7 + batch_size);
  const auto outputs = ops::paged::run(*ops::paged::find_kernel(kernel_name), layout, problem);
  std::vector<double> values(problem.heads * problem.dim);
  outputs.out->read(0, values);
  std::vector<std::uint64_t> bits;
  for (const double x : values) bits.push_back(std::bit_cast<std::uint64_t>(x));
  return bits;
}

TEST(BatchInvariance, TheTwinsBitsMoveWithTheBatchAndTheHonestSplitsDoNot) {
  EXPECT_NE(first_request_bits("paged_split_kv_bf16_split_count_from_batch", 1),
            first_request_bits("paged_split_kv_bf16_split_count_from_batch", 17));
  EXPECT_EQ(first_request_bits("paged_split_kv_bf16", 1), first_request_bits("paged_split_kv_bf16", 17));
}

}  // namespace
}  // namespace sharpcheck
