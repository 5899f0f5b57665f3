// sharpcheck's Python extension (_sharpcheck): the correctly rounded references and the judge of
// gate/judge_arrays.hpp, called on arrays handed over in memory. A thin floor: options from
// keyword dictionaries, arrays through python/host_array.hpp, the GIL released while the
// reference runs on every core; messages and reports are shaped in python/sharpcheck/.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "core/exact_arithmetic.hpp"
#include "core/parallel.hpp"
#include "gate/array_checks.hpp"
#include "gate/judge_arrays.hpp"
#include "gate/judge_backward_arrays.hpp"
#include "gate/operation.hpp"
#include "gate/report.hpp"
#include "gate/verdict.hpp"
#include "io/atomic_file.hpp"
#include "ops/registry.hpp"
#include "python/host_array.hpp"
#include "python/options.hpp"
#include "python/released.hpp"
#include "python/sweep_cases.hpp"
#include "reference/attention.hpp"
#include "reference/attention_backward.hpp"
#include "reference/softmax.hpp"
#include "reference/softmax_backward.hpp"

namespace sharpcheck::python {
namespace py = pybind11;
namespace {

// A result written straight into the NumPy array returned, in float32 where that holds every
// value of the format exactly (fp32, tf32, bf16, fp16, fp8 and the int8 grids), else float64:
// a large row operation costs its result once (it held a vector of doubles and a copy of it, about
// four times an fp32 input). Stores from several threads go to distinct elements.
class ResultArray {
 public:
  ResultArray(const FloatFormat& format, const std::vector<std::size_t>& shape)
      : narrow_(format.precision() <= 24 && format.min_subnormal_exponent() >= -149),
        array_(narrow_ ? py::array(py::dtype::of<float>(), extents(shape))
                       : py::array(py::dtype::of<double>(), extents(shape))),
        data_(array_.mutable_data()) {}
  void store(std::size_t index, double value) const {
    if (narrow_) {
      static_cast<float*>(data_)[index] = static_cast<float>(value);  // exact (the constructor's test)
    } else {
      static_cast<double*>(data_)[index] = value;
    }
  }
  [[nodiscard]] py::array take() { return std::move(array_); }

