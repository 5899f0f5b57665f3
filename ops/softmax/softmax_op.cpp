// The softmax and log_softmax records, and the row machinery the row escapes share.
#include "ops/softmax/softmax_op.hpp"

#include "core/errors.hpp"
#include "gate/case_inputs.hpp"
#include "gate/case_tools.hpp"
#include "inputs/rows.hpp"
#include "kernels/plugin_abi.h"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::ops {
namespace {

using gate::OptionKind;
using gate::OptionSpec;
using gate::TensorRole;
using gate::TensorSpec;

constexpr OptionSpec row_option_table[] = {
    {.name = "dim",
     .kind = OptionKind::integer,
     .default_text = "-1",
     .meaning = "the softmax axis (negative counts from the end, as torch's dim)",
     .apply =
         [](gate::OpOptions& o, const std::string& v) {
           const long long dim = std::stoll(v);
           if (dim < -64 || dim > 63)
             throw InputError(InputProblem::out_of_range, "dim wants -64 to 63, got " + v);
           o.judge.dim = static_cast<int>(dim);
         }},
    {.name = "theta",
     .kind = OptionKind::real,
     .default_text = "1",
     .meaning = "the temperature: softmax(logits / theta)",
     .apply = [](gate::OpOptions& o, const std::string& v) { o.judge.theta = std::stod(v); }},
};

constexpr TensorSpec softmax_tensors[] = {
    {.name = "logits", .role = TensorRole::input, .shape = "any rank", .meaning = "the logits"},
    {.name = "probs",
     .role = TensorRole::judged,
     .shape = "as logits",
     .meaning = "the kernel's probabilities",
     .format = "format"},
};
constexpr TensorSpec log_softmax_tensors[] = {
    {.name = "logits", .role = TensorRole::input, .shape = "any rank", .meaning = "the logits"},
    {.name = "log_probs",
     .role = TensorRole::judged,
     .shape = "as logits",
     .meaning = "the kernel's log-probabilities",
     .format = "format"},
};

// The sweep's sizes are the rows' lengths; the softmax-scale feature adds scaled rows.
constexpr double swept_softmax_scales[] = {0.25, 4.0};
constexpr inputs::RowKind scaled_row_kinds[] = {inputs::RowKind::random_normal,
                                                inputs::RowKind::spread_controlled};

void plan_plugin_rows(const gate::PlanContext& context, std::vector<gate::GateCase>& cases) {
  const auto& plugin = *context.settings.plugin;
  const std::string prefix = "plugin:" + plugin.name() + ":";
  for (const FloatFormat* format : plugin.softmax_formats()) {
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : context.sizes) {
        cases.push_back(gate::make_case(prefix + std::string(format->name),
                                        std::string(inputs::row_kind_name(kind)), n, context.settings, false,
                                        format));
      }
    }
  }
  if ((plugin.features() & SHARPCHECK_SOFTMAX_SCALE) == 0) return;
  for (const FloatFormat* format : plugin.softmax_formats()) {
    for (const double scale : swept_softmax_scales) {
      for (const inputs::RowKind kind : scaled_row_kinds) {
        for (const std::size_t n : context.sizes) {
          gate::GateCase c =
              gate::make_case(prefix + std::string(format->name), std::string(inputs::row_kind_name(kind)), n,
                              context.settings, false, format);
          c.softmax_scale = scale;
          cases.push_back(c);
        }
      }
    }
  }
}

void run_plugin_row_case(const gate::GateCase& gate_case, const gate::GateSettings& settings,
                         gate::CaseOutcome& outcome) {
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  const auto kind = inputs::find_row_kind(gate_case.input).value();
  const Matrix logits = gate::one_row(inputs::make_row(kind, gate_case.n, format, gate_case.seed));
  const kernels::PluginRun run =
      settings.plugin->run_softmax(format, logits, static_cast<float>(gate_case.softmax_scale));
  if (run.status != kernels::PluginRun::Status::ok) {
    gate::record_plugin_failure(run, settings, gate_case, {{"", &logits}}, outcome);
    return;
  }
  outcome.console = run.console;
  const auto evaluation = metrics::judge_softmax(
      {kernels::Operation::softmax, &format, &metrics::tolerance_for("plugin_softmax")}, logits,
      1.0 / gate_case.softmax_scale, run.out);
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

}  // namespace

std::span<const gate::OptionSpec> row_options() { return row_option_table; }

std::span<const gate::OptionSpec> dim_option() { return std::span(row_option_table).first(1); }

std::vector<gate::KernelRow> row_kernels(kernels::Operation operation) {
  return gate::kernel_rows_of(kernels::softmax_kernels(),
                              [&](const auto& k) { return k.operation == operation; });
}

