// The attention backward record: the registry's kernels and a plugin's backward entries on the
// backward sweep's problems (inputs/attention_backward_cases.hpp), and gradients computed
// elsewhere (gate/judge_backward_arrays.hpp).
#include "ops/attention_backward/attention_backward_op.hpp"

#include "gate/case_inputs.hpp"
#include "gate/case_tools.hpp"
#include "gate/judge_backward_arrays.hpp"
#include "inputs/attention_backward_cases.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/plugin_abi.h"
#include "metrics/judge_backward.hpp"
#include "metrics/recipes.hpp"
#include "ops/attention/attention_op.hpp"

namespace sharpcheck::ops {
namespace {

using gate::CaseOutcome;
using gate::GateCase;
using gate::GateSettings;
using gate::TensorRole;

constexpr gate::TensorSpec backward_tensors[] = {
    {.name = "q",
     .role = TensorRole::input,
     .shape = "[B,H,S,D] as layout, or [S,D]",
     .meaning = "the queries"},
    {.name = "k", .role = TensorRole::input, .shape = "as q, with KV heads and keys", .meaning = "the keys"},
    {.name = "v", .role = TensorRole::input, .shape = "as k, with value dim", .meaning = "the values"},
    {.name = "d_out",
     .role = TensorRole::input,
     .shape = "as the output",
     .meaning = "the gradient reaching the output"},
    {.name = "dq",
     .role = TensorRole::judged,
     .shape = "as q",
     .meaning = "the kernel's dQ",
     .format = "format"},
    {.name = "dk",
     .role = TensorRole::judged,
     .shape = "as k",
     .meaning = "the kernel's dK",
     .format = "format"},
    {.name = "dv",
     .role = TensorRole::judged,
     .shape = "as v",
     .meaning = "the kernel's dV",
     .format = "format"},
    {.name = "d_lse",
     .role = TensorRole::optional_input,
     .shape = "as the log-sum-exp",
     .meaning = "the gradient reaching the log-sum-exp"},
    {.name = "d",
     .role = TensorRole::optional_judged,
     .shape = "as the log-sum-exp",
     .meaning = "the kernel's D = rowsum(dO * O), in fp32 (in the format itself when it is fp32 or wider)",
     .format = "d_format"},
    {.name = "d_sinks",
     .role = TensorRole::optional_judged,
     .shape = "[H]",
     .meaning = "the kernel's sink gradients",
     .format = "fp64"},
    sinks_tensor,
    alibi_slopes_tensor,
};

std::vector<gate::KernelRow> kernel_rows() {
  return gate::kernel_rows_of(kernels::attention_backward_kernels(), [](const auto&) { return true; });
}

// Every wanted kernel on every problem of the backward sweep; n is the problem's number of keys.
void plan_builtin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  for (const auto& kernel : kernels::attention_backward_kernels()) {
    if (!context.wanted(kernel.name)) continue;
    for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
      const std::size_t keys = inputs::backward_shape(kind).keys;
      cases.push_back(gate::make_case(
          std::string(kernel.name),
          std::string(gate::backward_input_prefix) + std::string(inputs::backward_kind_name(kind)), keys,
          context.settings, kernel.deliberately_broken, nullptr));
    }
  }
}

// A plugin that declares the backward (ABI version 4) runs the backward sweep's problems whose
// masks and modifiers it declares; the sink with a log-sum-exp gradient needs version 5's entry.
void plan_plugin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  const GateSettings& settings = context.settings;
  const std::string prefix = "plugin:" + settings.plugin->name() + ":";
  const std::uint32_t features = settings.plugin->features();
  if ((features & SHARPCHECK_ATTENTION_BACKWARD) == 0) return;
  const auto needs = [](inputs::BackwardKind kind) -> std::uint32_t {
    switch (kind) {
      case inputs::BackwardKind::normal_causal:
        return SHARPCHECK_ATTENTION_CAUSAL;
      case inputs::BackwardKind::near_softcap:
        return SHARPCHECK_ATTENTION_SOFTCAP;
      case inputs::BackwardKind::fully_masked_rows:
        return SHARPCHECK_ATTENTION_CAUSAL | SHARPCHECK_ATTENTION_BOTTOM_RIGHT;
      case inputs::BackwardKind::sink_and_lse:
        return SHARPCHECK_ATTENTION_SINK | SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK;
      case inputs::BackwardKind::alibi_window:
        return SHARPCHECK_ATTENTION_ALIBI | SHARPCHECK_ATTENTION_WINDOW | SHARPCHECK_ATTENTION_BOTTOM_RIGHT;
      default:
        return 0;
    }
  };
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
      if ((needs(kind) & ~features) != 0) continue;
      const std::size_t keys = inputs::backward_shape(kind).keys;
      cases.push_back(gate::make_case(
          prefix + "attention_backward_" + std::string(format->name),
          std::string(gate::backward_input_prefix) + std::string(inputs::backward_kind_name(kind)), keys,
          settings, false, format));
    }
  }
}

