#include "python/options.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>

#include "python/errors.hpp"

namespace sharpcheck::python {
namespace py = pybind11;
namespace {

// A mask or bias array's [B|1, H|1, seq_q, seq_k] extents as broadcast flags (a 2-D array is [1, 1, ...]).
tensor::Broadcast broadcast_of(const py::array& array, const std::string& key) {
  if (array.ndim() == 2) return {};
  if (array.ndim() != 4)
    refuse_value(key, "must be 2-D [seq_q, seq_k] or 4-D [batch|1, heads|1, seq_q, seq_k]");
  return {array.shape(0) != 1, array.shape(1) != 1};
}

// value as T, or a TypeError naming the option and what it wants: pybind11's own cast error
// ("Unable to cast Python instance") names neither, and a str that is not UTF-8, an integer past
// 64 bits or a nested list must be refused as what they are.
template <typename T>
T cast_or_refuse(const py::handle& value, const char* key, const char* wanted) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
  } catch (const py::error_already_set&) {
  }
  refuse_type(key, std::string("must be ") + wanted);
}

// A whole number (anything with __index__: Python and NumPy integers), not a bool, a float or a str.
long long whole_number(const py::handle& value, const char* key) {
  if (py::isinstance<py::bool_>(value) || !py::hasattr(value, "__index__"))
    refuse_type(key, "must hold integers, got " + std::string(py::str(py::type::of(value))));
  return cast_or_refuse<long long>(value.attr("__index__")(), key, "an integer within 64 bits");
}

}  // namespace

gate::AttentionArrays AttentionExtras::arrays(const gate::Array* q, const gate::Array* k,
                                              const gate::Array* v, const gate::Array* out,
                                              const gate::Array* lse) const {
  gate::AttentionArrays arrays;
  arrays.q = q;
  arrays.k = k;
  arrays.v = v;
  arrays.out = out;
  arrays.lse = lse;
  arrays.sinks = sinks;
  arrays.alibi_slopes = alibi_slopes;
  arrays.keep = keep;
  arrays.keep_extent = keep_extent;
  arrays.bias = bias;
  arrays.bias_extent = bias_extent;
  return arrays;
}

Options::Options(const py::dict& given) : given_(given) {}

py::object Options::get(const char* key) const {
  used_.insert(key);
  if (!given_.contains(key)) return py::none();
  return given_[key];
}

std::string Options::text(const char* key, const std::string& otherwise) const {
  const py::object value = get(key);
  if (value.is_none()) return otherwise;
  if (!py::isinstance<py::str>(value)) refuse_type(key, "must be a string");
  return cast_or_refuse<std::string>(value, key, "a string encodable as UTF-8");
}

double Options::real(const char* key, double otherwise) const {
  const py::object value = get(key);
  if (value.is_none()) return otherwise;
  if (py::isinstance<py::bool_>(value)) refuse_type(key, "must be a number, not a bool");
  if (py::isinstance<py::str>(value) || !(py::hasattr(value, "__float__") || py::hasattr(value, "__index__")))
    refuse_type(key, "must be a number, got " + std::string(py::str(py::type::of(value))));
  const double number = cast_or_refuse<double>(value, key, "a number");
  if (std::isnan(number) || std::isinf(number))
    refuse_value(key, "must be finite, got " + std::to_string(number));
  return number;
}

bool Options::flag(const char* key, bool otherwise) const {
  const py::object value = get(key);
  if (value.is_none()) return otherwise;
  // True or False (or a NumPy bool): a truthy string such as "no" must not mean True.
  const bool numpy_bool = py::hasattr(value, "dtype") && std::string(py::str(value.attr("dtype"))) == "bool";
  if (!py::isinstance<py::bool_>(value) && !numpy_bool)
    refuse_type(key, "must be True or False, got " + std::string(py::str(py::type::of(value))));
  return py::bool_(value).cast<bool>();
}

long long Options::integer(const char* key, long long otherwise) const {
  const py::object value = get(key);
  if (value.is_none()) return otherwise;
  // Python and NumPy integers (anything with __index__), not bools or floats.
  if (py::isinstance<py::bool_>(value) || !py::hasattr(value, "__index__"))
    refuse_type(key, "must be an integer");
  return cast_or_refuse<long long>(value.attr("__index__")(), key, "an integer within 64 bits");
}

unsigned Options::count(const char* key, unsigned otherwise) const {
  const long long number = integer(key, otherwise);
  if (number < 0 || number > 1'000'000)
    refuse_value(key, "must be a count from 0, got " + std::to_string(number));
  return static_cast<unsigned>(number);
}

std::vector<std::size_t> Options::counts(const char* key) const {
  const py::object value = get(key);
  std::vector<std::size_t> result;
  if (value.is_none()) return result;
  if (!py::isinstance<py::sequence>(value) && !py::hasattr(value, "__iter__"))
    refuse_type(key, "must be a sequence of lengths");
  for (const py::handle item : value) {
    const long long number = whole_number(item, key);
    if (number < 0) refuse_value(key, "holds a negative length " + std::to_string(number));
    result.push_back(static_cast<std::size_t>(number));
  }
  return result;
}

