#include "gate/verdict.hpp"

#include <cmath>
#include <map>

namespace sharpcheck::gate {

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::pass:
      return "pass";
    case Verdict::fail:
      return "FAIL";
    case Verdict::expected_failure:
      return "expected failure";
    case Verdict::unexpected_pass:
      return "UNEXPECTED PASS";
    case Verdict::pending_failure:
      return "no failure in this shard (merge decides)";
  }
  return "?";
}

int SweepVerdict::exit_code() const {
  if (any_crash) return 3;
  return any_failure ? 1 : 0;
}

bool is_failure_status(const std::string& status) { return status == "fail" || status == "crash"; }

bool is_expected_failure(const nlohmann::json& case_record, JudgingScope scope) {
  return case_record.at("deliberately_broken").get<bool>() && !scope.explicit_kernels;
}

namespace {

Verdict kernel_verdict(const KernelVerdict& k, JudgingScope scope) {
  if (k.broken) {
    if (k.failed > 0) return Verdict::expected_failure;
    return scope.whole_sweep ? Verdict::unexpected_pass : Verdict::pending_failure;
  }
  return k.failed > 0 ? Verdict::fail : Verdict::pass;
}

double bound_ratio_of(const nlohmann::json& c) {
  const auto& ratio = c.at("max_bound_ratio");
  return ratio.is_number() ? ratio.get<double>() : INFINITY;
}

}  // namespace

SweepVerdict judge_sweep(const std::vector<nlohmann::json>& cases, JudgingScope scope) {
  SweepVerdict sweep;
  std::map<std::string, std::size_t> position;
  for (const auto& c : cases) {
    const std::string kernel = c.at("kernel").get<std::string>();
    auto [entry, added] = position.try_emplace(kernel, sweep.kernels.size());
    if (added) {
      KernelVerdict first;
      first.kernel = kernel;
      sweep.kernels.push_back(first);
    }
    KernelVerdict& k = sweep.kernels[entry->second];
    k.format = c.at("format").get<std::string>();
    k.broken = is_expected_failure(c, scope);
    ++k.cases;
    const std::string status = c.at("status").get<std::string>();
    if (is_failure_status(status)) ++k.failed;
    if (status == "inconclusive") ++k.inconclusive;
    if (status == "crash") ++k.crashed;
    k.max_ulps = std::max(k.max_ulps, c.at("max_ulps").get<std::uint64_t>());
    const double ratio = bound_ratio_of(c);
    if (k.worst == nullptr || ratio > k.max_bound_ratio) {
      k.max_bound_ratio = std::max(k.max_bound_ratio, ratio);
      k.worst = &c;
    }
  }
  for (auto& k : sweep.kernels) {
    k.verdict = kernel_verdict(k, scope);
    sweep.any_crash = sweep.any_crash || k.crashed > 0;
    sweep.any_failure =
        sweep.any_failure || k.verdict == Verdict::fail || k.verdict == Verdict::unexpected_pass;
  }
  return sweep;
}

}  // namespace sharpcheck::gate
