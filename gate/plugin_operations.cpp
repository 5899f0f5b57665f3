#include "gate/plugin_operations.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "core/errors.hpp"
#include "gate/case_tools.hpp"
#include "kernels/plugin_abi.h"

namespace sharpcheck::gate {
namespace {

std::string kernel_name(const kernels::Plugin& plugin, std::string_view operation,
                        const FloatFormat& format) {
  return "plugin:" + plugin.name() + ":" + std::string(operation) + "_" + std::string(format.name);
}

// An external case's id without its kernel: the input and the n of "<kernel>/<input>/n=<n>".
struct IdTail {
  std::string input;
  std::size_t n = 0;
};

IdTail tail_of(const std::string& id) {
  const std::size_t first = id.find('/'), last = id.rfind("/n=");
  if (first == std::string::npos || last == std::string::npos || last <= first)
    throw std::logic_error("an external case id without the gate's form: " + id);
  return {id.substr(first + 1, last - first - 1), std::stoul(id.substr(last + 3))};
}

}  // namespace

std::shared_ptr<const std::vector<ExternalCase>> external_cases_of(const Operation& operation,
                                                                   const FloatFormat& format,
                                                                   const GateSettings& settings) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const std::vector<ExternalCase>>> made;
  const std::string key =
      std::string(operation.name) + "/" + std::string(format.name) + "/" + std::to_string(settings.seed);
  const std::lock_guard lock(mutex);
  auto& cases = made[key];
  if (!cases) {
    cases = std::make_shared<const std::vector<ExternalCase>>(operation.external_cases(ExternalSweep{
        .format = &format, .sizes = sweep_sizes(settings), .seed = settings.seed, .only_id = {}}));
  }
  return cases;
}

namespace {

std::uint32_t storage_of(const ExternalTensor& tensor, const FloatFormat& format) {
  if (tensor.stored_as == "fp64") return SHARPCHECK_STORE_FP64;
  if (tensor.stored_as == "fp32") return SHARPCHECK_STORE_FP32;
  if (tensor.stored_as == "int64") return SHARPCHECK_STORE_INT64;
  if (format == bf16) return SHARPCHECK_STORE_BF16;
  if (format == fp16) return SHARPCHECK_STORE_FP16;
  return SHARPCHECK_STORE_FP32;
}

std::string option_text(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string text;
    for (const auto& item : value) text += (text.empty() ? "" : ",") + option_text(item);
    return text;
  }
  return value.dump();
}

// The case as `key=value` pairs for the operation's schema: its tensors (by name), format, options.
std::vector<std::pair<std::string, std::string>> schema_pairs(const ExternalCase& c,
                                                              const FloatFormat& format) {
  std::vector<std::pair<std::string, std::string>> pairs{{"format", std::string(format.name)}};
  for (const auto* tensors : {&c.tensors, &c.outputs}) {
    for (const ExternalTensor& t : *tensors) pairs.emplace_back(t.name, t.name);
  }
  for (const auto* options : {&c.options, &c.judge_options}) {
    for (const auto& [key, value] : options->items()) pairs.emplace_back(key, option_text(value));
  }
  return pairs;
}

const Operation& declared_operation(const PlanContext& context, const std::string& name) {
  const std::string plugin = "plugin " + context.settings.plugin->name();
  for (const Operation* operation : context.settings.operations) {
    if (operation->name != name) continue;
    if (operation->external_cases == nullptr) {
      std::string message = plugin;
      message += " declares operation '" + name + "', whose cases cannot be run through sharpcheck_op yet";
      throw InputError(InputProblem::out_of_range, message);
    }
    return *operation;
  }
  throw InputError(InputProblem::out_of_range, plugin + " declares operation '" + name +
                                                   "', which sharpcheck does not have (`sharpcheck ops`)");
}

}  // namespace

const ExternalCase& find_external_case(const std::vector<ExternalCase>& cases, const GateCase& gate_case) {
  for (const ExternalCase& c : cases) {
    const IdTail tail = tail_of(c.id);
    if (tail.input == gate_case.input && tail.n == gate_case.n) return c;
  }
  throw std::logic_error("no external case for " + gate_case.id());
}

