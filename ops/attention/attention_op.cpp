// The attention record: its built-in kernels on normal Q, K, V and on the scenarios, a plugin's
// attention entries, and attention tensors computed elsewhere.
#include "ops/attention/attention_op.hpp"

#include <cmath>

#include "gate/attention_scenarios.hpp"
#include "gate/case_inputs.hpp"
#include "gate/case_tools.hpp"
#include "kernels/attention_layer.hpp"
#include "kernels/plugin_abi.h"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/judge_tensors.hpp"
#include "metrics/tolerance_table.hpp"
#include "ops/attention/max_logit_check.hpp"

namespace sharpcheck::ops {
namespace {

using gate::CaseOutcome;
using gate::GateCase;
using gate::GateSettings;
using gate::TensorRole;

constexpr gate::TensorSpec attention_tensors[] = {
    {.name = "q",
     .role = TensorRole::input,
     .shape = "[B,H,S,D] as layout, or [S,D]",
     .meaning = "the queries"},
    {.name = "k", .role = TensorRole::input, .shape = "as q, with KV heads and keys", .meaning = "the keys"},
    {.name = "v", .role = TensorRole::input, .shape = "as k, with value dim", .meaning = "the values"},
    {.name = "out",
     .role = TensorRole::judged,
     .shape = "as q, with value dim",
     .meaning = "the kernel's output",
     .format = "format"},
    {.name = "lse",
     .role = TensorRole::optional_judged,
     .shape = "[B,H,S], [H,T] packed, or [S]",
     .meaning = "the kernel's log-sum-exp",
     .format = "lse_format"},
    sinks_tensor,
    alibi_slopes_tensor,
    {.name = "max_logit",
     .role = TensorRole::optional_judged,
     .shape = "[H] (each head over the batch) or [B, H]",
     .meaning = "the largest scaled score scale q.k a head sees (QK-Clip's input), before soft-cap and bias",
     .format = "fp32"},
};

GateCase scenario_case(std::string kernel, const gate::AttentionScenario& scenario,
                       const GateSettings& settings, const FloatFormat* plugin_format, bool broken = false) {
  GateCase c = gate::make_case(std::move(kernel), "attention_" + std::string(scenario.name),
                               gate::scenario_keys(scenario), settings, broken, plugin_format);
  c.scenario = std::string(scenario.name);
  return c;
}

std::vector<gate::KernelRow> attention_kernel_rows() {
  return gate::kernel_rows_of(kernels::attention_kernels(), [](const auto&) { return true; });
}

void plan_builtin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  for (const auto& kernel : kernels::attention_kernels()) {
    if (!context.wanted(kernel.name)) continue;
    for (const std::size_t n : context.sizes) {
      cases.push_back(gate::make_case(std::string(kernel.name), gate::attention_input, n, context.settings,
                                      kernel.deliberately_broken, nullptr));
    }
    for (const auto& scenario : gate::attention_scenarios())
      cases.push_back(scenario_case(std::string(kernel.name), scenario, context.settings, nullptr,
                                    kernel.deliberately_broken));
  }
}

// A plugin's attention: every format at every size; the temperature and causal variants its
// features declare; every scenario whose features it declares (and that the ABI can express).
void plan_plugin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  const GateSettings& settings = context.settings;
  const std::uint32_t features = settings.plugin->features();
  const std::string prefix = "plugin:" + settings.plugin->name() + ":attention_";
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const std::size_t n : context.sizes)
      cases.push_back(gate::make_case(prefix + std::string(format->name), gate::attention_input, n, settings,
                                      false, format));
  }
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const auto& [theta, causal] : {std::pair{2.0, false}, std::pair{1.0, true}, std::pair{2.0, true}}) {
      if (theta != 1.0 && (features & SHARPCHECK_ATTENTION_SCALE) == 0) continue;
      if (causal && (features & SHARPCHECK_ATTENTION_CAUSAL) == 0) continue;
      for (const std::size_t n : context.sizes) {
        GateCase c = gate::make_case(prefix + std::string(format->name), gate::attention_input, n, settings,
                                     false, format);
        c.attention_theta = theta;
        c.causal = causal;
        cases.push_back(c);
      }
    }
  }
  if ((features & ~7U) == 0) return;
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const auto& scenario : gate::attention_scenarios()) {
      if (!scenario.plugin_callable ||
          (scenario.plugin_features & ~features & ~SHARPCHECK_ATTENTION_LSE) != 0)
        continue;
      cases.push_back(scenario_case(prefix + std::string(format->name), scenario, settings, format));
    }
  }
}

// A plugin's sharpcheck_attention on one head of normal Q, K, V (at the case's temperature and
// causal mask), judged by the model --tolerance-of names.
void run_plugin_head(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  const auto [q, k, v] = gate::attention_inputs(gate_case.n, gate_case.seed, format);
  // 1/sqrt(64)/theta with theta a power of two: exact in float, so the reference's exact
  // 1/sqrt(d) at temperature theta is the same function.
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(gate::attention_dimension)) /
                                        gate_case.attention_theta);
  const kernels::PluginRun run = settings.plugin->run_attention(format, q, k, v, scale, gate_case.causal);
  if (run.status != kernels::PluginRun::Status::ok) {
    gate::record_plugin_failure(run, settings, gate_case, {{"_q", &q}, {"_k", &k}, {"_v", &v}}, outcome);
    return;
  }
  outcome.console = run.console;
  tensor::HeadScores scores;
  scores.theta = gate_case.attention_theta;
  scores.causal = gate_case.causal;
  const auto evaluation = metrics::judge_attention(
      {kernels::Operation::attention, &format, &metrics::tolerance_for(settings.plugin_attention_model)}, q,
      k, v, scores, run.out);
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

