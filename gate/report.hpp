// The gate's records and reports: a case as JSON, budgets and baselines applied to it, the
// reports of shards merged into the whole sweep's, and JUnit XML for CI systems. Every report is
// written through io::write_file_atomically; every file read is checked, so a malformed report,
// budget or baseline is an InputError naming the file and the key, never undefined behaviour.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gate/cases.hpp"
#include "gate/verdict.hpp"

namespace sharpcheck::gate {

[[nodiscard]] nlohmann::json to_json(const CaseOutcome& outcome);

// A budget: {"kernels": {name: {"max_ulps": unsigned integer, "max_bound_ratio": number >= 0,
// "tolerance_of": a tolerance entry}}};
// a baseline: {"cases": {id: {"max_ulps": ..., "max_bound_ratio": ...}}}. Both are checked when
// read (InputError naming the file and the key: wrong types, negative limits).
[[nodiscard]] nlohmann::json read_budget(const std::string& path);
[[nodiscard]] nlohmann::json read_baseline(const std::string& path);
void apply_budget(CaseOutcome& outcome, const nlohmann::json& budget);
// The tolerance entry (precision model) a budget names for a kernel ({"tolerance_of":
// "attention_p_rounded"}), or "" when it names none: the entry the kernel is judged by unless one is given on
// the command line.
[[nodiscard]] std::string budget_tolerance(const nlohmann::json& budget, const std::string& kernel);
void apply_baseline(CaseOutcome& outcome, const nlohmann::json& baseline);
[[nodiscard]] nlohmann::json baseline_of(const std::vector<nlohmann::json>& cases);

// A whole report (what --json holds) of these cases.
struct ReportHeader {
  std::uint64_t seed = 0;
  std::size_t shard_index = 0, shard_count = 1;
  bool explicit_kernels = false;
};
[[nodiscard]] nlohmann::json report_json(const ReportHeader& header,
                                         const std::vector<nlohmann::json>& cases);

// Joins shard reports into the report of the whole sweep (cases in sweep order, a case given
// twice kept once). InputError for reports that are malformed, from different seeds, or hold no
// case. `whole_sweep` says whether every shard of the sweep was given.
// (NOLINT: clang-tidy sees nlohmann::json's destructor as possibly throwing in the implicit
// noexcept special members; it does not throw.)
struct MergedReport {  // NOLINT(bugprone-exception-escape)
  nlohmann::json report;
  bool whole_sweep = false;
  std::size_t duplicates_dropped = 0;
};
[[nodiscard]] MergedReport merge_reports(const std::vector<nlohmann::json>& reports);

// JUnit XML: a <testsuite> per kernel, a <testcase> per case; an expected failure is <skipped>,
// and a kernel whose verdict fails without a failing case (an unexpected pass) gets a failing
// <testcase> of its own, so the XML's failures agree with the exit code.
[[nodiscard]] std::string junit_xml(const std::vector<nlohmann::json>& cases, JudgingScope scope);

// Reads a JSON file; InputError naming the file (and `what` it is) when unreadable or malformed.
[[nodiscard]] nlohmann::json read_json_file(const std::string& path, const char* what);

}  // namespace sharpcheck::gate