inputs::BackwardKind backward_kind_of(const GateCase& gate_case) {
  const std::string_view name = std::string_view(gate_case.input).substr(gate::backward_input_prefix.size());
  for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
    if (inputs::backward_kind_name(kind) == name) return kind;
  }
  return inputs::BackwardKind::normal_causal;
}

// Folds a backward judgement into the case: every gradient's comparison, the worst one named.
void record_backward(const metrics::BackwardJudgement& judgement, CaseOutcome& outcome) {
  const std::pair<const metrics::Comparison*, const char*> gradients[] = {
      {&judgement.d_queries, "dQ"},
      {&judgement.d_keys, "dK"},
      {&judgement.d_values, "dV"},
      {judgement.d_sink ? &*judgement.d_sink : nullptr, "dsink"},
      {judgement.d_rows ? &*judgement.d_rows : nullptr, "D"}};
  const metrics::Comparison* worst = &judgement.d_queries;
  outcome.worst_array = "dQ";
  outcome.comparison = judgement.d_queries;
  for (const auto& [comparison, name] : gradients) {
    if (comparison == nullptr || comparison == &judgement.d_queries) continue;
    outcome.comparison.merge(*comparison);
    if (comparison->max_bound_ratio > worst->max_bound_ratio) {
      worst = comparison;
      outcome.worst_array = name;
    }
  }
  outcome.worst_index = {worst->worst.row, worst->worst.index};
  if (!judgement.passed()) outcome.failures.push_back("tolerance table: " + judgement.describe_worst());
}

// An attention backward kernel on one problem of the backward sweep: dQ, dK, dV (and dsink, D)
// judged against the correctly rounded gradients; the worst element named with its gradient.
void run_backward_case(const kernels::AttentionBackwardKernel& kernel, const GateCase& gate_case,
                       CaseOutcome& outcome) {
  outcome.format = std::string(kernel.format->name);
  const inputs::BackwardInputs in =
      inputs::make_backward_inputs(backward_kind_of(gate_case), *kernel.format, gate_case.seed);
  const kernels::BackwardProblem problem{in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores};
  record_backward(metrics::judge_attention_backward(metrics::backward_tolerance_of(kernel), *kernel.format,
                                                    problem, kernel.run(problem)),
                  outcome);
}

// A plugin's sharpcheck_attention_backward (ABI version 4; _lse, version 5, with a sink or a
// log-sum-exp gradient) on one problem of the backward sweep, judged by attention_backward_flash's
// entry (D from O in the format), D and the sink's gradient too.
void run_plugin_backward_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  const inputs::BackwardInputs in =
      inputs::make_backward_inputs(backward_kind_of(gate_case), format, gate_case.seed);
  const kernels::BackwardProblem problem{in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores};
  const kernels::PluginRun run = settings.plugin->run_attention_backward(format, problem);
  if (run.status != kernels::PluginRun::Status::ok) {
    gate::record_plugin_failure(
        run, settings, gate_case,
        {{"_q", &in.queries}, {"_k", &in.keys}, {"_v", &in.values}, {"_dout", &in.d_out}}, outcome);
    return;
  }
  outcome.console = run.console;
  const std::size_t m = in.queries.rows, n = in.keys.rows, d = in.queries.cols, dv = in.values.cols;
  kernels::KernelGradients got{Matrix(m, d), Matrix(n, d), Matrix(n, dv), {}, {}};
  auto next = run.out.values.begin();
  for (Matrix* gradient : {&got.d_queries, &got.d_keys, &got.d_values}) {
    std::copy_n(next, gradient->values.size(), gradient->values.begin());
    next += static_cast<std::ptrdiff_t>(gradient->values.size());
  }
  got.d_rows.assign(next, next + static_cast<std::ptrdiff_t>(m));
  next += static_cast<std::ptrdiff_t>(m);
  got.d_sinks.assign(next, run.out.values.end());
  const auto* entry = kernels::find_attention_backward_kernel("attention_backward_flash");
  record_backward(metrics::judge_attention_backward(entry->tolerance, format, problem, got), outcome);
}

