// Batch invariance and determinism as a verdict: the same request must give the same bits whatever
// else is in the batch, wherever it sits in it, whatever pages hold it, and on a second identical
// call (FlashInfer's batch-invariant tests, vLLM's determinism suite). A kernel whose split count or
// path depends on the batch is accurate and still fails here, naming each request that changed.
//
// The runs of a pool of requests (each request's values drawn from its own seed, so it is the same
// request in every run): the whole pool as one batch (the first run), the same call again, each
// request alone, the last 15 and the last 16 (either side of a power of two, where kernels switch
// paths), the pool reversed, and the pool in pages of 64 in HND with FlashInfer's indptr form.
// Every request's output in every run is compared bit for bit with its output in the first run.
// The first run is judged against the correctly rounded reference, and so is every run whose bits
// differ from it: invariant and wrong is still wrong, and variant outputs must each be right.
#pragma once

#include <cstdint>
#include <functional>

#include "gate/cases.hpp"
#include "ops/paged_attention/paged_kernels.hpp"

namespace sharpcheck::ops::paged {

// Judges the kernel's output for a problem laid out as `layout` says (the op's judge).
using JudgeRun =
    std::function<gate::CaseOutcome(const Scenario& layout, const Problem& problem, const gate::Array& out)>;

// Runs `kernel` on the scenario's requests (scenario.invariance) in every run above, seeded by
// `seed`; fills the outcome's comparison from the first run's judgement, outcome.invariance, and a
// failure for each run judged wrong, for requests that changed, and for a second call that changed.
void judge_invariance(const Kernel& kernel, const Scenario& scenario, std::uint64_t seed,
                      const JudgeRun& judge, gate::CaseOutcome& outcome);

}  // namespace sharpcheck::ops::paged
