// Batch invariance (gate/invariance.hpp): the bitwise comparison by request, near-ties, and the
// judgements of the runs that differ.
#include "gate/invariance.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "formats/float_format.hpp"
#include "gate/case_tools.hpp"

namespace sharpcheck::gate {
namespace {

// Elements whose bits differ, and the largest distance among them in ulps of the format (NaN
// against a number counts as the whole range) and in absolute value (NaN when one is NaN).
CaseOutcome::BitwiseChange compare_bits(std::span<const double> first, std::span<const double> now,
                                        const FloatFormat& format) {
  CaseOutcome::BitwiseChange change;
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(first[i]) == std::bit_cast<std::uint64_t>(now[i])) continue;
    ++change.elements;
    change.max_ulps = std::max(change.max_ulps, ulp_distance(first[i], now[i], format).value_or(UINT64_MAX));
    const double gap = std::abs(first[i] - now[i]);
    change.max_abs = std::isnan(gap) ? gap : std::max(change.max_abs, gap);
  }
  return change;
}

// Finite rows whose two largest values are within one ulp of the format.
std::size_t near_ties(std::span<const double> values, std::size_t row, const FloatFormat& format) {
  if (row < 2) return 0;
  std::vector<double> sorted(row);
  std::size_t ties = 0;
  for (std::size_t at = 0; at + row <= values.size(); at += row) {
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), row, sorted.begin());
    if (!std::all_of(sorted.begin(), sorted.end(), [](double x) { return std::isfinite(x); })) continue;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (ulp_distance(sorted[0], sorted[1], format).value_or(2) <= 1) ++ties;
  }
  return ties;
}

std::string three_digits(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", x);
  return text;
}

// Runs of one request alone ("request 3 alone") are listed together, as "alone".
bool alone(const std::string& run) { return run.starts_with("request ") && run.ends_with(" alone"); }
std::string group(const CaseOutcome::BitwiseChange& c) { return alone(c.run) ? "alone" : "in the " + c.run; }

// "8 of 17 requests changed bit for bit ...: alone: 2, 3, 5 (lse only: 3); in the batch of 15
// (requests 2-16): 2, 5; largest: request 5 alone, 95 elements of out, max |diff| 0.000977". The
// changes come by run, then request, then output ("out" before "lse").
std::string changes_text(const std::vector<CaseOutcome::BitwiseChange>& changes, std::size_t requests) {
  std::vector<bool> seen(requests, false);
  std::string by_run, listed, only, last_group;
  const auto close_group = [&] {
    if (!last_group.empty())
      by_run +=
          (by_run.empty() ? "" : "; ") + last_group + ": " + listed + (only.empty() ? "" : " (" + only + ")");
    listed.clear();
    only.clear();
  };
  const CaseOutcome::BitwiseChange* largest = &changes.front();
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const CaseOutcome::BitwiseChange& c = changes[i];
    if (c.request < requests) seen[c.request] = true;
    if (!(c.max_abs <= largest->max_abs)) largest = &c;
    const auto same_call = [&](std::size_t k) {
      return k < changes.size() && changes[k].request == c.request && changes[k].run == c.run;
    };
    if (i > 0 && same_call(i - 1)) continue;  // the same request's other output in the same run
    if (group(c) != last_group) close_group();
    last_group = group(c);
    listed += (listed.empty() ? "" : ", ") + std::to_string(c.request);
    if (!same_call(i + 1) && c.output != "out")  // a request whose only change is in another output
      only += (only.empty() ? c.output + " only: " : ", ") + std::to_string(c.request);
  }
  close_group();
  return std::to_string(std::count(seen.begin(), seen.end(), true)) + " of " + std::to_string(requests) +
         " requests changed bit for bit with the batch they ran in: " + by_run + "; largest: request " +
         std::to_string(largest->request) + " " + group(*largest) + ", " + std::to_string(largest->elements) +
         (largest->elements == 1 ? " element of " : " elements of ") + largest->output + ", max |diff| " +
         three_digits(largest->max_abs);
}

}  // namespace

void judge_invariance(const InvariancePlan& plan, const FloatFormat& format, const std::vector<double>& first,
                      const std::vector<const std::vector<double>*>& reruns, const JudgeCall& judge,
                      CaseOutcome& outcome) {
  const std::vector<RerunPlan>& plans = plan.reruns;
  const std::size_t requests = plan.requests;
  const std::size_t row_values =
      plan.row_values == 0 ? first.size() : std::min(plan.row_values, first.size());
  CaseOutcome::Invariance record{.requests = requests,
                                 .near_ties = near_ties(std::span(first).first(row_values), plan.row, format),
                                 .runs = {},
                                 .changes = {}};
  CaseOutcome first_judged = judge(0, first);
  record.runs.push_back({.name = plan.first_name,
                         .batch = requests,
                         .judged = true,
                         .max_bound_ratio = first_judged.comparison.max_bound_ratio});
  adopt_judgement(std::move(first_judged), outcome);
  std::vector<std::string> wrong, nondeterministic;
  std::vector<CaseOutcome::BitwiseChange> variant;  // across batches (not the same call again)
  for (std::size_t i = 0; i < plans.size(); ++i) {
    CaseOutcome::InvarianceRun entry{
        .name = plans[i].name, .batch = plans[i].batch, .judged = false, .max_bound_ratio = 0};
    if (reruns[i] == nullptr) {
      record.runs.push_back(std::move(entry));
      continue;
    }
    const std::vector<double>& now = *reruns[i];
    bool changed = false;
    for (const RequestStretch& s : plans[i].stretches) {
      CaseOutcome::BitwiseChange change =
          compare_bits(std::span(first).subspan(s.first_at, s.count),
                       std::span(now).subspan(s.here_at, s.count), s.format == nullptr ? format : *s.format);
      if (change.elements == 0) continue;
      changed = true;
      change.request = s.request;
      change.run = plans[i].name;
      change.output = s.output;
      record.changes.push_back(change);
      if (plans[i].same_call) {
        const std::string request = std::to_string(s.request);
        if (nondeterministic.empty() || nondeterministic.back() != request)
          nondeterministic.push_back(request);
      } else {
        variant.push_back(change);
      }
    }
    if (changed) {
      const CaseOutcome judged = judge(i + 1, now);
      entry.judged = true;
      entry.max_bound_ratio = judged.comparison.max_bound_ratio;
      if (!judged.passed())
        wrong.push_back("wrong in another batch, the " + plans[i].name + ": " + judged.failures.front());
    }
    record.runs.push_back(std::move(entry));
  }
  outcome.failures.insert(outcome.failures.end(), wrong.begin(), wrong.end());
  if (!variant.empty()) outcome.failures.push_back("not batch-invariant: " + changes_text(variant, requests));
  if (!nondeterministic.empty()) {
    std::string list;
    for (const std::string& r : nondeterministic) list += (list.empty() ? "" : ", ") + r;
    outcome.failures.push_back("not deterministic: the same call twice changed requests " + list);
  }
  outcome.invariance = std::move(record);
}

}  // namespace sharpcheck::gate
