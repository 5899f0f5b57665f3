// Running one case: a built-in kernel in this process, a plugin in a child; either way judged by
// the tolerance table against the correctly rounded reference.
#include <chrono>
#include <cmath>
#include <exception>

#include "core/errors.hpp"
#include "gate/attention_scenarios.hpp"
#include "gate/case_inputs.hpp"
#include "gate/cases.hpp"
#include "inputs/attention_backward_cases.hpp"
#include "inputs/attention_escape_cases.hpp"
#include "inputs/rows.hpp"
#include "io/atomic_file.hpp"
#include "io/npy.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/attention_escape_kernels.hpp"
#include "kernels/attention_layer.hpp"
#include "kernels/plugin_abi.h"
#include "kernels/registry.hpp"
#include "kernels/softmax_backward.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/judge_attention_escapes.hpp"
#include "metrics/judge_backward.hpp"
#include "metrics/judge_tensors.hpp"
#include "metrics/recipes.hpp"

namespace sharpcheck::gate {
namespace {

std::string file_name_of(const std::string& id) {
  std::string name = id;
  for (char& c : name) {
    if (c == '/' || c == ':' || c == '=') c = '_';
  }
  return name;
}

// Saves a crashed case's input, as the plugin saw it (bf16 as bit patterns). A reproducer that
// cannot be written must not hide the crash: the reason is returned in place of the path.
std::string save_reproducer(const GateSettings& settings, const std::string& name, const Matrix& input,
                            const FloatFormat& format, bool& saved) {
  std::vector<double> stored = input.values;
  io::NpyType type = io::NpyType::float32;
  if (format == bf16) {
    type = io::NpyType::uint16;
    for (double& x : stored) x = static_cast<double>(encode(x, bf16));
  } else if (format == fp16) {
    type = io::NpyType::float16;
  }
  const std::string path = settings.reproducer_directory + "/" + name + ".npy";
  try {
    io::make_writable_directory(settings.reproducer_directory);
    io::write_npy(path, type, {input.rows, input.cols}, stored);
    saved = true;
    return path;
  } catch (const std::exception& error) {
    saved = false;
    return std::string("(no reproducer: ") + error.what() + ")";
  }
}

// Records a plugin call that did not return an output, with its reproducers.
void record_plugin_failure(const kernels::PluginRun& run, const GateSettings& settings,
                           const GateCase& gate_case,
                           const std::vector<std::pair<std::string, const Matrix*>>& inputs,
                           CaseOutcome& outcome) {
  if (run.status == kernels::PluginRun::Status::interrupted) {
    outcome.interrupted = true;
    return;
  }
  const FloatFormat& format = *gate_case.plugin_format;
  const std::string base_name = file_name_of(gate_case.id());
  outcome.crashed = true;
  outcome.console = run.console;
  std::string saved_note;
  for (const auto& [suffix, matrix] : inputs) {
    bool saved = false;
    const std::string where = save_reproducer(settings, base_name + suffix, *matrix, format, saved);
    if (outcome.reproducer.empty() && saved) outcome.reproducer = where;
    if (!saved && saved_note.empty()) saved_note = where;
  }
  std::string failure = std::string("plugin ") + kernels::plugin_status_name(run.status) + ": " + run.detail;
  if (!outcome.reproducer.empty()) {
    failure += inputs.size() > 1 ? "; inputs saved to " + outcome.reproducer + " and its _k, _v siblings"
                                 : "; input saved to " + outcome.reproducer;
  }
  if (!saved_note.empty()) failure += "; " + saved_note;
  outcome.failures.push_back(failure);
}

// A plugin's case: run in a child process; a crash or hang is recorded with a reproducer.
void run_plugin_backward_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome);

void run_plugin_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  if (gate_case.input.starts_with(backward_input_prefix)) {
    run_plugin_backward_case(gate_case, settings, outcome);
    return;
  }
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  if (gate_case.input == attention_input) {
    const auto [q, k, v] = attention_inputs(gate_case.n, gate_case.seed, format);
    // 1/sqrt(64)/theta with theta a power of two: exact in float, so the reference's exact
    // 1/sqrt(d) at temperature theta is the same function.
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(attention_dimension)) /
                                          gate_case.attention_theta);
    const kernels::PluginRun run = settings.plugin->run_attention(format, q, k, v, scale, gate_case.causal);
    if (run.status != kernels::PluginRun::Status::ok) {
      record_plugin_failure(run, settings, gate_case, {{"_q", &q}, {"_k", &k}, {"_v", &v}}, outcome);
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
    return;
  }
  const auto kind = inputs::find_row_kind(gate_case.input).value();
  const Matrix logits = one_row(inputs::make_row(kind, gate_case.n, format, gate_case.seed));
  const kernels::PluginRun run =
      settings.plugin->run_softmax(format, logits, static_cast<float>(gate_case.softmax_scale));
  if (run.status != kernels::PluginRun::Status::ok) {
    record_plugin_failure(run, settings, gate_case, {{"", &logits}}, outcome);
    return;
  }
  outcome.console = run.console;
  const auto evaluation = metrics::judge_softmax(
      {kernels::Operation::softmax, &format, &metrics::tolerance_for("plugin_softmax")}, logits,
      1.0 / gate_case.softmax_scale, run.out);
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