 private:
  static std::vector<py::ssize_t> extents(const std::vector<std::size_t>& shape) {
    return {shape.begin(), shape.end()};
  }
  bool narrow_;
  py::array array_;
  void* data_;
};

// Values of `format` as a numpy array stored as ResultArray stores them: narrow formats as float32,
// converted here, inside the call's ExactArithmetic. A conversion from float64 left to Python ran
// under the caller's flush-to-zero and returned 0 for an fp32 reference of 1e-39.
py::array result_array(const std::vector<double>& values, const std::vector<std::size_t>& shape,
                       const FloatFormat& format) {
  ResultArray out(format, shape);
  for (std::size_t i = 0; i < values.size(); ++i) out.store(i, values[i]);
  return out.take();
}

// theta and the fully masked rule of the row references.
reference::RowOptions row_options_of(const Options& options) {
  reference::RowOptions row_options;
  row_options.theta = options.real("theta", 1.0);
  row_options.fully_masked_gives_zeros = options.flag("fully_masked_gives_zeros", false);
  return row_options;
}

// A lane's InputError again, naming the array and where the lane starts.
[[noreturn]] void rethrow_in_lane(const InputError& error, const std::string& name, const io::NpyLanes& lanes,
                                  std::size_t lane) {
  throw InputError(error.problem(), name + ", lane " + std::to_string(lane) + " (starting at element " +
                                        std::to_string(lanes.c_index(lane, 0)) + "): " + error.what());
}

// One lane's reference for a row operation, written at the lane's positions in `out`.
void reference_lane(const std::string& operation, const HostArray& logits, const io::NpyLanes& lanes,
                    std::size_t lane, const FloatFormat& target, const reference::RowOptions& row_options,
                    const ResultArray& out) {
  const Matrix row = logits.read_lanes(lanes, lane, 1);
  try {
    if (operation == "logsumexp") {
      out.store(lane, reference::logsumexp(row.values, target, row_options));
    } else if (operation == "entropy") {
      out.store(lane, reference::entropy(row.values, target, row_options));
    } else {
      const auto values = operation == "softmax" ? reference::softmax(row.values, target, row_options)
                                                 : reference::log_softmax(row.values, target, row_options);
      for (std::size_t a = 0; a < lanes.extent; ++a) out.store(lanes.c_index(lane, a), values[a]);
    }
  } catch (const InputError& error) {
    rethrow_in_lane(error, logits.name(), lanes, lane);
  }
}

// softmax / log_softmax (same shape) or logsumexp / entropy (the axis removed) along `dim`.
py::array reference_rows(const std::string& operation, const py::object& x, const py::dict& given) {
  if (operation != "softmax" && operation != "log_softmax" && operation != "logsumexp" &&
      operation != "entropy")
    throw InputError(InputProblem::out_of_range, "unknown row operation '" + operation + "'");
  const Options options(given);
  const FloatFormat& target = *gate::stored_format(options.text("format", "fp32")).format;
  const HostArray logits(x, options.text("name", "logits"), options.input_format());
  if (logits.size() == 0) throw InputError(InputProblem::empty_input, logits.name() + " holds no element");
  const io::NpyLanes lanes = options.lanes(logits);
  const reference::RowOptions row_options = row_options_of(options);
  const unsigned threads = options.count("threads", 0);
  options.require_all_used();
  const bool reduces = operation == "logsumexp" || operation == "entropy";
  std::vector<std::size_t> shape = logits.shape();
  if (reduces && !shape.empty()) shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(lanes.axis));
  ResultArray out(target, shape);
  {
    const Released released;
    parallel_for(lanes.count, threads, [&](std::size_t lane) {
      reference_lane(operation, logits, lanes, lane, target, row_options, out);
    });
  }
  return out.take();
}

// softmax_backward / log_softmax_backward along `dim`: the gradient with respect to the logits.
py::array reference_backward(const std::string& operation, const py::object& dy, const py::object& x,
                             const py::dict& given) {
  if (operation != "softmax_backward" && operation != "log_softmax_backward")
    throw InputError(InputProblem::out_of_range, "unknown backward operation '" + operation + "'");
  const Options options(given);
  const FloatFormat& target = *gate::stored_format(options.text("format", "fp32")).format;
  const HostArray logits(x, "logits", options.input_format()), gradient(dy, "dy", options.input_format());
  if (logits.size() == 0) throw InputError(InputProblem::empty_input, "logits holds no element");
  if (logits.shape() != gradient.shape())
    throw InputError(InputProblem::shape_mismatch, "dy's shape differs from the logits'");
  const io::NpyLanes lanes = options.lanes(logits);
  const reference::RowOptions row_options = row_options_of(options);
  const unsigned threads = options.count("threads", 0);
  options.require_all_used();
  ResultArray out(target, logits.shape());
  {
    const Released released;
    parallel_for(lanes.count, threads, [&](std::size_t lane) {
      const Matrix row = logits.read_lanes(lanes, lane, 1), grad = gradient.read_lanes(lanes, lane, 1);
      // A non-finite dy is named in dy, at its full index (the lane's message named the logits).
      for (std::size_t a = 0; a < lanes.extent; ++a) {
        if (std::isfinite(grad.values[a]) || row.values[a] == -INFINITY) continue;  // masked: unread
        std::string message = gradient.name() + "[";
        for (const std::size_t i : gate::unravel(lanes.c_index(lane, a), logits.shape())) {
          if (message.back() != '[') message += ", ";
          message += std::to_string(i);
        }
        message += "] is not finite (" + std::to_string(grad.values[a]) + "): ";
        message += operation;
        message += " needs a finite dy where the logit is not -inf";
        throw InputError(InputProblem::non_finite_value, message);
      }
      try {
        const auto values =
            operation == "softmax_backward"
                ? reference::softmax_backward(row.values, grad.values, target, row_options)
                : reference::log_softmax_backward(row.values, grad.values, target, row_options);
        for (std::size_t a = 0; a < lanes.extent; ++a) out.store(lanes.c_index(lane, a), values[a]);
      } catch (const InputError& error) {
        rethrow_in_lane(error, logits.name(), lanes, lane);
      }
    });
  }
  return out.take();
}

// Attention's output (q's layout with the value dimension) and, when asked, its log-sum-exp.
py::tuple reference_attention(const py::object& q, const py::object& k, const py::object& v,
                              const py::dict& given) {
  const Options options(given);
  const FloatFormat& target = *gate::stored_format(options.text("format", "fp32")).format;
  const gate::StoredFormat input = options.input_format();
  const HostArray queries(q, "q", input), keys(k, "k", input), values(v, "v", input);
  AttentionExtras extras = options.attention_extras();
  const gate::JudgeOptions judge = options.judge_options();
  reference::AttentionTensorOptions reference_options;
  reference_options.return_lse = options.flag("return_lse", false);
  reference_options.return_weights = options.flag("return_weights", false);
  reference_options.lse_base2 = judge.lse_base2;
  reference_options.threads = judge.threads;
  reference_options.lse_format = &fp32;  // as kernels store it (and as the judge reads it)
  options.require_all_used();
  const tensor::AttentionProblem problem =
      gate::attention_problem_of(judge, extras.arrays(&queries, &keys, &values, nullptr, nullptr));
  reference::AttentionTensorResult result;
  {
    const Released released;
    problem.validate();
    result = reference::attention(problem, queries.values(), keys.values(), values.values(), target,
                                  reference_options);
  }
  std::vector<std::size_t> out_shape = queries.shape();
  out_shape.back() = problem.shape.value_dim;
  py::object lse = py::none();
  if (reference_options.return_lse) lse = result_array(result.lse, lse_shape(problem, queries.shape()), fp32);
  py::object weights = py::none();
  if (reference_options.return_weights) {
    const tensor::AttentionShape& shape = problem.shape;
    std::vector<std::size_t> weight_shape{shape.batch, shape.heads, result.weight_queries,
                                          result.weight_keys};
    if (queries.shape().size() == 2) weight_shape = {result.weight_queries, result.weight_keys};  // one head
    weights = result_array(result.weights, weight_shape, target);
  }
  return py::make_tuple(result_array(result.output, out_shape, target), lse, weights);
}

// The case record (gate/report.hpp's JSON) of softmax or log-softmax outputs against the logits.
std::string judge_softmax(const py::object& actual, const py::object& logits, const py::dict& given) {
  const Options options(given);
  const gate::JudgeOptions judge = options.judge_options();
  const HostArray outputs(actual, options.text("actual_name", "actual"), gate::stored_format(judge.format));
  const HostArray inputs(logits, "logits", options.input_format());
  options.require_all_used();
  gate::CaseOutcome outcome;
  {
    const Released released;
    outcome = gate::judge_softmax_arrays(judge, inputs, outputs);
  }
  return gate::to_json(outcome).dump();
}

// Every operation of the registry as `sharpcheck ops --json` prints it.
std::string ops_json() {
  nlohmann::json list = nlohmann::json::array();
  for (const gate::Operation* operation : ops::all_operations())
    list.push_back(gate::describe_operation(*operation));
  return list.dump();
}

// The case record of one operation judged from arrays: `tensors` by tensor name, `options` as
// KEY=VALUE text read through the operation's schema (the parser `compare --op` uses), so a
// misspelt keyword or a wrong value is refused with the same message.
std::string judge_op(const std::string& name, const py::dict& tensors, const py::dict& options) {
  const gate::Operation& operation = gate::find_operation(ops::all_operations(), name);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& [key, value] : options) pairs.emplace_back(py::str(key), py::str(value));
  for (const auto& [key, value] : tensors) pairs.emplace_back(py::str(key), py::str(key));
  const gate::ParsedCall parsed = gate::parse_op_arguments(operation, pairs);
  std::vector<std::unique_ptr<HostArray>> arrays;
  gate::OpCall call;
  call.options = parsed.options;
  for (const gate::TensorSpec& tensor : operation.tensors) {
    const std::string key(tensor.name);
    if (!tensors.contains(key)) continue;
    arrays.push_back(
        std::make_unique<HostArray>(tensors[py::str(key)], key, gate::tensor_format(tensor, call.options)));
    call.tensors.emplace(key, arrays.back().get());
  }
  gate::CaseOutcome outcome;
  {
    const Released released;
    outcome = operation.judge(call);
  }
  return gate::to_json(outcome).dump();
}

