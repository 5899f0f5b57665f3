// The gate's cases for a Python kernel (python/sweep_cases.hpp).
#include "python/sweep_cases.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "gate/array_checks.hpp"
#include "gate/operation.hpp"
#include "gate/plugin_operations.hpp"
#include "gate/report.hpp"
#include "ops/registry.hpp"
#include "python/host_array.hpp"

namespace sharpcheck::python {
namespace py = pybind11;
namespace {

std::vector<gate::ExternalCase> cases_of(const gate::Operation& operation, const std::string& name,
                                         const std::string& format, const std::vector<std::size_t>& sizes,
                                         std::uint64_t seed, const std::string& only_id = {}) {
  if (operation.external_cases == nullptr)
    throw InputError(InputProblem::out_of_range,
                     "sharpcheck.cases: " + name + " has no sweep for Python kernels yet");
  const gate::StoredFormat stored = gate::stored_format(format);
  if (stored.zero_point || stored.name != stored.format->name)
    throw InputError(InputProblem::out_of_range,
                     "sharpcheck.cases: format must be a float format, got " + format);
  for (const std::size_t n : sizes) {
    if (n == 0) throw InputError(InputProblem::out_of_range, "sharpcheck.cases: sizes: a size of 0");
  }
  std::vector<std::size_t> swept = sizes;
  if (swept.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) swept.push_back(n);
  }
  return operation.external_cases(
      {.format = stored.format, .sizes = swept, .seed = seed, .only_id = only_id});
}

py::dict entry_of(const std::string& id, const std::vector<gate::ExternalTensor>& inputs,
                  const nlohmann::json& options, const std::vector<gate::ExternalTensor>& outputs,
                  const gate::ExternalCase& c) {
  py::dict tensors;
  py::dict stored_as;
  for (const gate::ExternalTensor& tensor : inputs) {
    tensors[py::str(tensor.name)] = to_numpy(tensor.values, tensor.shape);
    if (!tensor.stored_as.empty()) stored_as[py::str(tensor.name)] = std::string(tensor.stored_as);
  }
  py::dict entry;
  entry["id"] = id;
  entry["tensors"] = tensors;
  entry["stored_as"] = stored_as;
  entry["options"] = options.dump();
  entry["judge_options"] = c.judge_options.dump();
  entry["needs"] = c.needs;
  std::vector<std::string> output_names;
  output_names.reserve(outputs.size());
  for (const gate::ExternalTensor& t : outputs) output_names.push_back(t.name);
  entry["outputs"] = output_names;  // what the case judges (empty: the operation's own entry)
  return entry;
}

// One call's outputs in the order `wanted` lists them, one after another, an optional output the
// kernel did not return as NaN throughout (which the judge reads as not returned); `returned` says
// which it returned. ValueError (InputError) naming the call and tensor for a missing output or a
// wrong shape.
std::vector<double> outputs_of(const py::handle& given, const std::vector<gate::ExternalTensor>& wanted,
                               const gate::StoredFormat& stored, const std::string& call,
                               std::vector<std::string>& returned) {
  if (!py::isinstance<py::dict>(given))
    throw InputError(InputProblem::out_of_range, call + ": expected a dict of output arrays");
  const py::dict outputs = py::reinterpret_borrow<py::dict>(given);
  std::vector<double> values;
  for (const gate::ExternalTensor& t : wanted) {
    if (!outputs.contains(t.name) && t.optional) {
      values.insert(values.end(), t.elements(), std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    if (!outputs.contains(t.name))
      throw InputError(InputProblem::shape_mismatch, call + ": the kernel returned no " + t.name);
    returned.push_back(t.name);
    try {
      const HostArray array(outputs[py::str(t.name)], t.name,
                            t.stored_as.empty() ? stored : gate::stored_format(std::string(t.stored_as)));
      if (array.shape() != t.shape)
        throw InputError(InputProblem::shape_mismatch, t.name + " came back as " +
                                                           gate::shape_text(array.shape()) + ", expected " +
                                                           gate::shape_text(t.shape));
      const std::vector<double> all = array.values();
      values.insert(values.end(), all.begin(), all.end());
    } catch (const InputError& error) {  // which call's tensor
      throw InputError(error.problem(), call + ": " + error.what());
    }
  }
  return values;
}

std::string names_text(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return "(" + text + ")";
}

}  // namespace

py::list external_cases(const std::string& name, const std::string& format,
                        const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  const gate::Operation& operation = gate::find_operation(ops::all_operations(), name);
  py::list list;
  for (const gate::ExternalCase& c : cases_of(operation, name, format, sizes, seed)) {
    py::dict entry = entry_of(c.id, c.tensors, c.options, c.outputs, c);
    py::list reruns;
    for (std::size_t i = 0; i < c.reruns.size(); ++i) {
      py::dict rerun = entry_of(c.id, c.reruns[i].tensors, c.reruns[i].options, c.reruns[i].outputs, c);
      rerun["name"] = c.invariance.reruns[i].name;
      reruns.append(rerun);
    }
    entry["reruns"] = reruns;
    list.append(entry);
  }
  return list;
}

std::string judge_invariance_case(const std::string& name, const std::string& format,
                                  const std::string& output_format, const std::vector<std::size_t>& sizes,
                                  std::uint64_t seed, const std::string& id, const py::list& calls) {
  const gate::Operation& operation = gate::find_operation(ops::all_operations(), name);
  std::vector<gate::ExternalCase> cases = cases_of(operation, name, format, sizes, seed, id);
  gate::ExternalCase* found = nullptr;
  for (gate::ExternalCase& c : cases) {
    if (c.id == id) found = &c;
  }
  if (found == nullptr || found->reruns.empty())
    throw InputError(InputProblem::out_of_range, "sharpcheck.sweep: " + id + " is no batch-invariance case");
  gate::ExternalCase& c = *found;
  if (calls.size() != c.reruns.size() + 1)
    throw InputError(InputProblem::shape_mismatch, id + ": " + std::to_string(calls.size()) +
                                                       " calls' outputs for " +
                                                       std::to_string(c.reruns.size() + 1) + " calls");
  const gate::StoredFormat stored = gate::stored_format(output_format);
  if (output_format != format) c.judge_options["input_format"] = format;  // inputs stay the case's
  std::vector<std::string> returned_first;
  const std::vector<double> first =
      outputs_of(calls[0], c.outputs, stored, id + ", the first call", returned_first);
  // What the kernel returned is judged, even NaN throughout (only a plugin's untouched buffer can
  // stand for "not returned"): those outputs are optional no more, in every call.
  const auto make_required = [&](std::vector<gate::ExternalTensor>& outputs) {
    for (gate::ExternalTensor& t : outputs) {
      if (std::find(returned_first.begin(), returned_first.end(), t.name) != returned_first.end())
        t.optional = false;
    }
  };
  make_required(c.outputs);
  for (gate::ExternalCall& rerun : c.reruns) make_required(rerun.outputs);
  std::vector<std::vector<double>> values;
  values.reserve(c.reruns.size());
  for (std::size_t i = 0; i < c.reruns.size(); ++i) {
    const std::string call = id + ", the " + c.invariance.reruns[i].name;
    std::vector<std::string> returned;
    values.push_back(outputs_of(calls[i + 1], c.reruns[i].outputs, stored, call, returned));
    if (returned != returned_first)  // an optional output in some calls only cannot be compared
      throw InputError(InputProblem::shape_mismatch, call + ": the kernel returned " + names_text(returned) +
                                                         " where the first call returned " +
                                                         names_text(returned_first));
  }
  std::vector<const std::vector<double>*> reruns;
  reruns.reserve(values.size());
  for (const auto& v : values) reruns.push_back(&v);
  gate::CaseOutcome outcome;
  gate::judge_external_invariance(operation, c, *stored.format, first, reruns, "python", outcome);
  return gate::to_json(outcome).dump();
}

}  // namespace sharpcheck::python