std::vector<double> Options::reals(const char* key) const {
  const py::object value = get(key);
  std::vector<double> result;
  if (value.is_none()) return result;
  if (!py::hasattr(value, "__iter__")) refuse_type(key, "must be a 1-D sequence of numbers");
  for (const py::handle item : value) {
    if (py::isinstance<py::str>(item) || py::hasattr(item, "__iter__") || py::hasattr(item, "__len__"))
      refuse_type(key, "must be a 1-D sequence of numbers (one per head)");
    result.push_back(cast_or_refuse<double>(item, key, "a 1-D sequence of numbers"));
  }
  return result;
}

gate::StoredFormat Options::input_format() const {
  const std::string input = text("input_format", "");
  return gate::stored_format(input.empty() ? text("format", "fp32") : input);
}

int Options::dim() const {
  const long long dim = integer("dim", -1);
  if (dim < -(1LL << 20) || dim > (1LL << 20)) refuse_value("dim", "is out of range: " + std::to_string(dim));
  return static_cast<int>(dim);
}

io::NpyLanes Options::lanes(const gate::Array& array) const { return gate::lanes_along_dim(array, dim()); }

tensor::HeadScores Options::scores() const {
  tensor::HeadScores scores;
  if (!get("scale").is_none()) scores.scale = real("scale", 1.0);
  scores.softcap = real("softcap", 0.0);
  scores.causal = flag("causal", false);
  const std::string align = text("align", "top-left");
  if (align != "top-left" && align != "bottom-right")
    refuse_value("align", "must be 'top-left' or 'bottom-right'");
  if (align == "bottom-right") scores.alignment = tensor::DiagonalAlignment::bottom_right;
  const py::object window = get("window");
  if (!window.is_none()) {
    if (py::isinstance<py::str>(window) || !py::isinstance<py::sequence>(window))
      refuse_type("window", "takes (left, right), each a count or None / -1 for unbounded");
    const auto sides = window.cast<std::vector<py::object>>();
    if (sides.size() != 2) refuse_value("window", "takes (left, right), None or -1 for unbounded");
    const auto side = [](const py::object& value) -> std::optional<std::size_t> {
      if (value.is_none()) return std::nullopt;
      const long long count = whole_number(value, "window");
      if (count == -1) return std::nullopt;
      if (count < 0)
        refuse_value("window", "sides are counts, or None / -1 for unbounded; got " + std::to_string(count));
      return static_cast<std::size_t>(count);
    };
    scores.window_left = side(sides[0]);
    scores.window_right = side(sides[1]);
  }
  const std::string fully_masked = text("fully_masked", "zeros");
  if (fully_masked != "zeros" && fully_masked != "error")
    refuse_value("fully_masked", "must be 'zeros' or 'error'");
  scores.fully_masked =
      fully_masked == "zeros" ? tensor::FullyMaskedRows::zeros : tensor::FullyMaskedRows::error;
  return scores;
}

gate::JudgeOptions Options::judge_options() const {
  gate::JudgeOptions options;
  options.log_softmax = flag("log_softmax", false);
  options.dim = dim();
  options.format = text("format", "fp32");
  options.tolerance_entry = text("tolerance", "");
  options.input_format = text("input_format", "");
  options.theta = real("theta", 1.0);
  options.layout = text("layout", "bhsd");
  options.scores = scores();
  options.query_lengths = counts("query_lengths");
  options.key_lengths = counts("key_lengths");
  options.cu_seqlens_q = counts("cu_seqlens_q");
  options.cu_seqlens_k = counts("cu_seqlens_k");
  options.lse_base2 = flag("lse_base2", false);
  options.lse_format = text("lse_format", "fp32");
  options.name = text("name", "");
  options.strictest = flag("proven_only", false) ? metrics::Tier::proven : metrics::Tier::statistical;
  options.threads = count("threads", 0);
  return options;
}

AttentionExtras Options::attention_extras() const {
  AttentionExtras extras;
  extras.sinks = reals("sinks");
  extras.alibi_slopes = reals("alibi_slopes");
  const py::object keep = get("mask");
  if (!keep.is_none()) {
    const auto array = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(keep);
    if (!array) refuse_value("mask", "must be an array of booleans (True keeps the key)");
    extras.keep.assign(array.data(), array.data() + array.size());
    extras.keep_extent = broadcast_of(array, "mask");
  }
  const py::object bias = get("bias");
  if (!bias.is_none()) {
    const auto array = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(bias);
    if (!array) refuse_value("bias", "must be an array of numbers (added to the scores)");
    extras.bias.assign(array.data(), array.data() + array.size());
    extras.bias_extent = broadcast_of(array, "bias");
  }
  return extras;
}

void Options::require_all_used() const {
  std::string unused;
  for (const auto& [key, value] : given_) {
    const auto name = py::str(key).cast<std::string>();
    if (!used_.contains(name)) unused += (unused.empty() ? "" : ", ") + name;
  }
  if (!unused.empty()) throw InputError(InputProblem::out_of_range, "unexpected options: " + unused);
}

std::vector<std::size_t> lse_shape(const tensor::AttentionProblem& problem,
                                   const std::vector<std::size_t>& query_shape) {
  if (query_shape.size() <= 2) return {problem.shape.queries};
  if (problem.layout == tensor::Layout::packed) return {problem.shape.heads, problem.stored_queries()};
  return {problem.shape.batch, problem.shape.heads, problem.shape.queries};
}

}  // namespace sharpcheck::python
