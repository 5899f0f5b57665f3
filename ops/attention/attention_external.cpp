// The attention sweep for kernels outside the gate (sharpcheck.cases and sharpcheck.sweep): the
// plugin's cases (normal Q, K, V at every size, at temperature 2 and causal; the scenarios the
// plugin ABI can express), each as the tensors and options the attention judge takes.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "gate/attention_scenarios.hpp"
#include "gate/case_inputs.hpp"
#include "gate/case_tools.hpp"
#include "ops/attention/attention_op.hpp"

namespace sharpcheck::ops {
namespace {

// Stored shapes of Q or K and V in the layout: `rows` the sequence length of a padded layout,
// `packed_rows` the total tokens of the packed one.
std::vector<std::size_t> stored_shape(const tensor::AttentionProblem& p, std::size_t heads, std::size_t rows,
                                      std::size_t packed_rows, std::size_t columns) {
  switch (p.layout) {
    case tensor::Layout::bhsd:
      return {p.shape.batch, heads, rows, columns};
    case tensor::Layout::bshd:
      return {p.shape.batch, rows, heads, columns};
    case tensor::Layout::packed:
      break;
  }
  return {packed_rows, heads, columns};
}

nlohmann::json counts(const std::vector<std::size_t>& values) { return nlohmann::json(values); }

// The options and needs of the problem's scores beyond the plain softmax(scale Q K^T) V.
void add_score_options(const tensor::AttentionProblem& p, gate::ExternalCase& c) {
  const tensor::HeadScores& s = p.scores;
  c.options["scale"] = s.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.shape.head_dim)));
  const auto need = [&c](const char* feature) { c.needs.emplace_back(feature); };
  if (p.layout != tensor::Layout::bhsd) c.options["layout"] = std::string(tensor::layout_name(p.layout));
  if (s.causal) {
    c.options["causal"] = true;
    need("causal");
  }
  if ((s.causal || s.window_left || s.window_right) &&
      s.alignment == tensor::DiagonalAlignment::bottom_right) {
    c.options["align"] = "bottom-right";
    need("align");
  }
  if (s.window_left || s.window_right) {
    const auto side = [](const std::optional<std::size_t>& w) {
      return w ? static_cast<long long>(*w) : -1LL;
    };
    c.options["window"] = {side(s.window_left), side(s.window_right)};
    need("window");
  }
  if (s.softcap != 0) {
    c.options["softcap"] = s.softcap;
    need("softcap");
  }
  if (s.theta != 1) {
    c.options["theta"] = s.theta;
    need("theta");
  }
  if (p.shape.kv_heads != p.shape.heads) need("gqa");
}

void add_lengths(const tensor::AttentionProblem& p, gate::ExternalCase& c) {
  if (!p.query_lengths.empty()) {
    c.options["query_lengths"] = counts(p.query_lengths);
    c.needs.emplace_back("query_lengths");
  }
  if (!p.key_lengths.empty()) {
    c.options["key_lengths"] = counts(p.key_lengths);
    c.needs.emplace_back("key_lengths");
  }
  if (p.layout == tensor::Layout::packed) {
    c.options["cu_seqlens_q"] = counts(p.cu_seqlens_q);
    c.options["cu_seqlens_k"] = counts(p.cu_seqlens_k);
    c.needs.emplace_back("cu_seqlens");
  }
}

std::string case_id(const std::string& kernel, std::string input, std::size_t n, double theta, bool causal) {
  gate::GateCase shape;  // only for the id, in the gate's form
  shape.kernel = kernel;
  shape.input = std::move(input);
  shape.n = n;
  shape.attention_theta = theta;
  shape.causal = causal;
  return shape.id();
}

}  // namespace

