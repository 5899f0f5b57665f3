// The softmax and log-softmax backward records.
#include "ops/softmax_backward/softmax_backward_op.hpp"

#include <cmath>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "gate/array_checks.hpp"
#include "gate/case_tools.hpp"
#include "inputs/rows.hpp"
#include "io/npy.hpp"
#include "kernels/softmax_backward.hpp"
#include "metrics/judge_backward.hpp"
#include "ops/softmax/softmax_op.hpp"

namespace sharpcheck::ops {
namespace {

using gate::CaseOutcome;
using gate::GateCase;
using gate::TensorRole;

constexpr gate::TensorSpec backward_tensors[] = {
    {.name = "logits", .role = TensorRole::input, .shape = "any rank", .meaning = "the forward's logits"},
    {.name = "dy",
     .role = TensorRole::input,
     .shape = "as logits",
     .meaning = "the gradient reaching the output"},
    {.name = "dx",
     .role = TensorRole::judged,
     .shape = "as logits",
     .meaning = "the kernel's gradient of the logits",
     .format = "format"},
};

std::vector<gate::KernelRow> kernel_rows(bool log_softmax) {
  return gate::kernel_rows_of(kernels::softmax_backward_kernels(),
                              [&](const auto& k) { return k.log_softmax == log_softmax; });
}

// Every row kind at three sizes (the reference costs more than the forward's, so not the whole
// sweep of sizes), each case with a fully masked second row.
template <bool log_softmax>
void plan_builtin(const gate::PlanContext& context, std::vector<GateCase>& cases) {
  for (const auto& kernel : kernels::softmax_backward_kernels()) {
    if (kernel.log_softmax != log_softmax || !context.wanted(kernel.name)) continue;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : {std::size_t{16}, std::size_t{256}, std::size_t{4096}}) {
        cases.push_back(gate::make_case(std::string(kernel.name), std::string(inputs::row_kind_name(kind)), n,
                                        context.settings, kernel.deliberately_broken, nullptr));
      }
    }
  }
}