void plan_row_kernels(const gate::PlanContext& context, kernels::Operation operation,
                      std::vector<gate::GateCase>& cases) {
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (kernel.operation != operation || !context.wanted(kernel.name)) continue;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : context.sizes) {
        cases.push_back(gate::make_case(std::string(kernel.name), std::string(inputs::row_kind_name(kind)), n,
                                        context.settings, kernel.deliberately_broken, nullptr));
      }
    }
  }
}

void run_row_case(const gate::GateCase& gate_case, const gate::GateSettings& settings,
                  gate::CaseOutcome& outcome) {
  if (gate_case.plugin_format != nullptr) {
    run_plugin_row_case(gate_case, settings, outcome);
    return;
  }
  const auto* kernel = kernels::find_softmax_kernel(gate_case.kernel);
  outcome.format = std::string(kernel->output->name);
  const auto kind = inputs::find_row_kind(gate_case.input).value();
  const auto row = inputs::make_row(kind, gate_case.n, *kernel->input, gate_case.seed);
  const auto evaluation = metrics::evaluate_softmax(*kernel, gate::one_row(row), 1.0);
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}

std::vector<gate::ExternalCase> row_external_cases(std::string_view operation,
                                                   const gate::ExternalSweep& sweep,
                                                   std::string_view judged) {
  // The plugin's cases (plan_plugin_rows): every row kind at every size, and the scaled rows at
  // theta = 1 / scale for a kernel that declares "theta".
  const std::string kernel = "python:" + std::string(operation) + ":" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  const auto add = [&](inputs::RowKind kind, std::size_t n, double scale) {
    gate::GateCase shape;  // only for the id, the gate's form
    shape.kernel = kernel;
    shape.input = std::string(inputs::row_kind_name(kind));
    shape.n = n;
    shape.softmax_scale = scale;
    gate::ExternalCase c;
    c.id = shape.id();
    const std::uint64_t seed = gate::case_seed(sweep.seed, c.id);
    c.tensors.push_back(
        {.name = "logits", .shape = {1, n}, .values = inputs::make_row(kind, n, *sweep.format, seed)});
    if (scale != 1) {
      c.options["theta"] = 1.0 / scale;
      c.needs.emplace_back("theta");
    }
    if (!judged.empty()) c.outputs.push_back({.name = std::string(judged), .shape = {1, n}, .values = {}});
    cases.push_back(std::move(c));
  };
  for (const inputs::RowKind kind : inputs::all_row_kinds) {
    for (const std::size_t n : sweep.sizes) add(kind, n, 1);
  }
  for (const double scale : swept_softmax_scales) {
    for (const inputs::RowKind kind : scaled_row_kinds) {
      for (const std::size_t n : sweep.sizes) add(kind, n, scale);
    }
  }
  return cases;
}

gate::CaseOutcome judge_rows(const gate::OpCall& call, kernels::Operation operation, std::string_view judged,
                             std::string_view default_entry, bool log_softmax) {
  gate::JudgeOptions options = call.options.judge;
  options.operation = operation;
  options.log_softmax = log_softmax;
  options.default_entry = std::string(default_entry);
  return gate::judge_softmax_arrays(options, call.at("logits"), call.at(judged));
}

const gate::Operation softmax_operation{
    .name = "softmax",
    .summary = "softmax(logits / theta) along a dim",
    .tensors = softmax_tensors,
    .options = row_option_table,
    .allowance =
        "tolerance entries (metrics/tolerance_table.cpp); default plugin_softmax, any sound "
        "fp32-accumulating kernel; int8/uint8 outputs their grid's entry",
    .plugin_entry = "sharpcheck_softmax",
    .kernels = [] { return row_kernels(kernels::Operation::softmax); },
    .plan_builtin =
        [](const gate::PlanContext& c, std::vector<gate::GateCase>& cases) {
          plan_row_kernels(c, kernels::Operation::softmax, cases);
        },
    .plan_plugin = plan_plugin_rows,
    .run = run_row_case,
    .judge =
        [](const gate::OpCall& call) {
          return judge_rows(call, kernels::Operation::softmax, "probs", "plugin_softmax");
        },
    .external_cases = [](const gate::ExternalSweep& sweep) { return row_external_cases("softmax", sweep); },
};

const gate::Operation log_softmax_operation{
    .name = "log_softmax",
    .summary = "log_softmax(logits / theta) along a dim",
    .tensors = log_softmax_tensors,
    .options = row_option_table,
    .allowance =
        "a tolerance entry at magnitude 1 plus 2 u_out |log p| (metrics/evaluate.hpp); default "
        "plugin_softmax",
    .plugin_entry = {},
    .kernels = [] { return std::vector<gate::KernelRow>{}; },
    .plan_builtin = nullptr,
    .plan_plugin = nullptr,
    .run = nullptr,
    .judge =
        [](const gate::OpCall& call) {
          return judge_rows(call, kernels::Operation::softmax, "log_probs", "plugin_softmax", true);
        },
    .external_cases =
        [](const gate::ExternalSweep& sweep) { return row_external_cases("log_softmax", sweep); },
};

}  // namespace sharpcheck::ops