GateCase external_gate_case(const ExternalCase& c, std::string kernel, const GateSettings& settings,
                            bool broken, const FloatFormat* plugin_format) {
  const IdTail tail = tail_of(c.id);
  return make_case(std::move(kernel), tail.input, tail.n, settings, broken, plugin_format);
}

void judge_external_outputs(const Operation& operation, const ExternalCase& c, const FloatFormat& format,
                            const std::vector<double>& values, const std::string& kernel,
                            CaseOutcome& outcome) {
  std::vector<std::unique_ptr<MemoryArray>> arrays;
  OpCall call;
  for (const ExternalTensor& t : c.tensors)
    call.tensors[t.name] =
        arrays.emplace_back(std::make_unique<MemoryArray>(t.name, t.shape, t.values)).get();
  auto next = values.begin();
  std::vector<std::string> left_out;
  for (const ExternalTensor& t : c.outputs) {
    const std::size_t count = t.elements();
    if (static_cast<std::size_t>(values.end() - next) < count)
      throw std::logic_error("fewer output values than " + c.id + " says");
    std::vector<double> output(next, next + static_cast<std::ptrdiff_t>(count));
    next += static_cast<std::ptrdiff_t>(count);
    if (t.optional && count > 0 &&
        std::all_of(output.begin(), output.end(), [](double x) { return std::isnan(x); })) {
      left_out.push_back(t.name);  // not returned (or a plugin's buffer left as the gate filled it)
      continue;
    }
    call.tensors[t.name] =
        arrays.emplace_back(std::make_unique<MemoryArray>(t.name, t.shape, std::move(output))).get();
  }
  std::vector<std::pair<std::string, std::string>> pairs = schema_pairs(c, format);
  std::erase_if(pairs, [&](const auto& pair) {
    return std::find(left_out.begin(), left_out.end(), pair.first) != left_out.end();
  });
  for (const std::string& name : left_out)
    outcome.notes.push_back(name + " not returned (NaN throughout): not judged");
  call.options = parse_op_arguments(operation, pairs).options;
  call.options.judge.name = kernel;
  call.options.judge.threads = 1;  // the gate runs cases side by side
  adopt_judgement(operation.judge(call), outcome);
}

void plan_plugin_operations(const PlanContext& context, std::vector<GateCase>& cases) {
  const auto& plugin = context.settings.plugin;
  if (!plugin) return;
  for (const std::string& name : plugin->operations()) {
    const Operation& operation = declared_operation(context, name);
    for (const FloatFormat* format : plugin->operation_formats()) {
      const std::size_t before = cases.size();
      for (const ExternalCase& c : *external_cases_of(operation, *format, context.settings)) {
        if (c.outputs.empty()) continue;
        GateCase gate_case =
            external_gate_case(c, kernel_name(*plugin, name, *format), context.settings, false, format);
        gate_case.operation = name;
        gate_case.plugin_operation = true;
        cases.push_back(std::move(gate_case));
      }
      if (cases.size() == before)
        throw InputError(InputProblem::out_of_range,
                         "plugin " + plugin->name() + " declares operation '" + name + "', none of whose " +
                             std::string(format->name) + " cases can be run through sharpcheck_op yet");
    }
  }
}

void judge_external_invariance(const Operation& operation, const ExternalCase& c, const FloatFormat& format,
                               const std::vector<double>& first,
                               const std::vector<const std::vector<double>*>& reruns,
                               const std::string& kernel, CaseOutcome& outcome) {
  if (reruns.size() != c.reruns.size()) throw std::logic_error("reruns of " + c.id + " miscounted");
  gate::judge_invariance(
      c.invariance, format, first, reruns,
      [&](std::size_t index, const std::vector<double>& output) {
        CaseOutcome judged;
        if (index == 0) {
          judge_external_outputs(operation, c, format, output, kernel, judged);
          return judged;
        }
        ExternalCase rerun;  // the rerun's own tensors and options
        rerun.id = c.id;
        rerun.tensors = c.reruns[index - 1].tensors;
        rerun.options = c.reruns[index - 1].options;
        rerun.judge_options = c.judge_options;
        rerun.outputs = c.reruns[index - 1].outputs;
        judge_external_outputs(operation, rerun, format, output, kernel, judged);
        return judged;
      },
      outcome);
}

