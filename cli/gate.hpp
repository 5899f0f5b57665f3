// The CI gate: runs kernels over a sweep of cases, judges each case by the tolerance table (and
// optionally a budget and a baseline), and reports as a table, JSON and JUnit XML.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/plugin.hpp"
#include "metrics/comparison.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::cli {

// One case of the sweep: a kernel on one generated input.
struct GateCase {
  std::string kernel;
  std::string input;  // row kind, or "attention_normal"
  std::size_t n = 0;
  std::uint64_t seed = 0;       // this case's own seed: base_seed mixed with the case id
  std::uint64_t base_seed = 0;  // the sweep's --seed
  std::size_t index = 0;        // position in the unsharded sweep (merge orders by it)
  bool deliberately_broken = false;
  const FloatFormat* plugin_format = nullptr;  // set for a plugin's case: the format it runs in
  std::string plugin_path;
  [[nodiscard]] std::string id() const { return kernel + "/" + input + "/n=" + std::to_string(n); }
};

struct CaseOutcome {
  GateCase gate_case;
  std::string format;
  metrics::Comparison comparison;
  reference::ZivStatistics reference_statistics;
  double seconds = 0;
  std::vector<std::string> failures;  // tolerance, budget and baseline findings; empty = pass
  bool crashed = false;               // the kernel crashed, hung or returned an error
  std::string reproducer;             // for a crash: the .npy file holding its input
  [[nodiscard]] bool passed() const { return failures.empty(); }
};

struct GateSettings {
  std::vector<std::string> kernels{"all"};
  std::vector<std::size_t> sizes;  // default: 16 to 16,384 in powers of two
  std::uint64_t seed = 20241008;   // the base seed; each case derives its own from it and its id
  std::string only_case;           // --case: run just this case id
  std::size_t shard_index = 0;
  std::size_t shard_count = 1;
  std::string json_path, junit_path, budget_path, baseline_path;
  bool update_baseline = false;
  bool explicit_kernels = false;  // kernels were named: broken kernels are judged plainly
  std::shared_ptr<kernels::Plugin> plugin;  // --plugin: its cases join the sweep
  double plugin_timeout_seconds = 10;
  std::string reproducer_directory = "sharpcheck-reproducers";
  unsigned threads = 0;  // 0: every core; plugin runs use one (they fork)
};

// The cases of a sweep, in a fixed order (so shards partition it the same way on every machine).
[[nodiscard]] std::vector<GateCase> plan_cases(const GateSettings& settings);

// Runs one case and judges it by the tolerance table.
[[nodiscard]] CaseOutcome run_case(const GateCase& gate_case, const GateSettings& settings);

// Applies the budget file (max_ulps / max_bound_ratio per kernel) and the baseline (per case).
void apply_budget(CaseOutcome& outcome, const nlohmann::json& budget);
void apply_baseline(CaseOutcome& outcome, const nlohmann::json& baseline);

[[nodiscard]] nlohmann::json to_json(const CaseOutcome& outcome);
// Joins shard reports into the report of the whole sweep (cases in sweep order).
[[nodiscard]] nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports);
[[nodiscard]] nlohmann::json baseline_of(const std::vector<nlohmann::json>& cases);
[[nodiscard]] std::string junit_xml(const std::vector<nlohmann::json>& cases);
// Reads a JSON file; InputError naming the file (and `what` it is) when unreadable or malformed.
[[nodiscard]] nlohmann::json read_json_file(const std::string& path, const char* what);
// Writes text to path through a temporary file and a rename, so a reader never sees half a file.
void write_atomically(const std::string& path, const std::string& text);

// The verdict of a case under --kernel all: a broken kernel that fails is an expected failure.
enum class Verdict { pass, fail, expected_failure, unexpected_pass };
[[nodiscard]] Verdict verdict_of(const nlohmann::json& case_json, bool explicit_kernels);
[[nodiscard]] const char* verdict_name(Verdict verdict);

}  // namespace sharpcheck::cli
