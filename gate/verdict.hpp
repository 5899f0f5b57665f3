// The gate's one verdict rule. A case passes or fails by its findings; a kernel's verdict is
// decided over its cases, and a deliberately broken kernel (run under --kernel all) is expected to
// fail somewhere in the whole sweep: a shard that saw none of its failures cannot call that an
// unexpected pass, only `merge` of every shard can. The table, the exit code, JSON and JUnit all
// read their verdicts from here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sharpcheck::gate {

enum class Verdict {
  pass,
  fail,
  expected_failure,  // a deliberately broken kernel failed, as it should
  unexpected_pass,   // a deliberately broken kernel passed the whole sweep: the gate lost its teeth
  pending_failure,   // a broken kernel passed this shard; the whole sweep (merge) decides
};
[[nodiscard]] const char* verdict_name(Verdict verdict);

// How the report is judged: whether broken kernels are judged plainly (they were named) and
// whether the cases are the whole sweep.
struct JudgingScope {
  bool explicit_kernels = false;
  bool whole_sweep = true;
};

struct KernelVerdict {
  std::string kernel;
  std::string format;
  std::size_t cases = 0;
  std::size_t failed = 0;
  std::size_t crashed = 0;
  std::size_t inconclusive = 0;  // cases that could not discriminate (neither pass nor fail)
  std::uint64_t max_ulps = 0;
  double max_bound_ratio = 0;
  bool broken = false;                    // deliberately broken and judged as such
  const nlohmann::json* worst = nullptr;  // the case with the largest bound ratio
  Verdict verdict = Verdict::pass;
};

struct SweepVerdict {
  std::vector<KernelVerdict> kernels;  // in the order their first case appears
  bool any_crash = false;
  bool any_failure = false;             // a kernel failed or passed unexpectedly
  [[nodiscard]] int exit_code() const;  // 3 on any crash, else 1 on any failure, else 0
};

// A case record's status ("pass", "fail", "crash", "inconclusive") counts against its kernel.
[[nodiscard]] bool is_failure_status(const std::string& status);

// Judges case records (gate/report.hpp's to_json), which must outlive the result.
[[nodiscard]] SweepVerdict judge_sweep(const std::vector<nlohmann::json>& cases, JudgingScope scope);

// Whether a failing case is shown as an expected failure (JUnit <skipped>) rather than a failure.
[[nodiscard]] bool is_expected_failure(const nlohmann::json& case_record, JudgingScope scope);

}  // namespace sharpcheck::gate
