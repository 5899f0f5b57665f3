// The operation record's shared parts: the common options, and reading key=value pairs through an
// operation's schema (the one option parser `compare --op` and Python's sharpcheck.judge share).
#include "gate/operation.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/errors.hpp"
#include "gate/array_checks.hpp"
#include "reference/attention_backward.hpp"

namespace sharpcheck::gate {
namespace {

[[noreturn]] void refuse_option(const Operation& operation, const std::string& key, const std::string& why) {
  throw InputError(InputProblem::out_of_range, std::string(operation.name) + ": " + key + " " + why);
}

bool is_integer_text(const std::string& text) {
  const std::size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
  return text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos &&
         text.size() - digits <= 18;  // fits a long long
}

bool is_real_text(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value) && errno != ERANGE;
}

bool is_count_list_text(const std::string& text) {
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    if (item.empty() || item[0] == '-' || !is_integer_text(item)) return false;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

// Checks `value` against the kind; a flag's value is normalised to "true" or "false".
std::string checked_value(const Operation& operation, const OptionSpec& option, const std::string& key,
                          const std::string& value) {
  switch (option.kind) {
    case OptionKind::flag:
      if (value == "true" || value == "1" || value == "True") return "true";
      if (value == "false" || value == "0" || value == "False") return "false";
      refuse_option(operation, key, "is a flag: true or false, got '" + value + "'");
    case OptionKind::integer:
      if (!is_integer_text(value)) refuse_option(operation, key, "wants an integer, got '" + value + "'");
      return value;
    case OptionKind::real:
      if (!is_real_text(value)) refuse_option(operation, key, "wants a finite real, got '" + value + "'");
      return value;
    case OptionKind::count_list:
      if (!value.empty() && !is_count_list_text(value))
        refuse_option(operation, key, "wants counts like 3,5,7, got '" + value + "'");
      return value;
    case OptionKind::text:
      return value;
  }
  return value;
}

std::vector<std::size_t> counts_of(const std::string& value) {
  std::vector<std::size_t> counts;
  std::size_t start = 0;
  while (!value.empty()) {
    const std::size_t comma = value.find(',', start);
    counts.push_back(std::stoull(value.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

constexpr OptionSpec common_option_table[] = {
    {.name = "format",
     .kind = OptionKind::text,
     .default_text = "fp32",
     .meaning = "the judged tensors' format: fp64, fp32, tf32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, uint8",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.format = stored_format(v).name; }},
    {.name = "input_format",
     .kind = OptionKind::text,
     .default_text = "format",
     .meaning = "how bit patterns in the inputs are read",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.input_format = stored_format(v).name; }},
    {.name = "tolerance",
     .kind = OptionKind::text,
     .default_text = "the operation's",
     .meaning = "the precision recipe or tolerance entry to judge by",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.tolerance_entry = v; }},
    {.name = "name",
     .kind = OptionKind::text,
     .default_text = "compare:<judged tensor>",
     .meaning = "the kernel's name in reports, budgets and baselines",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.name = v; }},
    {.name = "proven_only",
     .kind = OptionKind::flag,
     .default_text = "false",
     .meaning = "judge by the proven worst-case tier alone",
     .apply =
         [](OpOptions& o, const std::string& v) {
           o.judge.strictest = v == "true" ? metrics::Tier::proven : metrics::Tier::statistical;
         }},
    {.name = "threads",
     .kind = OptionKind::integer,
     .default_text = "0",
     .meaning = "worker threads (0: every core)",
     .apply =
         [](OpOptions& o, const std::string& v) {
           const long long threads = std::stoll(v);
           if (threads < 0 || threads > 1024)
             throw InputError(InputProblem::out_of_range, "threads wants 0 to 1024, got " + v);
           o.judge.threads = static_cast<unsigned>(threads);
         }},
};

const OptionSpec* find_option(std::span<const OptionSpec> options, std::string_view key) {
  const auto found =
      std::find_if(options.begin(), options.end(), [&](const auto& o) { return o.name == key; });
  return found == options.end() ? nullptr : &*found;
}

std::string accepted_keys(const Operation& operation) {
  std::string keys;
  for (const auto& tensor : operation.tensors) keys += (keys.empty() ? "" : ", ") + std::string(tensor.name);
  for (const auto& option : operation.options) keys += ", " + std::string(option.name);
  for (const auto& option : common_options()) keys += ", " + std::string(option.name);
  return keys;
}

}  // namespace

std::string_view tensor_role_name(TensorRole role) {
  switch (role) {
    case TensorRole::input:
      return "input";
    case TensorRole::optional_input:
      return "optional input";
    case TensorRole::judged:
      return "judged";
    case TensorRole::optional_judged:
      return "optional judged";
  }
  return "?";
}

std::string_view option_kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::flag:
      return "flag";
    case OptionKind::integer:
      return "integer";
    case OptionKind::real:
      return "real";
    case OptionKind::text:
      return "text";
    case OptionKind::count_list:
      return "counts";
  }
  return "?";
}