// Row 0 the generated logits, row 1 fully masked; dy normal.
void run_case(const GateCase& gate_case, const gate::GateSettings&, CaseOutcome& outcome) {
  const auto& kernel = *kernels::find_softmax_backward_kernel(gate_case.kernel);
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

// The sweep for a kernel outside the gate: every row kind at every size as logits [1, n] of the
// format, with a normal dy [1, n] of the format; the kernel returns dx [1, n]. dy is 0 at a masked
// logit: the reference does not read it there (a masked entry is a constant), while autograd's
// log-softmax backward sums it into every entry (dx_j = dy_j - y_j sum_i dy_i over all i); with
// nothing flowing into a -inf output the two conventions agree.
template <bool log_softmax>
std::vector<gate::ExternalCase> external_cases(const gate::ExternalSweep& sweep) {
  const std::string kernel = std::string("python:") + (log_softmax ? "log_" : "") +
                             "softmax_backward:" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  for (const inputs::RowKind kind : inputs::all_row_kinds) {
    for (const std::size_t n : sweep.sizes) {
      gate::GateCase shape;  // only for the id, the gate's form
      shape.kernel = kernel;
      shape.input = std::string(inputs::row_kind_name(kind));
      shape.n = n;
      gate::ExternalCase c;
      c.id = shape.id();
      const std::uint64_t seed = gate::case_seed(sweep.seed, c.id);
      std::vector<double> logits = inputs::make_row(kind, n, *sweep.format, seed), dy(n);
      DeterministicRandom random(seed ^ 0x5BD1E995ULL);
      for (std::size_t j = 0; j < n; ++j) {
        const double g = round_to_format(random.normal(0, 1), *sweep.format);
        dy[j] = logits[j] == -INFINITY ? 0.0 : g;  // see above
      }
      c.tensors = {{.name = "logits", .shape = {1, n}, .values = std::move(logits)},
                   {.name = "dy", .shape = {1, n}, .values = std::move(dy)}};
      c.outputs.push_back({.name = "dx", .shape = {1, n}, .values = {}});
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// The tolerance entry: a softmax backward kernel's, by name (default: the fp32 kernel of this
// direction, whose arithmetic every sound fp32-accumulating kernel matches).
const kernels::SoftmaxBackwardKernel& entry_of(const gate::OpOptions& options, bool log_softmax) {
  const std::string name = !options.judge.tolerance_entry.empty() ? options.judge.tolerance_entry
                           : log_softmax                          ? "log_softmax_backward"
                                                                  : "softmax_backward";
  const auto* kernel = kernels::find_softmax_backward_kernel(name);
  if (kernel == nullptr || kernel->log_softmax != log_softmax || kernel->deliberately_broken) {
    throw InputError(InputProblem::out_of_range, "tolerance: no sound " +
                                                     std::string(log_softmax ? "log_" : "") +
                                                     "softmax backward entry named '" + name +
                                                     "' (the kernels' names `sharpcheck ops` lists)");
  }
  return *kernel;
}

template <bool log_softmax>
CaseOutcome judge_call(const gate::OpCall& call) {
  const gate::OpOptions& options = call.options;
  const gate::Array &logits = call.at("logits"), &dy = call.at("dy"), &dx = call.at("dx");
  const gate::StoredFormat output = gate::stored_format(options.judge.format);
  if (output.zero_point)
    gate::refuse(InputProblem::out_of_range,
                 "a gradient's format cannot be a quantized grid (" + output.name + ")");
  gate::require_elements(logits);
  for (const gate::Array* other : {&dy, &dx}) {
    if (other->shape() != logits.shape())
      gate::refuse(InputProblem::shape_mismatch, other->name() + " does not match " + logits.name() + ": " +
                                                     gate::shape_text(other->shape()) + " against " +
                                                     gate::shape_text(logits.shape()));
  }
  const auto& entry = entry_of(options, log_softmax);
  const io::NpyLanes lanes = gate::lanes_along_dim(logits, options.judge.dim);
  const Matrix x = logits.read_lanes(lanes, 0, lanes.count), g = dy.read_lanes(lanes, 0, lanes.count);
  const Matrix got = dx.read_lanes(lanes, 0, lanes.count);
  for (std::size_t i = 0; i < got.values.size(); ++i)
    gate::require_value_of(got.values[i], output, dx.name(), lanes.c_index(i / got.cols, i % got.cols),
                           false);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = gate::reported_kernel_name(options, dx);
  outcome.gate_case.n = lanes.extent;
  outcome.comparison =
      metrics::judge_softmax_backward(log_softmax, entry.tolerance, *output.format, x, g, got);
  const auto& worst = outcome.comparison.worst;
  outcome.worst_array = dx.name();
  outcome.worst_index = gate::unravel(lanes.c_index(worst.row, worst.index), dx.shape());
  if (!outcome.comparison.passed(options.judge.strictest))
    outcome.failures.push_back(outcome.comparison.failure_summary(options.judge.strictest));
  return outcome;
}

}  // namespace

const gate::Operation softmax_backward_operation{
    .name = "softmax_backward",
    .summary = "dx = y (dy - sum y dy) / theta with y = softmax(logits), along a dim",
    .tensors = backward_tensors,
    .options = dim_option(),
    .allowance =
        "a softmax backward kernel's entry relative to y_j (|dy_j| + sum y |dy|) "
        "(metrics/judge_backward.hpp); default softmax_backward's (fp32)",
    .plugin_entry = {},
    .kernels = [] { return kernel_rows(false); },
    .plan_builtin = plan_builtin<false>,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_call<false>,
    .external_cases = external_cases<false>,
};

const gate::Operation log_softmax_backward_operation{
    .name = "log_softmax_backward",
    .summary = "dx = (dy - y sum dy) / theta with y = softmax(logits), along a dim",
    .tensors = backward_tensors,
    .options = dim_option(),
    .allowance =
        "a log-softmax backward kernel's entry relative to |dy_j| + y_j sum |dy| "
        "(metrics/judge_backward.hpp); default log_softmax_backward's (fp32)",
    .plugin_entry = {},
    .kernels = [] { return kernel_rows(true); },
    .plan_builtin = plan_builtin<true>,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_call<true>,
    .external_cases = external_cases<true>,
};

}  // namespace sharpcheck::ops