namespace {

kernels::PluginRun run_call(const Operation& operation, const FloatFormat& format,
                            const GateSettings& settings, const std::vector<ExternalTensor>& tensors,
                            const nlohmann::json& options, const std::vector<ExternalTensor>& outputs,
                            std::vector<kernels::PluginTensor>& inputs) {
  std::vector<kernels::PluginTensor> results;
  results.reserve(outputs.size());
  inputs.clear();
  for (const ExternalTensor& t : tensors)
    inputs.push_back({t.name, storage_of(t, format), t.shape, t.values});
  for (const ExternalTensor& t : outputs) results.push_back({t.name, storage_of(t, format), t.shape, {}});
  return settings.plugin->run_operation(std::string(operation.name), format, options.dump(), inputs, results);
}

// A call the plugin did not complete: a crash record with its inputs saved, or an interruption.
void record_call_failure(const kernels::PluginRun& run, const GateSettings& settings,
                         const GateCase& gate_case, const std::vector<kernels::PluginTensor>& inputs,
                         CaseOutcome& outcome) {
  std::vector<Matrix> kept;
  kept.reserve(inputs.size());
  std::vector<std::pair<std::string, const Matrix*>> named;
  for (const kernels::PluginTensor& t : inputs) {
    Matrix& m = kept.emplace_back(1, t.values.size());
    m.values = t.values;
    named.emplace_back("_" + t.name, &m);
  }
  record_plugin_failure(run, settings, gate_case, named, outcome);
}

// An invariance case's reruns through the plugin, compared with the first call and judged
// (gate/invariance.hpp); a rerun that crashes, hangs or runs out of memory makes the case a crash
// naming that rerun (its inputs saved), and an interruption stops it as the first call's would.
void judge_plugin_reruns(const Operation& operation, const ExternalCase& c, const FloatFormat& format,
                         const GateSettings& settings, const GateCase& gate_case,
                         const std::vector<double>& first, CaseOutcome& outcome) {
  std::vector<std::vector<double>> values(c.reruns.size());
  std::vector<const std::vector<double>*> reruns;
  std::vector<kernels::PluginTensor> inputs;
  for (std::size_t i = 0; i < c.reruns.size(); ++i) {
    const ExternalCall& call = c.reruns[i];
    const kernels::PluginRun run =
        run_call(operation, format, settings, call.tensors, call.options, call.outputs, inputs);
    if (run.status != kernels::PluginRun::Status::ok) {
      record_call_failure(run, settings, gate_case, inputs, outcome);
      if (!outcome.failures.empty())
        outcome.failures.back() += " (in the " + c.invariance.reruns[i].name + ")";
      return;
    }
    values[i] = run.out.values;
    reruns.push_back(&values[i]);
  }
  judge_external_invariance(operation, c, format, first, reruns, gate_case.kernel, outcome);
}

}  // namespace

void run_plugin_operation_case(const Operation& operation, const GateCase& gate_case,
                               const GateSettings& settings, CaseOutcome& outcome) {
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  const auto all = external_cases_of(operation, format, settings);
  const ExternalCase& c = find_external_case(*all, gate_case);
  std::vector<kernels::PluginTensor> inputs;
  const kernels::PluginRun run =
      run_call(operation, format, settings, c.tensors, c.options, c.outputs, inputs);
  if (run.status != kernels::PluginRun::Status::ok) {
    record_call_failure(run, settings, gate_case, inputs, outcome);
    return;
  }
  outcome.console = run.console;
  if (c.reruns.empty()) {
    judge_external_outputs(operation, c, format, run.out.values, gate_case.kernel, outcome);
  } else {
    judge_plugin_reruns(operation, c, format, settings, gate_case, run.out.values, outcome);
  }
}

}  // namespace sharpcheck::gate
