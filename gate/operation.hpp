// What an operation is to sharpcheck: one record (an OpSpec, like PyTorch's OpInfo or a benchdnn
// driver) that every front end and the gate read. It names the tensors the operation takes and
// returns, its option schema, its built-in kernels, how the gate plans and runs its cases, and how
// arrays computed elsewhere are judged. Each operation's record lives in its folder under ops/ and
// the registry (ops/registry.hpp) lists them, one line each; nothing here or in the front ends
// branches on an operation's or a kernel's name.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gate/cases.hpp"
#include "gate/invariance.hpp"
#include "gate/judge_arrays.hpp"

namespace sharpcheck::gate {

// What a tensor is to the operation: something its result is computed from, what the kernel under
// test produced (judged), or either of those when the user may leave it out.
enum class TensorRole { input, optional_input, judged, optional_judged };
[[nodiscard]] std::string_view tensor_role_name(TensorRole role);

struct TensorSpec {
  std::string_view name;  // the key in `compare --op`, in Python's keywords and in messages
  TensorRole role = TensorRole::input;
  std::string_view shape;  // e.g. "[B, H, S, D] in the layout, or [S, D]"
  std::string_view meaning;
  // Which format its stored numbers are read in: the option named ("input_format", which falls
  // back to "format"; "format"; "lse_format"; "d_format", the backward's D: fp32 under a narrower
  // format, else the format) or a fixed format ("fp32", "fp64").
  std::string_view format = "input_format";
};

// Every option an operation's judgement reads, in one struct: the array judge's options, and the
// few that belong to one operation alone.
struct OpOptions {
  JudgeOptions judge;
  double lambda = 0;                         // Differential attention's weight of the second softmax
  bool merge_any_infinity_is_empty = false;  // attention_merge: +inf marks an empty partial too (vLLM)
};

enum class OptionKind { flag, integer, real, text, count_list };
[[nodiscard]] std::string_view option_kind_name(OptionKind kind);

// One option of the schema. `apply` receives the value already checked against `kind` (a flag's
// "true"/"false", a number's text) and sets it; it throws InputError for a value the kind admits
// but the option does not (an unknown format, say).
struct OptionSpec {
  std::string_view name;
  OptionKind kind = OptionKind::text;
  std::string_view default_text;  // what applies when the option is not given
  std::string_view meaning;
  void (*apply)(OpOptions& options, const std::string& value) = nullptr;
};

// A built-in kernel as `gate --list` and `sharpcheck ops` show it.
struct KernelRow {
  std::string_view name, input, output, accumulation, description;
  bool deliberately_broken = false;
};

// What a front end hands an operation's judge: the arrays by tensor name, and the options.
struct OpCall {
  std::map<std::string, const Array*, std::less<>> tensors;
  OpOptions options;
  // The array of a tensor, or null when it was not given (optional tensors only: the front end
  // checked that every required one is there).
  [[nodiscard]] const Array* find(std::string_view name) const;
  [[nodiscard]] const Array& at(std::string_view name) const;
};

// The rows of a kernel registry that `keep` selects, as `gate --list` and `sharpcheck ops` show
// them: a registry row names its input, output and accumulation formats, or one `format` for its
// tensors with the arithmetic in fp32.
template <typename Kernels, typename Keep>
[[nodiscard]] std::vector<KernelRow> kernel_rows_of(const Kernels& kernels, Keep keep) {
  std::vector<KernelRow> rows;
  for (const auto& k : kernels) {
    if (!keep(k)) continue;
    if constexpr (requires { k.format; }) {
      rows.push_back({.name = k.name,
                      .input = k.format->name,
                      .output = k.format->name,
                      .accumulation = "fp32",
                      .description = k.description,
                      .deliberately_broken = k.deliberately_broken});
    } else {
      rows.push_back({.name = k.name,
                      .input = k.input->name,
                      .output = k.output->name,
                      .accumulation = k.accumulation->name,
                      .description = k.description,
                      .deliberately_broken = k.deliberately_broken});
    }
  }
  return rows;
}

// A case of the gate's sweep handed to a kernel the gate cannot call itself (a Python callable,
// sharpcheck.cases and sharpcheck.sweep): its id in the gate's form (kernel "python:<op>:<format>"),
// the operation's input tensors by their names (values already in the format) and its options by
// their names as JSON values, exactly what the operation's judge takes beside the kernel's results.
struct ExternalTensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<double> values;
  // The format it is handed over in when not the case's: "fp64" for per-head values (sinks,
  // slopes), "fp32" for the partial LSEs of a merge (kernels keep them in fp32).
  std::string_view stored_as = {};
  // An output a kernel may leave out (attention's LSE): a Python kernel by not returning it, a
  // plugin by leaving its buffer as the gate filled it (NaN throughout). It is judged when given;
  // when not, the record's notes say it was not judged.
  bool optional = false;
  [[nodiscard]] std::size_t elements() const {
    std::size_t count = 1;
    for (const std::size_t extent : shape) count *= extent;
    return count;
  }
};
// One call of a batch-invariance case's reruns: its tensors, options and output shapes.
struct ExternalCall {
  std::vector<ExternalTensor> tensors;
  nlohmann::json options = nlohmann::json::object();
  std::vector<ExternalTensor> outputs;
};
struct ExternalCase {
  std::string id;
  std::vector<ExternalTensor> tensors;
  nlohmann::json options = nlohmann::json::object();
  // Options the judge reads but the kernel is not given (how fully masked rows are judged).
  nlohmann::json judge_options = nlohmann::json::object();
  // What a kernel must declare (sharpcheck.sweep's features=) to be swept on this case: the
  // options it passes beyond the plain problem ("causal", "align", "window", "softcap", "theta",
  // "key_lengths", "cu_seqlens") and the tensors ("sinks", "alibi_slopes"), and "gqa" for fewer KV
  // heads than query heads.
  std::vector<std::string> needs;
  // The judged tensors a kernel returns (names and shapes; values empty), for a plugin's
  // version-6 entry, which fills buffers the gate allocates. Empty: the case cannot be run there.
  std::vector<ExternalTensor> outputs;
  // A batch-invariance case (gate/invariance.hpp): the same requests called again, regrouped;
  // reruns[i] is the call invariance.reruns[i] describes. Empty for a plain case.
  InvariancePlan invariance;
  std::vector<ExternalCall> reruns;
};
struct ExternalSweep {
  const FloatFormat* format = nullptr;
  std::vector<std::size_t> sizes;  // as the gate's --sizes (default: 16 to 16,384)
  std::uint64_t seed = 0;          // the gate's --seed; each case mixes in its id, as the gate does
  // When set, only the case of this id is wanted: an operation may skip building the others (a
  // hint that saves work, not a filter every operation applies).
  std::string only_id;
};