inputs::BackwardKind backward_kind_of(const GateCase& gate_case) {
  const std::string_view name = std::string_view(gate_case.input).substr(backward_input_prefix.size());
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
    record_plugin_failure(run, settings, gate_case,
                          {{"_q", &in.queries}, {"_k", &in.keys}, {"_v", &in.values}, {"_dout", &in.d_out}},
                          outcome);
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

// A linear, selective or Differential attention kernel on one of its problems
// (inputs/attention_escape_cases.hpp), judged against the correctly rounded reference.
void run_escape_case(const kernels::AttentionEscapeKernel& kernel, const GateCase& gate_case,
                     CaseOutcome& outcome) {
  outcome.format = std::string(kernel.format->name);
  for (const inputs::EscapeKind kind : inputs::all_escape_kinds) {
    if (inputs::escape_kind_name(kind) != gate_case.input) continue;
    const auto problem = inputs::make_escape_problem(kind, *kernel.format, gate_case.seed);
    outcome.comparison =
        metrics::judge_attention_escape(problem, *kernel.format, kernel.run(problem)).comparison;
    outcome.worst_array = problem.operation == tensor::EscapeOperation::linear ? "out" : "weights";
    outcome.worst_index = {outcome.comparison.worst.row, outcome.comparison.worst.index};
    return;
  }
  throw InputError(InputProblem::out_of_range, "gate: no escape input named '" + gate_case.input + "'");
}

// A softmax-level backward kernel: row 0 the generated logits, row 1 fully masked; dy normal.
void run_softmax_backward_case(const kernels::SoftmaxBackwardKernel& kernel, const GateCase& gate_case,
                               CaseOutcome& outcome) {
  outcome.format = std::string(kernel.format->name);
  const auto kind = inputs::find_row_kind(gate_case.input).value();
  const auto row = inputs::make_row(kind, gate_case.n, *kernel.format, gate_case.seed);
  Matrix logits(2, row.size(), -INFINITY), dy(2, row.size());
  std::copy(row.begin(), row.end(), logits.row(0).begin());
  DeterministicRandom random(gate_case.seed ^ 0x5BD1E995ULL);
  for (double& g : dy.values) g = round_to_format(random.normal(0, 1), *kernel.format);
  Matrix dx;
  kernel.run(logits, dy, dx);
  outcome.comparison = metrics::judge_softmax_backward(kernel, logits, dy, dx);
}

void run_builtin_case(const GateCase& gate_case, CaseOutcome& outcome) {
  if (const auto* backward = kernels::find_softmax_backward_kernel(gate_case.kernel)) {
    run_softmax_backward_case(*backward, gate_case, outcome);
    return;
  }
  if (const auto* backward = kernels::find_attention_backward_kernel(gate_case.kernel)) {
    run_backward_case(*backward, gate_case, outcome);
    return;
  }
  if (const auto* escape = kernels::find_attention_escape_kernel(gate_case.kernel)) {
    run_escape_case(*escape, gate_case, outcome);
    return;
  }
  if (const auto* kernel = kernels::find_softmax_kernel(gate_case.kernel)) {
    outcome.format = std::string(kernel->output->name);
    const auto kind = inputs::find_row_kind(gate_case.input).value();
    const auto row = inputs::make_row(kind, gate_case.n, *kernel->input, gate_case.seed);
    const auto evaluation = metrics::evaluate_softmax(*kernel, one_row(row), 1.0);
    outcome.comparison = evaluation.comparison;
    outcome.reference_statistics = evaluation.reference_statistics;
    return;
  }
  const auto* attention = kernels::find_attention_kernel(gate_case.kernel);
  outcome.format = std::string(attention->output->name);
  const auto [q, k, v] = attention_inputs(gate_case.n, gate_case.seed, *attention->input);
  const auto evaluation = metrics::evaluate_attention(*attention, q, k, v, tensor::HeadScores{});
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

// A scenario's whole problem, through a built-in kernel head by head or a plugin's layer entry in
// a child; judged as a layer, the log-sum-exp too when the kernel gives one, the worst element
// named by its full index.
void run_scenario_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  const AttentionScenario& scenario = *find_attention_scenario(gate_case.scenario);
  const auto* kernel = kernels::find_attention_kernel(gate_case.kernel);
  const FloatFormat& format = gate_case.plugin_format != nullptr ? *gate_case.plugin_format : *kernel->input;
  outcome.format = std::string(format.name);
  const ScenarioInputs inputs = make_scenario(scenario, gate_case.seed, format);
  const tensor::AttentionProblem& problem = inputs.problem;
  std::vector<double> out, lse;
  if (gate_case.plugin_format != nullptr) {
    const bool want_lse = (settings.plugin->features() & SHARPCHECK_ATTENTION_LSE) != 0;
    const kernels::PluginRun run =
        settings.plugin->run_attention_layer(format, problem, inputs.q, inputs.k, inputs.v, want_lse);
    if (run.status != kernels::PluginRun::Status::ok) {
      const auto as_row = [](const std::vector<double>& values) { return one_row(values); };
      const Matrix q = as_row(inputs.q), k = as_row(inputs.k), v = as_row(inputs.v);
      record_plugin_failure(run, settings, gate_case, {{"_q", &q}, {"_k", &k}, {"_v", &v}}, outcome);
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
  const auto judgement =
      metrics::judge_attention_tensors(spec, problem, inputs.q, inputs.k, inputs.v, out, lse);
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  if (!outcome.comparison.passed(settings.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(settings.strictest) + "; " +
                               judgement.describe_worst());
  }
}

}  // namespace

const char* CaseOutcome::status() const {
  if (crashed) return "crash";
  if (!passed()) return "fail";
  return inconclusive() ? "inconclusive" : "pass";
}

CaseOutcome run_case(const GateCase& gate_case, const GateSettings& settings) {
  const auto start = std::chrono::steady_clock::now();
  CaseOutcome outcome;
  outcome.gate_case = gate_case;
  if (!gate_case.scenario.empty()) {
    run_scenario_case(gate_case, settings, outcome);
  } else if (gate_case.plugin_format != nullptr) {
    run_plugin_case(gate_case, settings, outcome);
  } else {
    run_builtin_case(gate_case, outcome);
  }
  if (!outcome.crashed && !outcome.interrupted && !outcome.comparison.passed(settings.strictest) &&
      outcome.failures.empty()) {
    outcome.failures.push_back(outcome.comparison.failure_summary(settings.strictest));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

}  // namespace sharpcheck::gate