namespace {

// Exact probes (issue 35): V constant (3: the peers take ones, but an expected 1 cannot discriminate
// in the judge's informative-element rule), so every output is exactly 3 (an fp8 kernel that gave 0.637
// or a row sum that picked up a neighbour's fails at once); Q zero, so every weight is exactly 1/n
// and the log-sum-exp exactly ln n. Judged like every case, against the exact values.
void add_probes(const std::string& kernel, const gate::ExternalSweep& sweep,
                std::vector<gate::ExternalCase>& cases) {
  for (const char* probe : {"attention_probe_constant_v", "attention_probe_zero_q"}) {
    for (const std::size_t n : sweep.sizes) {
      std::string id = case_id(kernel, probe, n, 1, false);
      auto [q, k, v] = gate::attention_inputs(n, gate::case_seed(sweep.seed, id), *sweep.format);
      if (std::string_view(probe) == "attention_probe_constant_v") {
        std::fill(v.values.begin(), v.values.end(), 3.0);
      } else {
        std::fill(q.values.begin(), q.values.end(), 0.0);
      }
      tensor::AttentionProblem p;
      p.shape = {1, 1, 1, gate::attention_queries, n, gate::attention_dimension, gate::attention_dimension};
      p.scores.scale = 0.125;
      cases.push_back(attention_problem_case(std::move(id), p, std::move(q.values), std::move(k.values),
                                             std::move(v.values)));
    }
  }
}

}  // namespace

gate::ExternalCase attention_problem_case(std::string id, const tensor::AttentionProblem& p,
                                          std::vector<double> q, std::vector<double> k,
                                          std::vector<double> v) {
  gate::ExternalCase c;
  c.id = std::move(id);
  const tensor::AttentionShape& shape = p.shape;
  c.tensors.push_back(
      {.name = "q",
       .shape = stored_shape(p, shape.heads, shape.queries, p.stored_queries(), shape.head_dim),
       .values = std::move(q)});
  c.tensors.push_back({.name = "k",
                       .shape = stored_shape(p, shape.kv_heads, shape.keys, p.stored_keys(), shape.head_dim),
                       .values = std::move(k)});
  c.tensors.push_back({.name = "v",
                       .shape = stored_shape(p, shape.kv_heads, shape.keys, p.stored_keys(), shape.value_dim),
                       .values = std::move(v)});
  if (!p.alibi_slopes.empty()) {
    c.tensors.push_back(
        {.name = "alibi_slopes", .shape = {shape.heads}, .values = p.alibi_slopes, .stored_as = "fp64"});
    c.needs.emplace_back("alibi_slopes");
  }
  if (!p.sinks.empty()) {
    c.tensors.push_back({.name = "sinks", .shape = {shape.heads}, .values = p.sinks, .stored_as = "fp64"});
    c.needs.emplace_back("sinks");
  }
  add_score_options(p, c);
  add_lengths(p, c);
  return c;
}

std::vector<gate::ExternalCase> attention_external_cases(const gate::ExternalSweep& sweep) {
  const std::string kernel = "python:attention:" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  for (const auto& [theta, causal] :
       {std::pair{1.0, false}, std::pair{2.0, false}, std::pair{1.0, true}, std::pair{2.0, true}}) {
    for (const std::size_t n : sweep.sizes) {
      std::string id = case_id(kernel, gate::attention_input, n, theta, causal);
      auto [q, k, v] = gate::attention_inputs(n, gate::case_seed(sweep.seed, id), *sweep.format);
      tensor::AttentionProblem p;
      p.shape = {1, 1, 1, gate::attention_queries, n, gate::attention_dimension, gate::attention_dimension};
      // 1/sqrt(64)/theta: a power of two, the same function however a kernel rounds its scale.
      p.scores.scale = 0.125 / theta;
      p.scores.causal = causal;
      cases.push_back(attention_problem_case(std::move(id), p, std::move(q.values), std::move(k.values),
                                             std::move(v.values)));
    }
  }
  add_probes(kernel, sweep, cases);
  for (const gate::AttentionScenario& scenario : gate::attention_scenarios()) {
    // The probe scenarios are the built-in kernels' form of add_probes (at the sweep's sizes here).
    if (!scenario.plugin_callable || scenario.exact_probe) continue;
    std::string id =
        case_id(kernel, "attention_" + std::string(scenario.name), gate::scenario_keys(scenario), 1, false);
    gate::ScenarioInputs inputs =
        gate::make_scenario(scenario, gate::case_seed(sweep.seed, id), *sweep.format);
    cases.push_back(attention_problem_case(std::move(id), inputs.problem, std::move(inputs.q),
                                           std::move(inputs.k), std::move(inputs.v)));
  }
  return cases;
}

}  // namespace sharpcheck::ops
