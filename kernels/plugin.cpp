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
  const std::size_t expected = logits.values.size() * sizeof(double);
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
    return {PluginRun::Status::returned_error, "sharpcheck_softmax returned " + std::to_string(child.exit_code - 10), {}};
  }
  if (child.exit_code != 0 || child.output.size() != expected) {
    return {PluginRun::Status::crashed, "the child exited (status " + std::to_string(child.exit_code) +
                                            ") without its output (" + std::to_string(child.output.size()) + " of " +
                                            std::to_string(expected) + " bytes)", {}};
  }
  PluginRun run;
  run.out = Matrix(logits.rows, logits.cols);
  std::memcpy(run.out.values.data(), child.output.data(), expected);
  return run;
}

}  // namespace sharpcheck::kernels
