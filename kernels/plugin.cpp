#include "kernels/plugin.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

#include "core/child_process.hpp"
#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "core/text.hpp"
#include "formats/storage.hpp"
#include "kernels/plugin_abi.h"
#include "kernels/plugin_child.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::kernels {
namespace {

using SoftmaxEntry = int (*)(uint32_t, const void*, void*, size_t, size_t, float);
using AttentionEntry = int (*)(uint32_t, const void*, const void*, const void*, void*, size_t, size_t, size_t,
                               size_t, float, int);
using BackwardEntry = int (*)(uint32_t, const void*, const void*, const void*, const void*, void*, void*,
                              void*, float*, const sharpcheck_attention_call*);
using BackwardLseEntry = int (*)(uint32_t, const void*, const void*, const void*, const void*, const float*,
                                 void*, void*, void*, float*, float*, const sharpcheck_attention_call*);
using LayerEntry = int (*)(uint32_t, const void*, const void*, const void*, void*,
                           const sharpcheck_attention_call*);

// A child's exit status when the library or its entry point could not be found there.
constexpr int load_failure_status = 9;

uint32_t format_code(const FloatFormat& format) {
  if (format == fp32) return SHARPCHECK_FP32;
  if (format == bf16) return SHARPCHECK_BF16;
  return SHARPCHECK_FP16;
}

// Runs in the child: converts to storage, calls the plugin, returns the outputs as doubles' bytes
// (or, when the plugin reports an error, exit status 10 + its code).
std::pair<std::string, int> call_plugin(SoftmaxEntry softmax, const FloatFormat& format, const Matrix& logits,
                                        float scale) {
  const std::size_t count = logits.values.size();
  std::vector<double> result(count);
  int code = 0;
  if (format == fp32) {
    std::vector<float> in(count), out = guarded<float>(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(logits.values[i]);
    code = softmax(SHARPCHECK_FP32, in.data(), out.data(), logits.rows, logits.cols, scale);
    if (!intact(out, count)) return {"out", overrun_status};
    for (std::size_t i = 0; i < count; ++i) result[i] = out[i];
  } else {
    std::vector<std::uint16_t> in(count), out = guarded<std::uint16_t>(count);
    for (std::size_t i = 0; i < count; ++i)
      in[i] = static_cast<std::uint16_t>(encode(logits.values[i], format));
    code = softmax(format_code(format), in.data(), out.data(), logits.rows, logits.cols, scale);
    if (!intact(out, count)) return {"out", overrun_status};
    for (std::size_t i = 0; i < count; ++i) result[i] = decode(out[i], format);
  }
  if (code != 0) return {"", 10 + (code & 0x7F)};
  return {std::string(reinterpret_cast<const char*>(result.data()), count * sizeof(double)), 0};
}

// Values of `format` in the plugin's storage: float for fp32, bit patterns otherwise.
std::vector<char> to_storage(const Matrix& matrix, const FloatFormat& format) {
  std::vector<char> bytes;
  if (format == fp32) {
    std::vector<float> values(matrix.values.begin(), matrix.values.end());
    bytes.resize(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    std::vector<std::uint16_t> values(matrix.values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<std::uint16_t>(encode(matrix.values[i], format));
    bytes.resize(values.size() * sizeof(std::uint16_t));
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

std::vector<double> from_storage(const std::vector<char>& bytes, std::size_t count,
                                 const FloatFormat& format) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (format == fp32) {
      float value;
      std::memcpy(&value, bytes.data() + i * sizeof(float), sizeof(float));
      values[i] = value;
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, bytes.data() + i * sizeof(bits), sizeof(bits));
      values[i] = decode(bits, format);
    }
  }
  return values;
}

std::pair<std::string, int> call_attention(AttentionEntry attention, const FloatFormat& format,
                                           const Matrix& q, const Matrix& k, const Matrix& v, float scale,
                                           bool causal) {
  const auto q_bytes = to_storage(q, format);
  const auto k_bytes = to_storage(k, format);
  const auto v_bytes = to_storage(v, format);
  const std::size_t count = q.rows * v.cols;
  const std::size_t bytes = count * (format == fp32 ? sizeof(float) : sizeof(std::uint16_t));
  std::vector<char> out = guarded<char>(bytes);
  const int code = attention(format_code(format), q_bytes.data(), k_bytes.data(), v_bytes.data(), out.data(),
                             q.rows, k.rows, q.cols, v.cols, scale, causal ? 1 : 0);
  if (!intact(out, bytes)) return {"out", overrun_status};
  if (code != 0) return {"", 10 + (code & 0x7F)};
  const auto result = from_storage(out, count, format);
  return {std::string(reinterpret_cast<const char*>(result.data()), count * sizeof(double)), 0};
}

// The ABI's call for scores `scores` over the given extents (kernels/plugin_abi.h), without ALiBi
// slopes, sinks or a log-sum-exp (callers point those at storage they keep).
sharpcheck_attention_call scores_call(const tensor::HeadScores& scores, std::size_t heads,
                                      std::size_t kv_heads, std::size_t queries, std::size_t keys,
                                      std::size_t valid_keys, std::size_t dim, std::size_t value_dim) {
  const double scale = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(dim));
  const auto side = [](const std::optional<std::size_t>& w) {
    return w ? static_cast<int64_t>(*w) : int64_t{-1};
  };
  return {heads,
          kv_heads,
          queries,
          keys,
          valid_keys,
          dim,
          value_dim,
          static_cast<float>(scale / scores.theta),
          scores.causal ? 1 : 0,
          scores.alignment == tensor::DiagonalAlignment::bottom_right ? 1 : 0,
          side(scores.window_left),
          side(scores.window_right),
          static_cast<float>(scores.softcap),
          nullptr,
          nullptr,
          nullptr};
}

// The ABI's description of batch element b; `slopes` and `sinks` keep what it points to.
sharpcheck_attention_call layer_call(const tensor::AttentionProblem& p, std::size_t b,
                                     std::size_t stored_keys, std::vector<float>& slopes,
                                     std::vector<float>& sinks) {
  const auto& shape = p.shape;
  slopes.assign(p.alibi_slopes.begin(), p.alibi_slopes.end());
  sinks.assign(p.sinks.begin(), p.sinks.end());
  sharpcheck_attention_call call = scores_call(p.scores, shape.heads, shape.kv_heads, p.query_length(b),
                                               stored_keys, p.key_length(b), shape.head_dim, shape.value_dim);
  call.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
  call.sinks = sinks.empty() ? nullptr : sinks.data();
  return call;
}

// Runs in the child: every batch element through sharpcheck_attention_layer; returns the outputs
// and then (when asked) the log-sum-exp, as doubles' bytes in the problem's layouts.
std::pair<std::string, int> call_attention_layer(LayerEntry entry, const FloatFormat& format,
                                                 const tensor::AttentionProblem& p, std::span<const double> q,
                                                 std::span<const double> k, std::span<const double> v,
                                                 bool want_lse) {
  const auto& shape = p.shape;
  std::vector<double> result(p.output_elements() + (want_lse ? p.lse_elements() : 0), 0.0);
  for (std::size_t b = 0; b < shape.batch; ++b) {
    const std::size_t rows = p.query_length(b);
    const std::size_t keys = p.layout == tensor::Layout::packed ? p.key_length(b) : shape.keys;
    if (rows == 0) continue;
    // One batch element's heads as the ABI lays them out: [heads, rows, columns].
    const Matrix qh =
        tensor::gather_heads(p, tensor::HeadTensor::query, tensor::SpanSource(q), b, 0, shape.heads, rows);
    const Matrix kh =
        tensor::gather_heads(p, tensor::HeadTensor::key, tensor::SpanSource(k), b, 0, shape.kv_heads, keys);
    const Matrix vh =
        tensor::gather_heads(p, tensor::HeadTensor::value, tensor::SpanSource(v), b, 0, shape.kv_heads, keys);
    std::vector<float> slopes, sinks, lse = guarded<float>(shape.heads * rows);
    sharpcheck_attention_call call = layer_call(p, b, keys, slopes, sinks);
    if (want_lse) call.lse = lse.data();
    const std::size_t count = shape.heads * rows * shape.value_dim;
    const std::size_t bytes = count * (format == fp32 ? sizeof(float) : sizeof(std::uint16_t));
    std::vector<char> out = guarded<char>(bytes);
    const int code = entry(format_code(format), to_storage(qh, format).data(), to_storage(kh, format).data(),
                           to_storage(vh, format).data(), out.data(), &call);
    if (!intact(out, bytes)) return {"out", overrun_status};
    if (!intact(lse, shape.heads * rows)) return {"lse", overrun_status};
    if (code != 0) return {"", 10 + (code & 0x7F)};
    const auto values = from_storage(out, count, format);
    for (std::size_t h = 0; h < shape.heads; ++h) {
      for (std::size_t s = 0; s < rows; ++s) {
        for (std::size_t c = 0; c < shape.value_dim; ++c)
          result[p.output_offset(b, h, s, c)] = values[(h * rows + s) * shape.value_dim + c];
        if (want_lse) result[p.output_elements() + p.lse_offset(b, h, s)] = lse[h * rows + s];
      }
    }
  }
  return {std::string(reinterpret_cast<const char*>(result.data()), result.size() * sizeof(double)), 0};
}

// Whether a backward problem needs version 5's entry: a sink or a gradient through the log-sum-exp.
bool needs_lse_entry(const tensor::AttentionBackwardProblem& p) {
  return !p.d_lse.empty() || p.head(0).sink.has_value();
}

// Runs in the child: one head's gradients through sharpcheck_attention_backward (or, with a sink
// or a log-sum-exp gradient, sharpcheck_attention_backward_lse), returned as doubles: dQ, dK, dV
// (row-major), D per query, then the sink's gradient when there is a sink.
std::pair<std::string, int> call_attention_backward(void* symbol, const FloatFormat& format,
                                                    const tensor::AttentionBackwardProblem& p) {
  const std::size_t m = p.queries.rows, n = p.keys.rows, d = p.queries.cols, dv = p.values.cols;
  const tensor::HeadScores head = p.head(0);
  sharpcheck_attention_call call = scores_call(head, 1, 1, m, n, n, d, dv);
  const std::vector<float> slope(1, static_cast<float>(head.alibi_slope));
  const std::vector<float> sink(1, static_cast<float>(head.sink.value_or(0.0)));
  const std::vector<float> d_lse(p.d_lse.begin(), p.d_lse.end());
  if (head.alibi_slope != 0) call.alibi_slopes = slope.data();
  if (head.sink) call.sinks = sink.data();
  const std::size_t width = format == fp32 ? sizeof(float) : sizeof(std::uint16_t);
  std::vector<char> dq = guarded<char>(m * d * width), dk = guarded<char>(n * d * width),
                    dvv = guarded<char>(n * dv * width);
  std::vector<float> d_rows = guarded<float>(m), d_sinks = guarded<float>(1);
  const auto q = to_storage(p.queries, format), k = to_storage(p.keys, format),
             v = to_storage(p.values, format), dout = to_storage(p.d_out, format);
  const int code = needs_lse_entry(p) ? reinterpret_cast<BackwardLseEntry>(symbol)(
                                            format_code(format), q.data(), k.data(), v.data(), dout.data(),
                                            d_lse.empty() ? nullptr : d_lse.data(), dq.data(), dk.data(),
                                            dvv.data(), d_rows.data(), d_sinks.data(), &call)
                                      : reinterpret_cast<BackwardEntry>(symbol)(
                                            format_code(format), q.data(), k.data(), v.data(), dout.data(),
                                            dq.data(), dk.data(), dvv.data(), d_rows.data(), &call);
  for (const auto& [name, buffer, bytes] :
       {std::tuple{"dq", &dq, m * d * width}, std::tuple{"dk", &dk, n * d * width},
        std::tuple{"dv", &dvv, n * dv * width}}) {
    if (!intact(*buffer, bytes)) return {name, overrun_status};
  }
  if (!intact(d_rows, m)) return {"d", overrun_status};
  if (!intact(d_sinks, 1)) return {"d_sinks", overrun_status};
  if (code != 0) return {"", 10 + (code & 0x7F)};
  std::vector<double> result = from_storage(dq, m * d, format);
  for (const auto& [bytes, count] : {std::pair{&dk, n * d}, std::pair{&dvv, n * dv}}) {
    const auto values = from_storage(*bytes, count, format);
    result.insert(result.end(), values.begin(), values.end());
  }
  result.insert(result.end(), d_rows.begin(), d_rows.begin() + static_cast<std::ptrdiff_t>(m));
  if (head.sink) result.push_back(d_sinks[0]);
  return {std::string(reinterpret_cast<const char*>(result.data()), result.size() * sizeof(double)), 0};
}

// What a child's ending means for a plugin call whose answer is `expected_values` doubles.
PluginRun interpret(const ChildOutcome& child, const ChildLimits& limits, std::size_t expected_values,
                    std::size_t rows, std::size_t cols, const char* entry) {
  const std::size_t expected = expected_values * sizeof(double);
  const auto failed = [&](PluginRun::Status status, std::string detail) {
    return PluginRun{status, std::move(detail), {}, child.console};
  };
  switch (child.ending) {
    case ChildOutcome::Ending::could_not_start:
      return failed(PluginRun::Status::returned_error, describe_ending(child, limits));
    case ChildOutcome::Ending::timed_out:
      return failed(PluginRun::Status::hung, describe_ending(child, limits));
    case ChildOutcome::Ending::killed_by_signal:
      return failed(PluginRun::Status::crashed, describe_ending(child, limits));
    case ChildOutcome::Ending::out_of_memory:
      return failed(PluginRun::Status::out_of_memory, describe_ending(child, limits));
    case ChildOutcome::Ending::interrupted:
      return failed(PluginRun::Status::interrupted, describe_ending(child, limits));
    case ChildOutcome::Ending::exited:
      break;
  }
  if (child.exit_code == load_failure_status) {
    return failed(PluginRun::Status::crashed, "could not be loaded in the child: " + child.output);
  }
  if (child.exit_code == overrun_status) {
    return failed(PluginRun::Status::crashed, std::string(entry) + " wrote past the end of its " +
                                                  child.output +
                                                  " output buffer (the bytes after it changed)");
  }
  if (child.exit_code >= 10) {
    return failed(PluginRun::Status::returned_error,
                  std::string(entry) + " returned " + std::to_string(child.exit_code - 10));
  }
  if (child.exit_code != 0 || child.output.size() != expected) {
    return failed(PluginRun::Status::crashed,
                  "the child exited (status " + std::to_string(child.exit_code) + ") without its output (" +
                      std::to_string(child.output.size()) + " of " + std::to_string(expected) + " bytes)");
  }
  PluginRun run;
  run.out = Matrix(rows, cols);
  std::memcpy(run.out.values.data(), child.output.data(), expected);
  run.console = child.console;
  return run;
}

// In a child: opens the library and finds `symbol`; on failure writes why and exits
// load_failure_status. Only a child ever runs a plugin's code: its constructors, its info
// function and its entry points.
void* symbol_in_child(const std::string& path, const char* symbol) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* problem = handle == nullptr ? dlerror() : nullptr;
  void* entry = handle != nullptr ? dlsym(handle, symbol) : nullptr;
  if (entry == nullptr) {
    const std::string message =
        problem != nullptr ? std::string(problem) : std::string("no symbol ") + symbol;
    [[maybe_unused]] const ssize_t ignored = write(STDOUT_FILENO, message.data(), message.size());
    _exit(load_failure_status);
  }
  return entry;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', start)) {
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

}  // namespace

const char* plugin_status_name(PluginRun::Status status) {
  switch (status) {
    case PluginRun::Status::ok:
      return "ok";
    case PluginRun::Status::crashed:
      return "crashed";
    case PluginRun::Status::hung:
      return "hung";
    case PluginRun::Status::returned_error:
      return "returned an error";
    case PluginRun::Status::out_of_memory:
      return "ran out of memory";
    case PluginRun::Status::interrupted:
      return "interrupted";
  }
  return "?";
}

std::shared_ptr<Plugin> Plugin::open(const std::string& path, const ChildLimits& limits) {
  if (path.empty()) throw InputError(InputProblem::out_of_range, "plugin: the path is empty");
  std::shared_ptr<Plugin> plugin(new Plugin());
  plugin->path_ = path;
  plugin->limits_ = limits;
  const std::string shown = to_valid_utf8(path);
  const ChildOutcome child = run_in_child([&] { return describe_in_child(path); }, limits);
  if (child.ending == ChildOutcome::Ending::interrupted) throw Interrupted(interrupt_signal());
  if (child.ending != ChildOutcome::Ending::exited || child.exit_code != 0) {
    throw PluginCrash("plugin " + shown +
                      " failed while being loaded and described: " + describe_ending(child, limits) +
                      (child.console.empty() ? "" : "; it printed: " + child.console));
  }
  const auto lines = split_lines(child.output);
  if (lines.size() >= 2 && lines[0] == "error") {
    throw InputError(InputProblem::out_of_range, "plugin " + shown + " " + to_valid_utf8(lines[1]));
  }
  if (lines.size() != 8 || lines[0] != "ok") {
    throw PluginCrash("plugin " + shown + ": its description could not be read");
  }
  plugin->name_ = to_valid_utf8(lines[1]);
  plugin->description_ = to_valid_utf8(lines[2]);
  const auto softmax_bits = std::stoul(lines[3]);
  const auto attention_bits = std::stoul(lines[4]);
  plugin->features_ = static_cast<std::uint32_t>(std::stoul(lines[5]));
  const auto operation_bits = std::stoul(lines[7]);
  for (const auto& [bit, format] : {std::pair{SHARPCHECK_FP32, &fp32}, std::pair{SHARPCHECK_BF16, &bf16},
                                    std::pair{SHARPCHECK_FP16, &fp16}}) {
    if ((softmax_bits & bit) != 0) plugin->softmax_formats_.push_back(format);
    if ((attention_bits & bit) != 0) plugin->attention_formats_.push_back(format);
    if ((operation_bits & bit) != 0) plugin->operation_formats_.push_back(format);
  }
  for (std::size_t start = 0; start < lines[6].size();) {
    const std::size_t comma = std::min(lines[6].find(',', start), lines[6].size());
    if (comma > start) plugin->operations_.push_back(lines[6].substr(start, comma - start));
    start = comma + 1;
  }
  if (plugin->softmax_formats_.empty() && plugin->attention_formats_.empty() && plugin->operations_.empty()) {
    throw InputError(
        InputProblem::empty_input,
        "plugin " + shown + " declares no softmax or attention format and no operation: nothing to judge");
  }
  return plugin;
}

PluginRun Plugin::run_softmax(const FloatFormat& format, const Matrix& logits, float scale) const {
  const ChildOutcome child = run_in_child(
      [&] {
        const auto entry = reinterpret_cast<SoftmaxEntry>(symbol_in_child(path_, "sharpcheck_softmax"));
        return call_plugin(entry, format, logits, scale);
      },
      limits_);
  return interpret(child, limits_, logits.values.size(), logits.rows, logits.cols, "sharpcheck_softmax");
}

PluginRun Plugin::run_attention(const FloatFormat& format, const Matrix& q, const Matrix& k, const Matrix& v,
                                float scale, bool causal) const {
  const ChildOutcome child = run_in_child(
      [&] {
        const auto entry = reinterpret_cast<AttentionEntry>(symbol_in_child(path_, "sharpcheck_attention"));
        return call_attention(entry, format, q, k, v, scale, causal);
      },
      limits_);
  return interpret(child, limits_, q.rows * v.cols, q.rows, v.cols, "sharpcheck_attention");
}

PluginRun Plugin::run_attention_layer(const FloatFormat& format, const tensor::AttentionProblem& problem,
                                      std::span<const double> q, std::span<const double> k,
                                      std::span<const double> v, bool want_lse) const {
  const ChildOutcome child = run_in_child(
      [&] {
        const auto entry = reinterpret_cast<LayerEntry>(symbol_in_child(path_, "sharpcheck_attention_layer"));
        return call_attention_layer(entry, format, problem, q, k, v, want_lse);
      },
      limits_);
  const std::size_t count = problem.output_elements() + (want_lse ? problem.lse_elements() : 0);
  return interpret(child, limits_, count, 1, count, "sharpcheck_attention_layer");
}

PluginRun Plugin::run_attention_backward(const FloatFormat& format,
                                         const tensor::AttentionBackwardProblem& problem) const {
  const bool lse_entry = needs_lse_entry(problem);
  const char* name = lse_entry ? "sharpcheck_attention_backward_lse" : "sharpcheck_attention_backward";
  if (problem.group != 1 || !problem.head(0).bias.empty())
    throw InputError(InputProblem::out_of_range,
                     "plugin backward: one head at a time, and the ABI has no additive bias");
  if (lse_entry && (features_ & SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK) == 0)
    throw InputError(InputProblem::out_of_range,
                     "plugin " + name_ + " does not declare the backward through the log-sum-exp and sinks");
  const ChildOutcome child = run_in_child(
      [&] { return call_attention_backward(symbol_in_child(path_, name), format, problem); }, limits_);
  const std::size_t count = (problem.queries.rows + problem.keys.rows) * problem.queries.cols +
                            problem.keys.rows * problem.values.cols + problem.queries.rows +
                            (problem.head(0).sink ? 1 : 0);
  return interpret(child, limits_, count, 1, count, name);
}

PluginRun Plugin::run_operation(const std::string& operation, const FloatFormat& format,
                                const std::string& options, const std::vector<PluginTensor>& inputs,
                                const std::vector<PluginTensor>& outputs) const {
  const ChildOutcome child = run_in_child(
      [&] {
        return call_operation(symbol_in_child(path_, "sharpcheck_op"), operation, format_code(format),
                              options, inputs, outputs);
      },
      limits_);
  std::size_t count = 0;
  for (const PluginTensor& tensor : outputs) count += element_count(tensor);
  return interpret(child, limits_, count, 1, count, "sharpcheck_op");
}

}  // namespace sharpcheck::kernels
