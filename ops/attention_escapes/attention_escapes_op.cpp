// The linear, selective and Differential attention records: one template over the operation.
#include "ops/attention_escapes/attention_escapes_op.hpp"

#include "core/errors.hpp"
#include "gate/array_checks.hpp"
#include "gate/case_tools.hpp"
#include "inputs/attention_escape_cases.hpp"
#include "kernels/attention_escape_kernels.hpp"
#include "metrics/judge_attention_escapes.hpp"

namespace sharpcheck::ops {
namespace {

using gate::CaseOutcome;
using gate::GateCase;
using gate::TensorRole;
using tensor::EscapeOperation;

constexpr gate::TensorSpec linear_tensors[] = {
    {.name = "q", .role = TensorRole::input, .shape = "[m, d]", .meaning = "the queries"},
    {.name = "k", .role = TensorRole::input, .shape = "[n, d]", .meaning = "the keys"},
    {.name = "v", .role = TensorRole::input, .shape = "[n, dv]", .meaning = "the values"},
    {.name = "out",
     .role = TensorRole::judged,
     .shape = "[m, dv]",
     .meaning = "the kernel's output",
     .format = "format"},
};
constexpr gate::TensorSpec selective_tensors[] = {
    {.name = "logits", .role = TensorRole::input, .shape = "[n, n]", .meaning = "the scores (-inf masked)"},
    {.name = "selection",
     .role = TensorRole::input,
     .shape = "[n, n]",
     .meaning = "the selection head's scores"},
    {.name = "weights",
     .role = TensorRole::judged,
     .shape = "[n, n]",
     .meaning = "the kernel's weights",
     .format = "format"},
};
constexpr gate::TensorSpec differential_tensors[] = {
    {.name = "logits", .role = TensorRole::input, .shape = "[m, n]", .meaning = "the first softmax's scores"},
    {.name = "logits2",
     .role = TensorRole::input,
     .shape = "[m, n]",
     .meaning = "the second softmax's scores"},
    {.name = "weights",
     .role = TensorRole::judged,
     .shape = "[m, n]",
     .meaning = "the kernel's weights",
     .format = "format"},
};

constexpr gate::OptionSpec linear_options[] = {
    {.name = "causal",
     .kind = gate::OptionKind::flag,
     .default_text = "false",
     .meaning = "causal linear attention (each query sums over the keys up to its own position)",
     .apply = [](gate::OpOptions& o, const std::string& v) { o.judge.scores.causal = v == "true"; }},
};
constexpr gate::OptionSpec differential_options[] = {
    {.name = "lambda",
     .kind = gate::OptionKind::real,
     .default_text = "0",
     .meaning = "the weight of the second softmax: softmax(logits) - lambda softmax(logits2)",
     .apply = [](gate::OpOptions& o, const std::string& v) { o.lambda = std::stod(v); }},
};

template <EscapeOperation operation>
std::vector<gate::KernelRow> kernel_rows() {
  return gate::kernel_rows_of(kernels::attention_escape_kernels(),
                              [](const auto& k) { return k.operation == operation; });
}

template <EscapeOperation operation>
void plan_builtin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  for (const auto& kernel : kernels::attention_escape_kernels()) {
    if (kernel.operation != operation || !context.wanted(kernel.name)) continue;
    for (const inputs::EscapeKind kind : inputs::all_escape_kinds) {
      if (inputs::escape_kind_operation(kind) != operation) continue;
      cases.push_back(gate::make_case(std::string(kernel.name), std::string(inputs::escape_kind_name(kind)),
                                      inputs::escape_kind_keys(kind), context.settings,
                                      kernel.deliberately_broken, nullptr));
    }
  }
}

// A kernel on one of its problems, judged against the correctly rounded reference.
void run_case(const GateCase& gate_case, const gate::GateSettings&, CaseOutcome& outcome) {
  const auto& kernel = *kernels::find_attention_escape_kernel(gate_case.kernel);
  outcome.format = std::string(kernel.format->name);
  for (const inputs::EscapeKind kind : inputs::all_escape_kinds) {
    if (inputs::escape_kind_name(kind) != gate_case.input) continue;
    const auto problem = inputs::make_escape_problem(kind, *kernel.format, gate_case.seed);
    outcome.comparison =
        metrics::judge_attention_escape(problem, *kernel.format, kernel.run(problem)).comparison;
    outcome.worst_array = problem.operation == EscapeOperation::linear ? "out" : "weights";
    outcome.worst_index = {outcome.comparison.worst.row, outcome.comparison.worst.index};
    return;
  }
  throw InputError(InputProblem::out_of_range, "gate: no escape input named '" + gate_case.input + "'");
}

// A 2-D tensor as a matrix; InputError for another rank or no element.
Matrix matrix_of(const gate::Array& array) {
  if (array.shape().size() != 2)
    gate::refuse(InputProblem::shape_mismatch,
                 array.name() + " must be a 2-D matrix, got shape " + gate::shape_text(array.shape()));
  gate::require_elements(array);
  return array.read_lanes(gate::lanes_along_dim(array, -1), 0, array.shape()[0]);
}

template <EscapeOperation operation>
CaseOutcome judge_call(const gate::OpCall& call) {
  const gate::OpOptions& options = call.options;
  const gate::StoredFormat output = gate::stored_format(options.judge.format);
  if (output.zero_point)
    gate::refuse(InputProblem::out_of_range,
                 "the escapes' results cannot be a quantized grid (" + output.name + ")");
  if (!options.judge.tolerance_entry.empty())
    gate::refuse(InputProblem::out_of_range,
                 "tolerance: the matrix escapes' allowance is derived from the fp32 arithmetic every such "
                 "kernel does; there is no entry to choose");
  tensor::EscapeProblem problem;
  problem.operation = operation;
  const char* judged = operation == EscapeOperation::linear ? "out" : "weights";
  if (operation == EscapeOperation::linear) {
    problem.queries = matrix_of(call.at("q"));
    problem.keys = matrix_of(call.at("k"));
    problem.values = matrix_of(call.at("v"));
    problem.causal = options.judge.scores.causal;
  } else {
    problem.logits = matrix_of(call.at("logits"));
    if (operation == EscapeOperation::selective) problem.selection = matrix_of(call.at("selection"));
    if (operation == EscapeOperation::differential) problem.logits2 = matrix_of(call.at("logits2"));
    problem.lambda = options.lambda;
  }
  const gate::Array& result = call.at(judged);
  const Matrix actual = matrix_of(result);
  for (std::size_t i = 0; i < actual.values.size(); ++i)
    gate::require_value_of(actual.values[i], output, result.name(), i, false);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = gate::reported_kernel_name(options, result);
  outcome.gate_case.n = actual.cols;
  outcome.comparison = metrics::judge_attention_escape(problem, *output.format, actual).comparison;
  outcome.worst_array = result.name();
  outcome.worst_index = {outcome.comparison.worst.row, outcome.comparison.worst.index};
  if (!outcome.comparison.passed(options.judge.strictest))
    outcome.failures.push_back(outcome.comparison.failure_summary(options.judge.strictest));
  return outcome;
}

gate::ExternalTensor tensor_of(const char* name, const Matrix& m) {
  return {.name = name, .shape = {m.rows, m.cols}, .values = m.values};
}

// The sweep for a kernel outside the gate: each of the operation's problems (the gate's), as its
// tensors and options; the kernel returns `out` [m, dv] (linear) or `weights`.
template <EscapeOperation operation>
std::vector<gate::ExternalCase> external_cases(const gate::ExternalSweep& sweep) {
  constexpr std::string_view name = operation == EscapeOperation::linear      ? "linear_attention"
                                    : operation == EscapeOperation::selective ? "selective_attention"
                                                                              : "differential_attention";
  std::vector<gate::ExternalCase> cases;
  for (const inputs::EscapeKind kind : inputs::all_escape_kinds) {
    if (inputs::escape_kind_operation(kind) != operation) continue;
    gate::GateCase shape;  // only for the id, the gate's form
    shape.kernel = "python:" + std::string(name) + ":" + std::string(sweep.format->name);
    shape.input = std::string(inputs::escape_kind_name(kind));
    shape.n = inputs::escape_kind_keys(kind);
    gate::ExternalCase c;
    c.id = shape.id();
    const tensor::EscapeProblem p =
        inputs::make_escape_problem(kind, *sweep.format, gate::case_seed(sweep.seed, c.id));
    if (operation == EscapeOperation::linear) {
      c.tensors = {tensor_of("q", p.queries), tensor_of("k", p.keys), tensor_of("v", p.values)};
      if (p.causal) {
        c.options["causal"] = true;
        c.needs.emplace_back("causal");
      }
      c.outputs.push_back({.name = "out", .shape = {p.queries.rows, p.values.cols}, .values = {}});
    } else {
      c.tensors = {tensor_of("logits", p.logits)};
      if (operation == EscapeOperation::selective) c.tensors.push_back(tensor_of("selection", p.selection));
      if (operation == EscapeOperation::differential) {
        c.tensors.push_back(tensor_of("logits2", p.logits2));
        c.options["lambda"] = p.lambda;
      }
      c.outputs.push_back({.name = "weights", .shape = {p.logits.rows, p.logits.cols}, .values = {}});
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

constexpr std::string_view escape_allowance =
    "the fp32 arithmetic every such kernel does plus the output's rounding, derived in "
    "metrics/judge_attention_escapes.cpp";

}  // namespace

const gate::Operation linear_attention_operation{
    .name = "linear_attention",
    .summary = "weights phi(q).phi(k) normalised per row (phi = elu + 1), times V; causal or not",
    .tensors = linear_tensors,
    .options = linear_options,
    .allowance = escape_allowance,
    .plugin_entry = {},
    .kernels = kernel_rows<EscapeOperation::linear>,
    .plan_builtin = plan_builtin<EscapeOperation::linear>,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_call<EscapeOperation::linear>,
    .external_cases = external_cases<EscapeOperation::linear>,
};

const gate::Operation selective_attention_operation{
    .name = "selective_attention",
    .summary = "softmax of the logits less the accumulated ReLU of the selection scores (causal)",
    .tensors = selective_tensors,
    .options = {},
    .allowance = escape_allowance,
    .plugin_entry = {},
    .kernels = kernel_rows<EscapeOperation::selective>,
    .plan_builtin = plan_builtin<EscapeOperation::selective>,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_call<EscapeOperation::selective>,
    .external_cases = external_cases<EscapeOperation::selective>,
};

const gate::Operation differential_attention_operation{
    .name = "differential_attention",
    .summary = "softmax(logits) - lambda softmax(logits2)",
    .tensors = differential_tensors,
    .options = differential_options,
    .allowance = escape_allowance,
    .plugin_entry = {},
    .kernels = kernel_rows<EscapeOperation::differential>,
    .plan_builtin = plan_builtin<EscapeOperation::differential>,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_call<EscapeOperation::differential>,
    .external_cases = external_cases<EscapeOperation::differential>,
};

}  // namespace sharpcheck::ops
