// The gate's cases: what a sweep is made of (a kernel on one generated input), how a sweep is
// planned, and how one case is run and judged by the tolerance table. The CLI and the Python
// module both plan and run sweeps through this library (gate/sweep.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "kernels/plugin.hpp"
#include "metrics/comparison.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::gate {

struct Operation;  // gate/operation.hpp

// One case of the sweep: a kernel on one generated input.
struct GateCase {
  std::string operation;  // the name of the Operation that planned and runs it
  std::string kernel;
  std::string input;  // row kind, or "attention_normal"
  std::size_t n = 0;
  std::uint64_t seed = 0;       // this case's own seed: base_seed mixed with the case id
  std::uint64_t base_seed = 0;  // the sweep's --seed
  std::size_t index = 0;        // position in the unsharded sweep (merge orders by it)
  bool deliberately_broken = false;
  const FloatFormat* plugin_format = nullptr;  // set for a plugin's case: the format it runs in
  std::string plugin_path;
  // A plugin's declared features, swept: softmax scale (1/theta), attention temperature theta
  // (the scale passed is 1/sqrt(d)/theta) and the causal mask. The id names any that is not plain.
  double softmax_scale = 1;
  double attention_theta = 1;
  bool causal = false;
  // An attention scenario of gate/attention_scenarios.hpp (a whole multi-head problem with masks
  // and modifiers), when not empty; `input` is then "attention_" + its name and n its keys.
  std::string scenario = {};
  // A plugin's case of an operation through the version-6 entry sharpcheck_op: `input` and `n` are
  // those of the operation's external case (Operation::external_cases) it runs.
  bool plugin_operation = false;
  [[nodiscard]] std::string id() const;
};

struct CaseOutcome {
  GateCase gate_case;
  std::string format;
  metrics::Comparison comparison;
  reference::ZivStatistics reference_statistics;
  double seconds = 0;
  std::vector<std::string> failures;  // tolerance, budget and baseline findings; empty = pass
  bool crashed = false;               // the kernel crashed, hung, ran out of memory or returned an error
  std::string reproducer;             // for a crash: the .npy file holding its input
  std::string console;                // for a plugin: what it printed
  bool interrupted = false;           // a signal stopped the case: it has no result and is not reported
  // Judged arrays (gate/judge_arrays.hpp): the worst element's full index in the array holding
  // it ("out" or "lse" for attention, the outputs' name for softmax); empty for generated cases.
  std::string worst_array;
  std::vector<std::size_t> worst_index;
  // Judged attention arrays: the precision recipe the verdict is under (metrics/recipes.hpp) and
  // how it was chosen ("pass as flash_bf16: ..." when no recipe was named); empty elsewhere.
  std::string recipe;
  std::string recipe_note;
  // Judged gradients: each judged tensor's worst ratios (the proven and statistical tiers) and
  // violations of both, by the tensor's name, so a report lists every gradient's verdict.
  struct TensorVerdict {
    std::string name;
    double proven_ratio = 0, statistical_ratio = 0;
    std::size_t violations = 0;
    std::size_t non_finite = 0;
    std::size_t proven_violations = 0;  // of the proven tier alone (what proven_only judges)
  };
  std::vector<TensorVerdict> tensors;
  // Set when a signal stopped the judgement part way ("interrupted by signal 15 after 5 of 16
  // heads ..."): the comparison covers what was judged before it, and the report says so.
  std::string incomplete;
  // What the judgement left out and why ("lse not returned: not judged").
  std::vector<std::string> notes;
  // A batch-invariance case (ops/paged_attention/invariance.hpp): the same requests run in other
  // batches and layouts, each request's output compared bit for bit with its first run's.
  struct InvarianceRun {
    std::string name;            // "batch of 17", "alone", "again", ...
    std::size_t batch = 0;       // requests in one call
    bool judged = false;         // judged against the reference (it differed from the first run)
    double max_bound_ratio = 0;  // of its judgement, when judged
  };
  struct BitwiseChange {
    std::size_t request = 0;   // its index in the pool
    std::string run;           // the run it changed in
    std::string output;        // the output that changed ("out", "lse")
    std::size_t elements = 0;  // elements whose bits differ from the first run
    std::uint64_t max_ulps = 0;
    double max_abs = 0;  // NaN when one of them is NaN
  };
  struct Invariance {
    std::size_t requests = 0;
    std::size_t near_ties = 0;  // rows of the first run whose two largest values are within one ulp
    std::vector<InvarianceRun> runs;
    std::vector<BitwiseChange> changes;
  };
  std::optional<Invariance> invariance;
  [[nodiscard]] bool passed() const { return failures.empty(); }
  // Passed, but the case cannot discriminate (metrics::Comparison::inconclusive): not a plain pass.
  [[nodiscard]] bool inconclusive() const { return !crashed && passed() && comparison.inconclusive(); }
  // "pass", "fail", "crash" or "inconclusive": what reports write and verdicts read.
  [[nodiscard]] const char* status() const;
};

struct GateSettings {
  // The operations swept, in sweep order (ops/registry.hpp's all_operations()).
  std::span<const Operation* const> operations;
  std::vector<std::string> kernels{"all"};
  std::vector<std::size_t> sizes;  // default: 16 to 16,384 in powers of two; no zeros, no repeats
  std::uint64_t seed = 20241008;   // the base seed; each case derives its own from it and its id
  std::string only_case;           // --case: run just this case id
  std::size_t shard_index = 0;
  std::size_t shard_count = 1;
  std::string json_path, junit_path, budget_path, baseline_path;
  bool update_baseline = false;
  bool explicit_kernels = false;            // kernels were named: broken kernels are judged plainly
  std::shared_ptr<kernels::Plugin> plugin;  // --plugin: its cases join the sweep
  std::string reproducer_directory = "sharpcheck-reproducers";
  unsigned threads = 0;  // 0: every core; plugin runs use one (they fork)
  // --proven-only judges by the proven tier alone; by default a case fails on either tier.
  metrics::Tier strictest = metrics::Tier::statistical;
  // The precision model a plugin's attention is judged by (--tolerance-of; metrics/tolerance_table.hpp).
  std::string plugin_attention_model = "attention_flash";
  [[nodiscard]] bool whole_sweep() const { return shard_count == 1 && only_case.empty(); }
};

// The cases of a sweep, in a fixed order (so shards partition it the same way on every machine).
// InputError for an unknown kernel or case id, a size of 0, or a sweep with no cases.
[[nodiscard]] std::vector<GateCase> plan_cases(const GateSettings& settings);
// The sweep's sizes: --sizes with repeats folded (InputError for 0), or 16 to 16,384.
[[nodiscard]] std::vector<std::size_t> sweep_sizes(const GateSettings& settings);

// A judgement a signal stopped part way, carrying what it had judged (CaseOutcome::incomplete
// says how much), so that compare's report keeps it.
class InterruptedJudgement : public Interrupted {
 public:
  InterruptedJudgement(int signal_number, CaseOutcome partial)
      : Interrupted(signal_number), partial_(std::move(partial)) {}
  [[nodiscard]] const CaseOutcome& partial() const { return partial_; }

 private:
  CaseOutcome partial_;
};

// Runs one case and judges it by the tolerance table.
[[nodiscard]] CaseOutcome run_case(const GateCase& gate_case, const GateSettings& settings);

}  // namespace sharpcheck::gate