void run_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  if (gate_case.plugin_format != nullptr) {
    run_plugin_backward_case(gate_case, settings, outcome);
    return;
  }
  run_backward_case(*kernels::find_attention_backward_kernel(gate_case.kernel), gate_case, outcome);
}

// The backward sweep's problems for a kernel outside the gate, one head each in bhsd
// ([1, 1, S, D]), with d_out (and d_lse where the problem has one, needing "d_lse").
std::vector<gate::ExternalCase> external_cases(const gate::ExternalSweep& sweep) {
  const std::string kernel = "python:attention_backward:" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
    GateCase shape;  // only for the id, the gate's form
    shape.kernel = kernel;
    shape.input = std::string(gate::backward_input_prefix) + std::string(inputs::backward_kind_name(kind));
    shape.n = inputs::backward_shape(kind).keys;
    const std::string id = shape.id();
    inputs::BackwardInputs in =
        inputs::make_backward_inputs(kind, *sweep.format, gate::case_seed(sweep.seed, id));
    tensor::AttentionProblem p;
    const std::size_t m = in.queries.rows, n = in.keys.rows;
    p.shape = {1, 1, 1, m, n, in.queries.cols, in.values.cols};
    p.scores = in.scores;
    if (in.scores.alibi_slope != 0) p.alibi_slopes = {in.scores.alibi_slope};
    if (in.scores.sink) p.sinks = {*in.scores.sink};
    gate::ExternalCase c = attention_problem_case(id, p, std::move(in.queries.values),
                                                  std::move(in.keys.values), std::move(in.values.values));
    c.tensors.push_back(
        {.name = "d_out", .shape = {1, 1, m, in.d_out.cols}, .values = std::move(in.d_out.values)});
    if (!in.d_lse.empty()) {
      c.tensors.push_back({.name = "d_lse", .shape = {1, 1, m}, .values = std::move(in.d_lse)});
      c.needs.emplace_back("d_lse");
    }
    if (in.scores.causal && in.scores.alignment == tensor::DiagonalAlignment::bottom_right && m > n)
      c.judge_options["fully_masked"] =
          "zeros";  // queries that see no key: zero gradients, as FlashAttention
    cases.push_back(std::move(c));
  }
  return cases;
}

CaseOutcome judge_call(const gate::OpCall& call) {
  gate::BackwardArrays arrays;
  arrays.q = &call.at("q");
  arrays.k = &call.at("k");
  arrays.v = &call.at("v");
  arrays.d_out = &call.at("d_out");
  arrays.dq = &call.at("dq");
  arrays.dk = &call.at("dk");
  arrays.dv = &call.at("dv");
  arrays.d_lse = call.find("d_lse");
  arrays.d = call.find("d");
  read_head_values(call, arrays.scores);
  if (const gate::Array* d_sinks = call.find("d_sinks")) arrays.d_sinks = head_values(*d_sinks);
  return gate::judge_attention_backward_arrays(call.options.judge, arrays);
}

}  // namespace

const gate::Operation attention_backward_operation{
    .name = "attention_backward",
    .summary = "dQ, dK, dV (and the sinks' gradients, D) of attention, group by group",
    .tensors = backward_tensors,
    .options = attention_backward_options(),
    .allowance =
        "backward precision recipes (metrics/recipes.hpp): backward_flash_bf16, backward_flash_fp16, "
        "backward_math_bf16, backward_math_fp16, attention_backward_flash (default)",
    .plugin_entry = "sharpcheck_attention_backward, sharpcheck_attention_backward_lse",
    .kernels = kernel_rows,
    .plan_builtin = plan_builtin,
    .plan_plugin = plan_plugin,
    .run = run_case,
    .judge = judge_call,
    .external_cases = external_cases,
};

}  // namespace sharpcheck::ops