// The gate's sweep of one operation for a kernel outside it (sharpcheck.cases): each case as a
// dict of id, tensors (name: float64 array holding values of the format), stored_as (the tensors
// handed over in another format: fp64 per-head values, fp32 partial LSEs), options (JSON text, by the
// schema's names) and needs.
// The case record of attention outputs (and a log-sum-exp, if given) against q, k and v.
std::string judge_attention(const py::object& out, const py::object& q, const py::object& k,
                            const py::object& v, const py::object& lse, const py::dict& given) {
  const Options options(given);
  const gate::JudgeOptions judge = options.judge_options();
  const gate::StoredFormat input = options.input_format();
  const HostArray queries(q, "q", input), keys(k, "k", input), values(v, "v", input);
  const HostArray outputs(out, "out", gate::stored_format(judge.format));
  std::optional<HostArray> lse_array;
  if (!lse.is_none()) lse_array.emplace(lse, "lse", gate::stored_format(judge.lse_format));
  AttentionExtras extras = options.attention_extras();
  options.require_all_used();
  gate::CaseOutcome outcome;
  {
    const Released released;
    outcome = gate::judge_attention_arrays(
        judge, extras.arrays(&queries, &keys, &values, &outputs, lse_array ? &*lse_array : nullptr));
  }
  return gate::to_json(outcome).dump();
}