std::span<const OptionSpec> common_options() { return common_option_table; }

StoredFormat tensor_format(const TensorSpec& tensor, const OpOptions& options) {
  const JudgeOptions& judge = options.judge;
  if (tensor.format == "format") return stored_format(judge.format);
  if (tensor.format == "input_format")
    return stored_format(judge.input_format.empty() ? judge.format : judge.input_format);
  if (tensor.format == "lse_format") return stored_format(judge.lse_format);
  if (tensor.format == "d_format")  // the backward's D: fp32 under a narrower target, else the target
    return stored_format(std::string(reference::d_format(*stored_format(judge.format).format).name));
  return stored_format(std::string(tensor.format));
}

const Array* OpCall::find(std::string_view name) const {
  const auto found = tensors.find(name);
  return found == tensors.end() ? nullptr : found->second;
}

const Array& OpCall::at(std::string_view name) const {
  const Array* array = find(name);
  if (array == nullptr)
    throw InputError(InputProblem::empty_input, "the tensor '" + std::string(name) + "' is required");
  return *array;
}

bool PlanContext::wanted(std::string_view kernel) const {
  return std::any_of(settings.kernels.begin(), settings.kernels.end(),
                     [&](const std::string& k) { return k == "all" || k == kernel; });
}

ParsedCall parse_op_arguments(const Operation& operation,
                              const std::vector<std::pair<std::string, std::string>>& pairs) {
  ParsedCall call;
  std::vector<std::string> seen;
  for (const auto& [key, value] : pairs) {
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      refuse_option(operation, key, "is given twice");
    seen.push_back(key);
    const auto tensor = std::find_if(operation.tensors.begin(), operation.tensors.end(),
                                     [&](const TensorSpec& t) { return t.name == key; });
    if (tensor != operation.tensors.end()) {
      call.tensors.emplace(key, value);
      continue;
    }
    const OptionSpec* option = find_option(operation.options, key);
    if (option == nullptr) option = find_option(common_options(), key);
    if (option == nullptr)
      refuse_option(operation, key,
                    "is neither a tensor nor an option of it; it takes " + accepted_keys(operation));
    option->apply(call.options, checked_value(operation, *option, key, value));
  }
  for (const auto& tensor : operation.tensors) {
    const bool required = tensor.role == TensorRole::input || tensor.role == TensorRole::judged;
    if (required && !call.tensors.contains(tensor.name))
      throw InputError(InputProblem::empty_input, std::string(operation.name) + ": the tensor '" +
                                                      std::string(tensor.name) + "' (" +
                                                      std::string(tensor.meaning) + ") is required");
  }
  return call;
}

std::vector<std::size_t> option_counts(const std::string& value) { return counts_of(value); }

const Operation& find_operation(std::span<const Operation* const> operations, std::string_view name) {
  std::string names;
  for (const Operation* operation : operations) {
    if (operation->name == name) return *operation;
    names += (names.empty() ? "" : ", ") + std::string(operation->name);
  }
  throw InputError(InputProblem::out_of_range, "no operation named '" + std::string(name) +
                                                   "' (sharpcheck ops lists them: " + names + ")");
}

nlohmann::json describe_operation(const Operation& operation) {
  nlohmann::json tensors = nlohmann::json::array(), options = nlohmann::json::array(),
                 kernels = nlohmann::json::array(), judged_from = nlohmann::json::array();
  for (const TensorSpec& t : operation.tensors) {
    tensors.push_back({{"name", t.name},
                       {"role", tensor_role_name(t.role)},
                       {"shape", t.shape},
                       {"format", t.format},
                       {"meaning", t.meaning}});
  }
  for (const auto& table : {operation.options, common_options()}) {
    for (const OptionSpec& o : table) {
      options.push_back({{"name", o.name},
                         {"kind", option_kind_name(o.kind)},
                         {"default", o.default_text},
                         {"meaning", o.meaning}});
    }
  }
  for (const KernelRow& k : operation.kernels()) {
    kernels.push_back({{"name", k.name},
                       {"input", k.input},
                       {"output", k.output},
                       {"accumulation", k.accumulation},
                       {"description", k.description},
                       {"deliberately_broken", k.deliberately_broken}});
  }
  if (operation.plan_builtin != nullptr || operation.plan_plugin != nullptr) judged_from.push_back("gate");
  if (operation.judge != nullptr) {
    judged_from.push_back("compare");
    judged_from.push_back("python");
  }
  return {{"name", operation.name},
          {"summary", operation.summary},
          {"tensors", tensors},
          {"options", options},
          {"allowance", operation.allowance},
          {"kernels", kernels},
          {"plugin_entry", operation.plugin_entry},
          {"judged_from", judged_from}};
}

std::string reported_kernel_name(const OpOptions& options, const Array& judged) {
  return kernel_name(options.judge, judged);
}

}  // namespace sharpcheck::gate
