// paged_attention's batch-invariance case (ops/paged_attention/invariance.hpp): its calls, and a
// built-in kernel run on them.
#include "ops/paged_attention/invariance.hpp"

#include <numeric>
#include <string>

#include "core/random.hpp"

namespace sharpcheck::ops::paged {
namespace {

struct Call {
  gate::RerunPlan plan;
  std::vector<std::size_t> members;  // requests, in batch order
  bool other_layout = false;
};

gate::RerunPlan named(std::string name, std::size_t batch) {
  gate::RerunPlan plan;
  plan.name = std::move(name);
  plan.batch = batch;
  return plan;
}

std::vector<Call> reruns_of(std::size_t requests) {
  std::vector<std::size_t> all(requests);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const std::string whole = "batch of " + std::to_string(requests);
  std::vector<Call> calls{{.plan = named(whole + " again", requests), .members = all}};
  for (std::size_t r = 0; r < requests; ++r)
    calls.push_back({.plan = named("request " + std::to_string(r) + " alone", 1), .members = {r}});
  for (const std::size_t size : {std::size_t{15}, std::size_t{16}}) {
    if (size >= requests) continue;
    const std::size_t first = requests - size;
    calls.push_back(
        {.plan = named("batch of " + std::to_string(size) + " (requests " + std::to_string(first) + "-" +
                           std::to_string(requests - 1) + ")",
                       size),
         .members = std::vector<std::size_t>(all.begin() + static_cast<std::ptrdiff_t>(first), all.end())});
  }
  calls.push_back({.plan = named(whole + " reversed", requests),
                   .members = std::vector<std::size_t>(all.rbegin(), all.rend())});
  calls.push_back({.plan = named(whole + " in pages of 64, HND, indptr form", requests),
                   .members = all,
                   .other_layout = true});
  calls.front().plan.same_call = true;  // the first call again
  return calls;
}

}  // namespace

InvarianceCalls invariance_calls(const Scenario& scenario, std::uint64_t seed, const FloatFormat& format) {
  DeterministicRandom seeds(seed);
  std::vector<Request> pool;
  for (std::size_t r = 0; r < scenario.keys.size(); ++r)
    pool.push_back(make_request(scenario.keys[r], scenario.queries[r], seeds.next_u64(), format));
  Scenario other = scenario;
  other.page = 64;
  other.heads_first = other.indptr_form = true;
  InvarianceCalls calls;
  calls.plan.first_name = "batch of " + std::to_string(pool.size());
  calls.plan.requests = pool.size();
  const std::uint64_t first_pages = seeds.next_u64();
  calls.problems.push_back(pack_requests(pool, scenario, first_pages));
  calls.layouts.push_back(scenario);
  // Each call's values are its out [T, H, D], then its lse [T, H] (paged_kernels.hpp's Outputs).
  const std::vector<std::size_t> first_offsets = calls.problems.front().query_offsets;  // problems grows
  const std::size_t heads = calls.problems.front().heads;
  const std::size_t row = heads * calls.problems.front().dim;
  const std::size_t first_out = first_offsets.back() * row;
  calls.plan.row = calls.problems.front().dim;
  calls.plan.row_values = first_out;
  for (Call& call : reruns_of(pool.size())) {
    std::vector<Request> batch;
    for (const std::size_t r : call.members) batch.push_back(pool[r]);
    const Scenario& layout = call.other_layout ? other : scenario;
    const std::uint64_t pages = call.plan.same_call ? first_pages : seeds.next_u64();
    const Problem& problem = calls.problems.emplace_back(pack_requests(batch, layout, pages));
    calls.layouts.push_back(layout);
    const std::size_t here_out = problem.query_offsets.back() * row;
    for (std::size_t k = 0; k < call.members.size(); ++k) {
      const std::size_t r = call.members[k];
      const std::size_t queries = problem.query_offsets[k + 1] - problem.query_offsets[k];
      call.plan.stretches.push_back({.request = r,
                                     .first_at = first_offsets[r] * row,
                                     .here_at = problem.query_offsets[k] * row,
                                     .count = queries * row});
      call.plan.stretches.push_back({.request = r,
                                     .first_at = first_out + first_offsets[r] * heads,
                                     .here_at = here_out + problem.query_offsets[k] * heads,
                                     .count = queries * heads,
                                     .output = "lse",
                                     .format = &fp32});
    }
    calls.plan.reruns.push_back(std::move(call.plan));
  }
  return calls;
}

void judge_invariance(const Kernel& kernel, const Scenario& scenario, std::uint64_t seed,
                      const JudgeRun& judge, gate::CaseOutcome& outcome) {
  const InvarianceCalls calls = invariance_calls(scenario, seed);
  std::vector<Outputs> outs;
  std::vector<std::vector<double>> values;
  for (std::size_t i = 0; i < calls.problems.size(); ++i) {
    outs.push_back(run(kernel, calls.layouts[i], calls.problems[i]));
    values.push_back(gate::all_values(*outs.back().out));
    const std::vector<double> lse = gate::all_values(*outs.back().lse);
    values.back().insert(values.back().end(), lse.begin(), lse.end());
  }
  std::vector<const std::vector<double>*> reruns;
  for (std::size_t i = 1; i < values.size(); ++i) reruns.push_back(&values[i]);
  gate::judge_invariance(
      calls.plan, bf16, values.front(), reruns,
      [&](std::size_t i, const std::vector<double>&) {
        return judge(calls.layouts[i], calls.problems[i], outs[i]);
      },
      outcome);
}

}  // namespace sharpcheck::ops::paged