// (dq, dk, dv, d_sinks or None) as arrays shaped as q, k, v.
py::tuple gradients_tuple(const gate::BackwardGradients& g, const HostArray& queries, const HostArray& keys,
                          const HostArray& values, const FloatFormat& format) {
  const py::object sinks =
      g.d_sinks.empty() ? py::object(py::none()) : result_array(g.d_sinks, {g.d_sinks.size()}, format);
  return py::make_tuple(result_array(g.dq, queries.shape(), format), result_array(g.dk, keys.shape(), format),
                        result_array(g.dv, values.shape(), format), sinks);
}

// The correctly rounded attention gradients (dq, dk, dv laid out as q, k, v; the sinks' gradients
// or None) given dout and optionally the gradient reaching the log-sum-exp.
py::tuple reference_attention_backward(const py::object& q, const py::object& k, const py::object& v,
                                       const py::object& dout, const py::object& d_lse,
                                       const py::dict& given) {
  const Options options(given);
  const gate::JudgeOptions judge = options.judge_options();
  const gate::StoredFormat input = options.input_format();
  const HostArray queries(q, "q", input), keys(k, "k", input), values(v, "v", input),
      d_out(dout, "dout", input);
  std::optional<HostArray> lse_gradient;
  if (!d_lse.is_none()) lse_gradient.emplace(d_lse, "d_lse", input);
  const AttentionExtras extras = options.attention_extras();
  options.require_all_used();
  gate::BackwardArrays arrays;  // the inputs only: no gradients to judge
  arrays.q = &queries;
  arrays.k = &keys;
  arrays.v = &values;
  arrays.d_out = &d_out;
  arrays.d_lse = lse_gradient ? &*lse_gradient : nullptr;
  arrays.scores = extras.arrays(nullptr, nullptr, nullptr, nullptr, nullptr);
  gate::BackwardGradients g;
  {
    const Released released;
    g = gate::attention_backward_of_arrays(judge, arrays);
  }
  return gradients_tuple(g, queries, keys, values, *gate::stored_format(judge.format).format);
}

