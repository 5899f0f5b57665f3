// Loads a kernel plugin (kernels/plugin_abi.h) and runs its softmax in a child process with a
// time limit, so that a crash or a hang is reported, not suffered.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::kernels {

struct PluginRun {
  enum class Status { ok, crashed, hung, returned_error };
  Status status = Status::ok;
  std::string detail;  // the signal, the time limit, or the return code
  Matrix out;
};
[[nodiscard]] const char* plugin_status_name(PluginRun::Status status);

class Plugin {
 public:
  // Throws InputError naming the path: cannot be loaded, missing symbols, wrong ABI version.
  static std::shared_ptr<Plugin> open(const std::string& path);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& description() const { return description_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // The formats (fp32, bf16, fp16) it declares a softmax for.
  [[nodiscard]] const std::vector<const FloatFormat*>& softmax_formats() const { return softmax_formats_; }
  [[nodiscard]] const std::vector<const FloatFormat*>& attention_formats() const { return attention_formats_; }

  // Runs the plugin's softmax on rows of logits (values of `format`) in a forked child; waits at
  // most timeout_seconds.
  [[nodiscard]] PluginRun run_softmax(const FloatFormat& format, const Matrix& logits, float scale,
                                      double timeout_seconds) const;
  // The same for attention: q (m x d), k (n x d), v (n x dv), values of `format`.
  [[nodiscard]] PluginRun run_attention(const FloatFormat& format, const Matrix& q, const Matrix& k, const Matrix& v,
                                        float scale, bool causal, double timeout_seconds) const;

 private:
  Plugin() = default;
  void* handle_ = nullptr;
  void* softmax_ = nullptr;
  void* attention_ = nullptr;
  std::string path_, name_, description_;
  std::vector<const FloatFormat*> softmax_formats_;
  std::vector<const FloatFormat*> attention_formats_;
};

}  // namespace sharpcheck::kernels