// Everything planning needs: the settings and the sweep's sizes, and whether a kernel is wanted.
struct PlanContext {
  const GateSettings& settings;
  const std::vector<std::size_t>& sizes;
  [[nodiscard]] bool wanted(std::string_view kernel) const;
};

struct Operation {
  std::string_view name;
  std::string_view summary;  // one line: what it computes
  std::span<const TensorSpec> tensors;
  std::span<const OptionSpec> options;  // its own; the common ones (common_options) apply too
  std::string_view allowance;           // how its verdicts are derived: recipes or tolerance entries
  std::string_view plugin_entry;        // the plugin ABI's entry that runs it; empty: none yet
  std::vector<KernelRow> (*kernels)() = nullptr;
  // The gate: adds its cases for the wanted built-in kernels, then (a plugin given) the plugin's.
  void (*plan_builtin)(const PlanContext& context, std::vector<GateCase>& cases) = nullptr;
  void (*plan_plugin)(const PlanContext& context, std::vector<GateCase>& cases) = nullptr;
  // Runs and judges one of its cases (gate_case.operation is this operation's name).
  void (*run)(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) = nullptr;
  // Judges arrays computed elsewhere; InputError naming the tensor and element for bad arrays.
  CaseOutcome (*judge)(const OpCall& call) = nullptr;
  // The sweep's cases for a kernel outside the gate (the generators and id form of a plugin's
  // cases; the kernel part of the id, python:<op>:<format>, seeds them); null: none yet.
  std::vector<ExternalCase> (*external_cases)(const ExternalSweep& sweep) = nullptr;
};

// The format a tensor's stored numbers are read in (TensorSpec::format) under these options.
[[nodiscard]] StoredFormat tensor_format(const TensorSpec& tensor, const OpOptions& options);

// The options every operation takes: format, input_format, tolerance, name, proven_only, threads.
[[nodiscard]] std::span<const OptionSpec> common_options();

// `key=value` pairs (compare --op, Python's keywords as text) read through the operation's schema:
// every key is one of its tensors (the value a path or a Python array's name, returned in
// `tensors`) or an option (checked against its kind and applied). InputError naming the operation
// and the key for an unknown key, a value of the wrong kind, a repeated key, or a required tensor
// missing.
struct ParsedCall {
  std::map<std::string, std::string, std::less<>> tensors;
  OpOptions options;
};
[[nodiscard]] ParsedCall parse_op_arguments(const Operation& operation,
                                            const std::vector<std::pair<std::string, std::string>>& pairs);

// A count_list option's value ("3,5,7"; already checked) as numbers.
[[nodiscard]] std::vector<std::size_t> option_counts(const std::string& value);

// The operation named, or InputError listing the names in `operations`.
[[nodiscard]] const Operation& find_operation(std::span<const Operation* const> operations,
                                              std::string_view name);

// What `sharpcheck ops --json` and Python's sharpcheck.ops() return for an operation: its name,
// summary, tensors (name, role, shape, format, meaning), options (its own and the common ones:
// name, kind, default, meaning), allowance, built-in kernels, plugin entry, and where it can be
// judged ("gate", "compare", "python").
[[nodiscard]] nlohmann::json describe_operation(const Operation& operation);

// The kernel's name in reports when the front end gave none: "compare:" + the judged array's name.
[[nodiscard]] std::string reported_kernel_name(const OpOptions& options, const Array& judged);

}  // namespace sharpcheck::gate