// A scenario's whole problem, through a built-in kernel head by head or a plugin's layer entry in
// a child; judged as a layer, the log-sum-exp too when the kernel gives one, the worst element
// named by its full index.
void run_scenario_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  const gate::AttentionScenario& scenario = *gate::find_attention_scenario(gate_case.scenario);
  const auto* kernel = kernels::find_attention_kernel(gate_case.kernel);
  const FloatFormat& format = gate_case.plugin_format != nullptr ? *gate_case.plugin_format : *kernel->input;
  outcome.format = std::string(format.name);
  const gate::ScenarioInputs inputs = gate::make_scenario(scenario, gate_case.seed, format);
  const tensor::AttentionProblem& problem = inputs.problem;
  std::vector<double> out, lse;
  if (gate_case.plugin_format != nullptr) {
    const bool want_lse = (settings.plugin->features() & SHARPCHECK_ATTENTION_LSE) != 0;
    const kernels::PluginRun run =
        settings.plugin->run_attention_layer(format, problem, inputs.q, inputs.k, inputs.v, want_lse);
    if (run.status != kernels::PluginRun::Status::ok) {
      const auto as_row = [](const std::vector<double>& values) { return gate::one_row(values); };
      const Matrix q = as_row(inputs.q), k = as_row(inputs.k), v = as_row(inputs.v);
      gate::record_plugin_failure(run, settings, gate_case, {{"_q", &q}, {"_k", &k}, {"_v", &v}}, outcome);
      return;
    }
    outcome.console = run.console;
    const auto split = run.out.values.begin() + static_cast<std::ptrdiff_t>(problem.output_elements());
    out.assign(run.out.values.begin(), split);
    lse.assign(split, run.out.values.end());
  } else {
    kernels::LayerOutputs outputs =
        kernels::run_attention_layer(*kernel, problem, inputs.q, inputs.k, inputs.v);
    out = std::move(outputs.out);
    lse = std::move(outputs.lse);
  }
  const metrics::Tolerance& tolerance =
      metrics::tolerance_for(kernel != nullptr ? kernel->name : settings.plugin_attention_model);
  // A built-in kernel's output format may differ from its input's (attention_fp8: e4m3 in, bf16 out).
  const FloatFormat& output = kernel != nullptr ? *kernel->output : format;
  outcome.format = std::string(output.name);
  const metrics::JudgeSpec spec{kernels::Operation::attention, &output, &tolerance};
  // A kernel that quantises its own inputs is judged on the values its declared quantisation gives.
  const kernels::LayerInputs judged =
      kernel != nullptr ? kernels::declared_layer_inputs(*kernel, problem, inputs.q, inputs.k, inputs.v)
                        : kernels::LayerInputs{inputs.q, inputs.k, inputs.v};
  const auto judgement =
      metrics::judge_attention_tensors(spec, problem, judged.q, judged.k, judged.v, out, lse);
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  if (!outcome.comparison.passed(settings.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(settings.strictest) + "; " +
                               judgement.describe_worst());
  }
}

void run_attention_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  if (!gate_case.scenario.empty()) {
    run_scenario_case(gate_case, settings, outcome);
    return;
  }
  if (gate_case.plugin_format != nullptr) {
    run_plugin_head(gate_case, settings, outcome);
    return;
  }
  const auto* attention = kernels::find_attention_kernel(gate_case.kernel);
  outcome.format = std::string(attention->output->name);
  const auto [q, k, v] = gate::attention_inputs(gate_case.n, gate_case.seed, *attention->input);
  const auto evaluation = metrics::evaluate_attention(*attention, q, k, v, tensor::HeadScores{});
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

CaseOutcome judge_attention_call(const gate::OpCall& call) {
  gate::AttentionArrays arrays;
  arrays.q = &call.at("q");
  arrays.k = &call.at("k");
  arrays.v = &call.at("v");
  arrays.out = &call.at("out");
  arrays.lse = call.find("lse");
  read_head_values(call, arrays);
  gate::CaseOutcome outcome = gate::judge_attention_arrays(call.options.judge, arrays);
  if (const gate::Array* max_logit = call.find("max_logit"))
    judge_max_logit(call.options.judge, arrays, *max_logit, outcome);
  return outcome;
}

}  // namespace

const gate::Operation attention_operation{
    .name = "attention",
    .summary = "softmax(scale Q K^T + masks and modifiers) V, per head; optionally the log-sum-exp",
    .tensors = attention_tensors,
    .options = attention_options(),
    .allowance =
        "precision recipes (metrics/recipes.hpp): the one named, else every recipe the formats "
        "allow, the verdict under the first that fits",
    .plugin_entry = "sharpcheck_attention, sharpcheck_attention_layer",
    .kernels = attention_kernel_rows,
    .plan_builtin = plan_builtin,
    .plan_plugin = plan_plugin,
    .run = run_attention_case,
    .judge = judge_attention_call,
    .external_cases = attention_external_cases,
};

}  // namespace sharpcheck::ops
