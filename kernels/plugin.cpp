#include "kernels/plugin.hpp"

#include <dlfcn.h>

#include <cstring>
#include <utility>

#include "core/child_process.hpp"
#include "core/errors.hpp"
#include "formats/storage.hpp"
#include "kernels/plugin_abi.h"

namespace sharpcheck::kernels {
namespace {

using SoftmaxEntry = int (*)(uint32_t, const void*, void*, size_t, size_t, float);
using AttentionEntry = int (*)(uint32_t, const void*, const void*, const void*, void*, size_t, size_t, size_t, size_t,
                               float, int);
using InfoEntry = const sharpcheck_plugin_description* (*)();

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
    std::vector<float> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(logits.values[i]);
    code = softmax(SHARPCHECK_FP32, in.data(), out.data(), logits.rows, logits.cols, scale);
    for (std::size_t i = 0; i < count; ++i) result[i] = out[i];
  } else {
    std::vector<std::uint16_t> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::uint16_t>(encode(logits.values[i], format));
    code = softmax(format_code(format), in.data(), out.data(), logits.rows, logits.cols, scale);
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
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::uint16_t>(encode(matrix.values[i], format));
    bytes.resize(values.size() * sizeof(std::uint16_t));
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

std::vector<double> from_storage(const std::vector<char>& bytes, std::size_t count, const FloatFormat& format) {
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

std::pair<std::string, int> call_attention(AttentionEntry attention, const FloatFormat& format, const Matrix& q,
                                           const Matrix& k, const Matrix& v, float scale, bool causal) {
  const auto q_bytes = to_storage(q, format);
  const auto k_bytes = to_storage(k, format);
  const auto v_bytes = to_storage(v, format);
  const std::size_t count = q.rows * v.cols;
  std::vector<char> out(count * (format == fp32 ? sizeof(float) : sizeof(std::uint16_t)));
  const int code = attention(format_code(format), q_bytes.data(), k_bytes.data(), v_bytes.data(), out.data(), q.rows,
                             k.rows, q.cols, v.cols, scale, causal ? 1 : 0);
  if (code != 0) return {"", 10 + (code & 0x7F)};
  const auto result = from_storage(out, count, format);
  return {std::string(reinterpret_cast<const char*>(result.data()), count * sizeof(double)), 0};
}

// What a child's ending means for a plugin call whose answer is `expected_values` doubles.
PluginRun interpret(const ChildOutcome& child, std::size_t expected_values, std::size_t rows, std::size_t cols,
                    double timeout_seconds, const char* entry) {
  const std::size_t expected = expected_values * sizeof(double);
  switch (child.ending) {
    case ChildOutcome::Ending::could_not_start:
      return {PluginRun::Status::returned_error, "could not start a child process", {}};
    case ChildOutcome::Ending::timed_out:
      return {PluginRun::Status::hung, "no answer within " + std::to_string(timeout_seconds) + " s (killed)", {}};
    case ChildOutcome::Ending::killed_by_signal:
      return {PluginRun::Status::crashed, "killed by " + child.signal, {}};
    case ChildOutcome::Ending::exited: break;
  }
  if (child.exit_code >= 10) {
    return {PluginRun::Status::returned_error, std::string(entry) + " returned " + std::to_string(child.exit_code - 10), {}};
  }
  if (child.exit_code != 0 || child.output.size() != expected) {
    return {PluginRun::Status::crashed, "the child exited (status " + std::to_string(child.exit_code) +
                                            ") without its output (" + std::to_string(child.output.size()) + " of " +
                                            std::to_string(expected) + " bytes)", {}};
  }
  PluginRun run;
  run.out = Matrix(rows, cols);
  std::memcpy(run.out.values.data(), child.output.data(), expected);
  return run;
}

}  // namespace

const char* plugin_status_name(PluginRun::Status status) {
  switch (status) {
    case PluginRun::Status::ok: return "ok";
    case PluginRun::Status::crashed: return "crashed";
    case PluginRun::Status::hung: return "hung";
    case PluginRun::Status::returned_error: return "returned an error";
  }
  return "?";
}

std::shared_ptr<Plugin> Plugin::open(const std::string& path) {
  std::shared_ptr<Plugin> plugin(new Plugin());
  plugin->path_ = path;
  plugin->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (plugin->handle_ == nullptr) {
    throw InputError(InputProblem::out_of_range, "plugin " + path + " cannot be loaded: " + dlerror());
  }
  auto info_entry = reinterpret_cast<InfoEntry>(dlsym(plugin->handle_, "sharpcheck_plugin_info"));
  if (info_entry == nullptr) {
    throw InputError(InputProblem::out_of_range, "plugin " + path + " does not export sharpcheck_plugin_info");
  }
  const sharpcheck_plugin_description* info = info_entry();
  if (info == nullptr || info->abi_version != SHARPCHECK_PLUGIN_ABI_VERSION) {
    throw InputError(InputProblem::out_of_range,
                     "plugin " + path + " speaks ABI version " + (info ? std::to_string(info->abi_version) : "?") +
                         ", this sharpcheck speaks " + std::to_string(SHARPCHECK_PLUGIN_ABI_VERSION));
  }
  plugin->name_ = info->name != nullptr ? info->name : "unnamed";
  plugin->description_ = info->description != nullptr ? info->description : "";
  for (const auto& [bit, format] : {std::pair{SHARPCHECK_FP32, &fp32}, std::pair{SHARPCHECK_BF16, &bf16},
                                    std::pair{SHARPCHECK_FP16, &fp16}}) {
    if ((info->softmax_formats & bit) != 0) plugin->softmax_formats_.push_back(format);
    if ((info->attention_formats & bit) != 0) plugin->attention_formats_.push_back(format);
  }
  if (!plugin->attention_formats_.empty()) {
    plugin->attention_ = dlsym(plugin->handle_, "sharpcheck_attention");
    if (plugin->attention_ == nullptr) {
      throw InputError(InputProblem::out_of_range,
                       "plugin " + path + " declares attention formats but does not export sharpcheck_attention");
    }
  }
  if (!plugin->softmax_formats_.empty()) {
    plugin->softmax_ = dlsym(plugin->handle_, "sharpcheck_softmax");
    if (plugin->softmax_ == nullptr) {
      throw InputError(InputProblem::out_of_range,
                       "plugin " + path + " declares softmax formats but does not export sharpcheck_softmax");
    }
  }
  return plugin;
}

Plugin::~Plugin() {
  if (handle_ != nullptr) dlclose(handle_);
}

PluginRun Plugin::run_softmax(const FloatFormat& format, const Matrix& logits, float scale,
                              double timeout_seconds) const {
  const auto entry = reinterpret_cast<SoftmaxEntry>(softmax_);
  const ChildOutcome child =
      run_in_child([&] { return call_plugin(entry, format, logits, scale); }, timeout_seconds);
  return interpret(child, logits.values.size(), logits.rows, logits.cols, timeout_seconds, "sharpcheck_softmax");
}

PluginRun Plugin::run_attention(const FloatFormat& format, const Matrix& q, const Matrix& k, const Matrix& v,
                                float scale, bool causal, double timeout_seconds) const {
  const auto entry = reinterpret_cast<AttentionEntry>(attention_);
  const ChildOutcome child =
      run_in_child([&] { return call_attention(entry, format, q, k, v, scale, causal); }, timeout_seconds);
  return interpret(child, q.rows * v.cols, q.rows, v.cols, timeout_seconds, "sharpcheck_attention");
}

}  // namespace sharpcheck::kernels
