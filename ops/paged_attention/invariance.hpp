// paged_attention's batch-invariance case (judged by gate/invariance.hpp): a pool of requests,
// each drawn from its own seed so that it is the same request in every call, called as one batch
// (the first call), then again (the same call: determinism), each request alone, the last 15 and
// the last 16 (either side of a power of two, where kernels switch paths and split counts), the
// pool reversed, and the pool in pages of 64 in HND with FlashInfer's indptr form. Every call's
// pages are scrambled afresh, except the same call's. A kernel whose split count or path depends
// on the batch is accurate and still fails, naming each request that changed.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "gate/cases.hpp"
#include "gate/invariance.hpp"
#include "ops/paged_attention/paged_kernels.hpp"

namespace sharpcheck::ops::paged {

// The calls of an invariance scenario: problems[0] is the first call, problems[i + 1] rerun i.
struct InvarianceCalls {
  gate::InvariancePlan plan;
  std::vector<Problem> problems;
  std::vector<Scenario> layouts;  // per problem: the scenario's, or pages of 64, HND, indptr form
};
[[nodiscard]] InvarianceCalls invariance_calls(const Scenario& scenario, std::uint64_t seed,
                                               const FloatFormat& format = bf16);

// Judges the kernel's outputs for a problem laid out as `layout` says (the op's judge).
using JudgeRun =
    std::function<gate::CaseOutcome(const Scenario& layout, const Problem& problem, const Outputs& outputs)>;

// Runs a built-in kernel on every call of the scenario (scenario.invariance) and judges them.
void judge_invariance(const Kernel& kernel, const Scenario& scenario, std::uint64_t seed,
                      const JudgeRun& judge, gate::CaseOutcome& outcome);

}  // namespace sharpcheck::ops::paged