// The JSON case record of gradients (dq, dk, dv) of inputs (q, k, v, dout) against the correctly
// rounded ones; with `want_reference`, (record, those gradients as reference_attention_backward).
py::object judge_attention_backward(const py::tuple& gradients, const py::tuple& inputs,
                                    const py::object& d_lse, const py::object& d_sinks, const py::object& d,
                                    const py::dict& given, bool want_reference) {
  if (gradients.size() != 3 || inputs.size() != 4)
    throw InputError(InputProblem::out_of_range,
                     "judge_attention_backward: (dq, dk, dv) and (q, k, v, dout)");
  const py::object &dq = gradients[0], &dk = gradients[1], &dv = gradients[2];
  const py::object &q = inputs[0], &k = inputs[1], &v = inputs[2], &dout = inputs[3];
  const Options options(given);
  const gate::JudgeOptions judge = options.judge_options();
  const gate::StoredFormat input = options.input_format(), output = gate::stored_format(judge.format);
  const HostArray queries(q, "q", input), keys(k, "k", input), values(v, "v", input),
      d_out(dout, "dout", input);
  const HostArray grad_q(dq, "dq", output), grad_k(dk, "dk", output), grad_v(dv, "dv", output);
  std::optional<HostArray> lse_gradient;
  if (!d_lse.is_none()) lse_gradient.emplace(d_lse, "d_lse", input);
  const AttentionExtras extras = options.attention_extras();
  options.require_all_used();
  std::optional<HostArray> d_array;
  // D as the reference rounds it (reference::d_format): fp32 under a narrower format, else the format.
  if (!d.is_none())
    d_array.emplace(d, "d", gate::stored_format(std::string(reference::d_format(*output.format).name)));
  gate::BackwardArrays arrays{.q = &queries,
                              .k = &keys,
                              .v = &values,
                              .d_out = &d_out,
                              .dq = &grad_q,
                              .dk = &grad_k,
                              .dv = &grad_v,
                              .d_lse = lse_gradient ? &*lse_gradient : nullptr,
                              .d = d_array ? &*d_array : nullptr,
                              .d_sinks = {},
                              .scores = extras.arrays(nullptr, nullptr, nullptr, nullptr, nullptr)};
  if (!d_sinks.is_none()) arrays.d_sinks = d_sinks.cast<std::vector<double>>();
  gate::CaseOutcome outcome;
  gate::BackwardGradients reference;
  {
    const Released released;
    outcome = gate::judge_attention_backward_arrays(judge, arrays, want_reference ? &reference : nullptr);
  }
  py::str record(gate::to_json(outcome).dump());
  if (!want_reference) return record;
  return py::make_tuple(record, gradients_tuple(reference, queries, keys, values, *output.format));
}

// The case records of a run (a JSON list) as the gate's whole report, its JUnit XML and its exit
// code: the checks made through the asserts are named kernels, judged plainly.
std::vector<nlohmann::json> records_of(const std::string& cases) {
  const auto parsed = nlohmann::json::parse(cases);
  return {parsed.begin(), parsed.end()};
}
// complete: false for a run cut short (a signal), as the gate marks its own.
std::string report_json(const std::string& cases, bool complete) {
  nlohmann::json report = gate::report_json({.explicit_kernels = true}, records_of(cases));
  if (!complete) report["complete"] = false;
  return report.dump(2);
}
std::string junit_xml(const std::string& cases) {
  return gate::junit_xml(records_of(cases), {.explicit_kernels = true, .whole_sweep = true});
}
int exit_code(const std::string& cases) {
  const auto records = records_of(cases);
  return gate::judge_sweep(records, {.explicit_kernels = true, .whole_sweep = true}).exit_code();
}
void write_report(const std::string& path, const std::string& text) { io::write_file_atomically(path, text); }

