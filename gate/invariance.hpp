// Batch invariance and determinism as a verdict, for any kernel the gate runs (built in, a plugin's
// sharpcheck_op, a Python callable through sharpcheck.sweep): the same request must give the same
// bits whatever else is in the batch, wherever it sits, whatever pages hold it, and on a second
// identical call (FlashInfer's batch-invariant tests, vLLM's determinism suite). An operation's
// invariance case (ops/paged_attention/invariance.hpp) is a first call and reruns that regroup its
// requests; this compares every request's outputs in every rerun with the first call's, bit for bit,
// and judges the first call and every rerun that differs (invariant and wrong is still wrong, and a
// variant output must still be right). Nothing here names an operation.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "formats/float_format.hpp"
#include "gate/cases.hpp"

namespace sharpcheck::gate {

// Where one request's values of one output lie in the first call's values and in a rerun's (each
// call's outputs one after another, as the operation lists them), and how many values; the output's
// name and format (null: the case's), in which a change is measured in ulps.
struct RequestStretch {
  std::size_t request = 0;
  std::size_t first_at = 0, here_at = 0, count = 0;
  std::string output = "out";
  const FloatFormat* format = nullptr;
};

// A rerun of the first call's requests: its name in reports ("alone", "batch of 15 (requests 2-16)"),
// its batch size, whether it is the very same call again (a change there is nondeterminism), and
// its requests' stretches.
struct RerunPlan {
  std::string name;
  std::size_t batch = 0;
  bool same_call = false;
  std::vector<RequestStretch> stretches;
};

// An invariance case's calls: the first (its name, its requests, an output row's length for
// near-ties and how many of its first values hold such rows) and the reruns.
struct InvariancePlan {
  std::string first_name;  // "batch of 17"
  std::size_t requests = 0;
  std::size_t row = 0;
  std::size_t row_values = 0;  // 0: all of them
  std::vector<RerunPlan> reruns;
};

// Judges call `index` (0: the first call; i + 1: rerun i) from its output values.
using JudgeCall = std::function<CaseOutcome(std::size_t index, const std::vector<double>& values)>;

// Compares and judges. `reruns[i]` holds rerun i's output values, or null when it produced none
// (the caller records why). Near-ties are rows of the first call whose two largest values are
// within one ulp of `format` (a one-ulp variance there can flip an argmax). Fills outcome from the
// first call's judgement, outcome.invariance, and a failure for each rerun judged wrong, for the
// requests that changed, and for a same call that changed.
void judge_invariance(const InvariancePlan& plan, const FloatFormat& format, const std::vector<double>& first,
                      const std::vector<const std::vector<double>*>& reruns, const JudgeCall& judge,
                      CaseOutcome& outcome);

}  // namespace sharpcheck::gate
