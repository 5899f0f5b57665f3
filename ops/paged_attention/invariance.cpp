// Batch invariance (ops/paged_attention/invariance.hpp): the runs, the bitwise comparison by
// request, and the judgements.
#include "ops/paged_attention/invariance.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "gate/case_tools.hpp"

namespace sharpcheck::ops::paged {
namespace {

struct Run {
  std::string name;
  std::vector<std::size_t> members;  // requests, in batch order
  bool other_layout = false;         // pages of 64, HND, indptr form
  bool same_pages_as_first = false;  // the identical call again
};

std::string range_text(std::size_t first, std::size_t last) {
  return "requests " + std::to_string(first) + "-" + std::to_string(last);
}

std::vector<Run> runs_of(std::size_t requests) {
  std::vector<std::size_t> all(requests);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const std::string whole = "batch of " + std::to_string(requests);
  std::vector<Run> runs{{.name = whole, .members = all},
                        {.name = whole + " again", .members = all, .same_pages_as_first = true}};
  for (std::size_t r = 0; r < requests; ++r) runs.push_back({.name = "alone", .members = {r}});
  for (const std::size_t size : {std::size_t{15}, std::size_t{16}}) {
    if (size >= requests) continue;
    const std::size_t first = requests - size;
    runs.push_back(
        {.name = "batch of " + std::to_string(size) + " (" + range_text(first, requests - 1) + ")",
         .members = std::vector<std::size_t>(all.begin() + static_cast<std::ptrdiff_t>(first), all.end())});
  }
  runs.push_back(
      {.name = whole + " reversed", .members = std::vector<std::size_t>(all.rbegin(), all.rend())});
  runs.push_back({.name = whole + " in pages of 64, HND, indptr form", .members = all, .other_layout = true});
  return runs;
}

// Request k of a batch's output: its queries' rows, every head, every dim.
std::vector<double> slice(const gate::Array& out, const Problem& problem, std::size_t k) {
  const std::size_t row = problem.heads * problem.dim;
  std::vector<double> values((problem.query_offsets[k + 1] - problem.query_offsets[k]) * row);
  out.read(problem.query_offsets[k] * row, values);
  return values;
}

// Elements whose bits differ, and the largest distance among them in bf16 ulps (NaN against a
// number counts as the format's whole range) and in absolute value (NaN when one is NaN).
gate::CaseOutcome::BitwiseChange compare_bits(std::span<const double> first, std::span<const double> now) {
  gate::CaseOutcome::BitwiseChange change;
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(first[i]) == std::bit_cast<std::uint64_t>(now[i])) continue;
    ++change.elements;
    const auto distance = ulp_distance(first[i], now[i], bf16);
    change.max_ulps = std::max(change.max_ulps, distance.value_or(UINT64_MAX));
    const double gap = std::abs(first[i] - now[i]);
    change.max_abs = std::isnan(gap) ? gap : std::max(change.max_abs, gap);
  }
  return change;
}

// Rows (token, head) whose two largest values are within one bf16 ulp: a one-ulp batch variance
// there can flip an argmax downstream.
std::size_t near_ties(const gate::Array& out, const Problem& problem) {
  std::vector<double> row(problem.dim);
  std::size_t ties = 0;
  for (std::size_t at = 0; at + problem.dim <= out.size(); at += problem.dim) {
    out.read(at, row);
    if (!std::all_of(row.begin(), row.end(), [](double x) { return std::isfinite(x); })) continue;
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
    if (ulp_distance(row[0], row[1], bf16).value_or(2) <= 1) ++ties;
  }
  return ties;
}

std::string three_digits(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", x);
  return text;
}