// OSError naming why `path` could not be written now (the pytest plugin asks before the run).
void check_writable(const std::string& path) { io::check_writable(path); }

// InputError becomes TypeError (a dtype or format) or ValueError (anything else about the values
// or shapes), IoError OSError; UndecidedRounding is the module's own exception.
void translate_errors(py::module_& module) {
  py::register_exception<UndecidedRounding>(module, "UndecidedRounding", PyExc_ArithmeticError);
  // By value: pybind11's translator is a void(*)(std::exception_ptr).
  py::register_exception_translator(
      [](std::exception_ptr error) {  // NOLINT(performance-unnecessary-value-param)
        try {
          if (error) std::rethrow_exception(error);
        } catch (const InputError& e) {
          PyErr_SetString(
              e.problem() == InputProblem::unsupported_format ? PyExc_TypeError : PyExc_ValueError, e.what());
        } catch (const IoError& e) {
          PyErr_SetString(PyExc_OSError, e.what());
        } catch (const Interrupted& e) {  // Ctrl-C during a call (python/released.hpp)
          PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
        }
      });
}

// An entry that computes, run under ExactArithmetic (core/exact_arithmetic.hpp): a caller's
// torch.set_flush_denormal(True) or rounding mode is its own business, not the reference's or the
// judge's, and is the caller's again when the call returns.
template <typename Result, typename... Args>
auto exact(Result (*function)(Args...)) {
  return [function](Args... args) -> Result {
    const ExactArithmetic arithmetic;
    return function(std::forward<Args>(args)...);
  };
}

}  // namespace
}  // namespace sharpcheck::python

PYBIND11_MODULE(_sharpcheck, module) {
  using namespace sharpcheck::python;
  namespace py = pybind11;
  module.doc() =
      "sharpcheck's C++ core: correctly rounded references and the judge (use the sharpcheck package)";
  translate_errors(module);
  module.def("reference_rows", exact(&reference_rows), py::arg("operation"), py::arg("x"),
             py::arg("options"));
  module.def("reference_backward", exact(&reference_backward), py::arg("operation"), py::arg("dy"),
             py::arg("x"), py::arg("options"));
  module.def("reference_attention", exact(&reference_attention), py::arg("q"), py::arg("k"), py::arg("v"),
             py::arg("options"));
  module.def("judge_softmax", exact(&judge_softmax), py::arg("actual"), py::arg("logits"),
             py::arg("options"));
  module.def("judge_attention", exact(&judge_attention), py::arg("out"), py::arg("q"), py::arg("k"),
             py::arg("v"), py::arg("lse"), py::arg("options"));
  module.def("reference_attention_backward", exact(&reference_attention_backward), py::arg("q"), py::arg("k"),
             py::arg("v"), py::arg("dout"), py::arg("d_lse"), py::arg("options"));
  module.def("judge_attention_backward", exact(&judge_attention_backward), py::arg("gradients"),
             py::arg("inputs"), py::arg("d_lse"), py::arg("d_sinks"), py::arg("d"), py::arg("options"),
             py::arg("want_reference") = false);
  module.def("ops_json", &ops_json);
  module.def("judge_op", exact(&judge_op), py::arg("name"), py::arg("tensors"), py::arg("options"));
  module.def("external_cases", exact(&external_cases), py::arg("name"), py::arg("format"), py::arg("sizes"),
             py::arg("seed"));
  module.def("judge_invariance_case", exact(&judge_invariance_case), py::arg("name"), py::arg("format"),
             py::arg("output_format"), py::arg("sizes"), py::arg("seed"), py::arg("id"), py::arg("calls"));
  module.def("report_json", &report_json, py::arg("cases"), py::arg("complete") = true);
  module.def("junit_xml", &junit_xml, py::arg("cases"));
  module.def("exit_code", &exit_code, py::arg("cases"));
  module.def("write_report", &write_report, py::arg("path"), py::arg("text"));
  module.def("check_writable", &check_writable, py::arg("path"));
}
