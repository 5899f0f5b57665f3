// A kernel plugin (kernels/plugin_abi.h), judged without ever running its code in the caller:
// loading, describing and every call happen in a child process (its own process group) under a
// time and memory limit, so a crash, hang, fork or runaway allocation is reported, not suffered.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/child_process.hpp"
#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/attention_problem.hpp"
#include "tensor/backward_problem.hpp"

namespace sharpcheck::kernels {

struct PluginRun {
  enum class Status { ok, crashed, hung, returned_error, out_of_memory, interrupted };
  Status status = Status::ok;
  std::string detail;  // the signal, the time limit, or the return code
  Matrix out;
  std::string console;  // what the plugin printed (stdout and stderr), kept out of the gate's table
};
[[nodiscard]] const char* plugin_status_name(PluginRun::Status status);

// A tensor of an operation's case as the version-6 entry sharpcheck_op takes it
// (kernels/plugin_abi.h): its name, storage (enum sharpcheck_storage) and shape, and for an input
// its values (values of the storage's format, exactly).
struct PluginTensor {
  std::string name;
  std::uint32_t storage = 0;
  std::vector<std::size_t> shape;
  std::vector<double> values;
};

class Plugin {
 public:
  // Loads and describes the plugin in a child under `limits`. Throws InputError naming the path
  // (cannot be loaded, missing symbols, wrong ABI version, no formats declared), PluginCrash when
  // the plugin's own code crashed, hung or ran out of memory there, Interrupted on a signal.
  static std::shared_ptr<Plugin> open(const std::string& path, const ChildLimits& limits);
  ~Plugin() = default;
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& description() const { return description_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // The formats (fp32, bf16, fp16) it declares a softmax for.
  [[nodiscard]] const std::vector<const FloatFormat*>& softmax_formats() const { return softmax_formats_; }
  [[nodiscard]] const std::vector<const FloatFormat*>& attention_formats() const {
    return attention_formats_;
  }
  // The features it declares (enum sharpcheck_feature of kernels/plugin_abi.h; 0 for ABI version 1).
  [[nodiscard]] std::uint32_t features() const { return features_; }
  // ABI version 6: the operations sharpcheck_op computes (by their names in `sharpcheck ops`) and
  // the formats it computes them in.
  [[nodiscard]] const std::vector<std::string>& operations() const { return operations_; }
  [[nodiscard]] const std::vector<const FloatFormat*>& operation_formats() const {
    return operation_formats_;
  }

  // Runs the plugin's softmax on rows of logits (values of `format`) in a forked child under the
  // limits given to open().
  [[nodiscard]] PluginRun run_softmax(const FloatFormat& format, const Matrix& logits, float scale) const;
  // The same for attention: q (m x d), k (n x d), v (n x dv), values of `format`.
  [[nodiscard]] PluginRun run_attention(const FloatFormat& format, const Matrix& q, const Matrix& k,
                                        const Matrix& v, float scale, bool causal) const;
  // ABI version 3: a whole attention problem (no explicit mask or bias; theta folded into the
  // scale), one sharpcheck_attention_layer call per batch element. `out` is one row: the outputs
  // in the problem's layout, then (with want_lse) the log-sum-exp.
  [[nodiscard]] PluginRun run_attention_layer(const FloatFormat& format,
                                              const tensor::AttentionProblem& problem,
                                              std::span<const double> q, std::span<const double> k,
                                              std::span<const double> v, bool want_lse) const;
  // ABI version 4: one head's attention backward (group 1, ALiBi but no additive bias): `out` is
  // one row of dQ, dK, dV (row-major), D per query, then (with a sink) the sink's gradient. A sink
  // or a log-sum-exp gradient goes through version 5's sharpcheck_attention_backward_lse
  // (InputError if the plugin does not declare it).
  [[nodiscard]] PluginRun run_attention_backward(const FloatFormat& format,
                                                 const tensor::AttentionBackwardProblem& problem) const;
  // ABI version 6: one case of `operation` through sharpcheck_op, its options a JSON object. The
  // outputs are allocated as `outputs` says (their values are ignored) and filled with NaN before
  // the call, so an element the plugin does not write is caught; `out` is one row: every output's
  // values in order, converted exactly to double.
  [[nodiscard]] PluginRun run_operation(const std::string& operation, const FloatFormat& format,
                                        const std::string& options, const std::vector<PluginTensor>& inputs,
                                        const std::vector<PluginTensor>& outputs) const;

 private:
  Plugin() = default;
  ChildLimits limits_;
  std::uint32_t features_ = 0;
  std::string path_, name_, description_;
  std::vector<const FloatFormat*> softmax_formats_;
  std::vector<const FloatFormat*> attention_formats_;
  std::vector<std::string> operations_;
  std::vector<const FloatFormat*> operation_formats_;
};

}  // namespace sharpcheck::kernels