// "8 of 17 requests changed bit for bit: alone: 2, 3, 5; in the batch of 15 (requests 2-16): 2, 5;
// largest: request 5 alone, 95 elements, max |diff| 0.000977".
std::string changes_text(const std::vector<gate::CaseOutcome::BitwiseChange>& changes, std::size_t requests) {
  std::vector<bool> seen(requests, false);
  std::string by_run, last_run;
  const gate::CaseOutcome::BitwiseChange* largest = &changes.front();
  for (const auto& c : changes) {
    seen[c.request] = true;
    if (c.run != last_run)
      by_run += (last_run.empty() ? "" : "; ") + (c.run == "alone" ? c.run : "in the " + c.run) + ": ";
    else
      by_run += ", ";
    by_run += std::to_string(c.request);
    last_run = c.run;
    if (!(c.max_abs <= largest->max_abs)) largest = &c;
  }
  return std::to_string(std::count(seen.begin(), seen.end(), true)) + " of " + std::to_string(requests) +
         " requests changed bit for bit with the batch they ran in: " + by_run + "; largest: request " +
         std::to_string(largest->request) + (largest->run == "alone" ? " alone" : " in the " + largest->run) +
         ", " + std::to_string(largest->elements) + " elements, max |diff| " + three_digits(largest->max_abs);
}

}  // namespace

void judge_invariance(const Kernel& kernel, const Scenario& scenario, std::uint64_t seed,
                      const JudgeRun& judge, gate::CaseOutcome& outcome) {
  DeterministicRandom seeds(seed);
  std::vector<Request> pool;
  for (std::size_t r = 0; r < scenario.keys.size(); ++r)
    pool.push_back(make_request(scenario.keys[r], scenario.queries[r], seeds.next_u64()));
  Scenario other = scenario;
  other.page = 64;
  other.heads_first = other.indptr_form = true;
  gate::CaseOutcome::Invariance record{.requests = pool.size(), .near_ties = 0, .runs = {}, .changes = {}};
  std::vector<std::vector<double>> first(pool.size());
  std::vector<std::string> wrong, nondeterministic;
  std::uint64_t first_pages = 0;
  for (const Run& run : runs_of(pool.size())) {
    std::vector<Request> batch;
    for (const std::size_t r : run.members) batch.push_back(pool[r]);
    const std::uint64_t pages = run.same_pages_as_first ? first_pages : seeds.next_u64();
    if (record.runs.empty()) first_pages = pages;
    const Scenario& layout = run.other_layout ? other : scenario;
    const Problem problem = pack_requests(batch, layout, pages);
    const auto out = paged::run(kernel, layout, problem);
    const bool is_first = record.runs.empty();
    bool changed = false;
    for (std::size_t k = 0; k < run.members.size(); ++k) {
      std::vector<double> now = slice(*out, problem, k);
      if (is_first) {
        first[run.members[k]] = std::move(now);
        continue;
      }
      gate::CaseOutcome::BitwiseChange change = compare_bits(first[run.members[k]], now);
      if (change.elements == 0) continue;
      changed = true;
      change.request = run.members[k];
      change.run = run.name;
      record.changes.push_back(change);
      if (run.same_pages_as_first) nondeterministic.push_back(std::to_string(change.request));
    }
    gate::CaseOutcome::InvarianceRun entry{
        .name = run.name, .batch = run.members.size(), .judged = false, .max_bound_ratio = 0};
    if (is_first || changed) {
      gate::CaseOutcome judged = judge(layout, problem, *out);
      entry.judged = true;
      entry.max_bound_ratio = judged.comparison.max_bound_ratio;
      if (is_first) {
        record.near_ties = near_ties(*out, problem);
        gate::adopt_judgement(std::move(judged), outcome);
      } else if (!judged.passed()) {
        wrong.push_back("the " + run.name + ": " + judged.failures.front());
      }
    }
    record.runs.push_back(std::move(entry));
  }
  for (const std::string& w : wrong) outcome.failures.push_back("wrong in another batch, " + w);
  if (!record.changes.empty())
    outcome.failures.push_back("not batch-invariant: " + changes_text(record.changes, pool.size()));
  if (!nondeterministic.empty()) {
    std::string list;
    for (const std::string& r : nondeterministic) list += (list.empty() ? "" : ", ") + r;
    outcome.failures.push_back("not deterministic: the same call twice changed requests " + list);
  }
  outcome.invariance = std::move(record);
}

}  // namespace sharpcheck::ops::paged
