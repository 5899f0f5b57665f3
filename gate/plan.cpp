// Planning a sweep: every (kernel, input, size) case in a fixed order, then the shard's share.
#include <algorithm>

#include "core/errors.hpp"
#include "gate/attention_scenarios.hpp"
#include "gate/case_inputs.hpp"
#include "gate/cases.hpp"
#include "inputs/attention_backward_cases.hpp"
#include "inputs/attention_escape_cases.hpp"
#include "inputs/rows.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/attention_escape_kernels.hpp"
#include "kernels/plugin_abi.h"
#include "kernels/registry.hpp"
#include "kernels/softmax_backward.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::gate {
namespace {

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::vector<std::size_t> sweep_sizes(const GateSettings& settings) {
  std::vector<std::size_t> sizes;
  for (const std::size_t n : settings.sizes) {
    if (n == 0)
      throw InputError(InputProblem::out_of_range, "gate: --sizes: a row needs at least 1 element, got 0");
    if (std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);  // repeats folded
  }
  if (sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) sizes.push_back(n);
  }
  return sizes;
}

void check_kernel_names(const GateSettings& settings) {
  for (const auto& name : settings.kernels) {
    if (name != "all" && name != "none" && kernels::find_softmax_kernel(name) == nullptr &&
        kernels::find_attention_kernel(name) == nullptr &&
        kernels::find_attention_backward_kernel(name) == nullptr &&
        kernels::find_attention_escape_kernel(name) == nullptr &&
        kernels::find_softmax_backward_kernel(name) == nullptr) {
      throw InputError(InputProblem::out_of_range,
                       "gate: no built-in kernel named '" + name + "' (sharpcheck gate --list shows them)");
    }
  }
}

GateCase make_case(std::string kernel, std::string input, std::size_t n, const GateSettings& settings,
                   bool broken, const FloatFormat* plugin_format) {
  return {.kernel = std::move(kernel),
          .input = std::move(input),
          .n = n,
          .base_seed = settings.seed,
          .deliberately_broken = broken,
          .plugin_format = plugin_format,
          .plugin_path = plugin_format != nullptr ? settings.plugin->path() : std::string()};
}

// The softmax scales and attention variants a plugin's declared features add to its sweep: powers
// of two, so 1/scale and the attention scale 1/sqrt(64)/theta are exact in float.
constexpr double swept_softmax_scales[] = {0.25, 4.0};
constexpr inputs::RowKind scaled_row_kinds[] = {inputs::RowKind::random_normal,
                                                inputs::RowKind::spread_controlled};

void add_feature_cases(const GateSettings& settings, const std::vector<std::size_t>& sizes,
                       const std::string& prefix, std::vector<GateCase>& cases) {
  const std::uint32_t features = settings.plugin->features();
  if ((features & SHARPCHECK_SOFTMAX_SCALE) != 0) {
    for (const FloatFormat* format : settings.plugin->softmax_formats()) {
      for (const double scale : swept_softmax_scales) {
        for (const inputs::RowKind kind : scaled_row_kinds) {
          for (const std::size_t n : sizes) {
            GateCase c = make_case(prefix + std::string(format->name),
                                   std::string(inputs::row_kind_name(kind)), n, settings, false, format);
            c.softmax_scale = scale;
            cases.push_back(c);
          }
        }
      }
    }
  }
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const auto& [theta, causal] : {std::pair{2.0, false}, std::pair{1.0, true}, std::pair{2.0, true}}) {
      if (theta != 1.0 && (features & SHARPCHECK_ATTENTION_SCALE) == 0) continue;
      if (causal && (features & SHARPCHECK_ATTENTION_CAUSAL) == 0) continue;
      for (const std::size_t n : sizes) {
        GateCase c = make_case(prefix + "attention_" + std::string(format->name), attention_input, n,
                               settings, false, format);
        c.attention_theta = theta;
        c.causal = causal;
        cases.push_back(c);
      }
    }
  }
}

// The key count a scenario's case reports as n.
std::size_t scenario_keys(const AttentionScenario& scenario) {
  const tensor::AttentionProblem problem = make_scenario(scenario, 0, fp32).problem;
  return problem.layout == tensor::Layout::packed ? problem.stored_keys() : problem.shape.keys;
}

GateCase scenario_case(std::string kernel, const AttentionScenario& scenario, const GateSettings& settings,
                       const FloatFormat* plugin_format, bool broken = false) {
  GateCase c = make_case(std::move(kernel), "attention_" + std::string(scenario.name),
                         scenario_keys(scenario), settings, broken, plugin_format);
  c.scenario = std::string(scenario.name);
  return c;
}

// A plugin that declares version-3 attention features runs every scenario whose features it
// declares (and that the ABI can express).
void add_scenario_cases(const GateSettings& settings, const std::string& prefix,
                        std::vector<GateCase>& cases) {
  const std::uint32_t features = settings.plugin->features();
  if ((features & ~7U) == 0) return;
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const auto& scenario : attention_scenarios()) {
      if (!scenario.plugin_callable ||
          (scenario.plugin_features & ~features & ~SHARPCHECK_ATTENTION_LSE) != 0)
        continue;
      cases.push_back(
          scenario_case(prefix + "attention_" + std::string(format->name), scenario, settings, format));
    }
  }
}

// The attention backward sweep (inputs/attention_backward_cases.hpp) on every backward kernel
// wanted; n is the problem's number of keys.
template <typename Wanted>
void add_backward_cases(const Wanted& wanted, const GateSettings& settings, std::vector<GateCase>& cases) {
  // Softmax-level backward kernels: every row kind at three sizes (their reference costs more than
  // the forward's, so not the whole sweep of sizes), each case with a fully masked second row.
  for (const auto& kernel : kernels::softmax_backward_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : {std::size_t{16}, std::size_t{256}, std::size_t{4096}}) {
        cases.push_back(make_case(std::string(kernel.name), std::string(inputs::row_kind_name(kind)), n,
                                  settings, kernel.deliberately_broken, nullptr));
      }
    }
  }
  for (const auto& kernel : kernels::attention_escape_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const inputs::EscapeKind kind : inputs::all_escape_kinds) {
      if (inputs::escape_kind_operation(kind) != kernel.operation) continue;
      cases.push_back(make_case(std::string(kernel.name), std::string(inputs::escape_kind_name(kind)),
                                inputs::escape_kind_keys(kind), settings, kernel.deliberately_broken,
                                nullptr));
    }
  }
  for (const auto& kernel : kernels::attention_backward_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
      const std::size_t keys = inputs::backward_shape(kind).keys;
      cases.push_back(
          make_case(std::string(kernel.name),
                    std::string(backward_input_prefix) + std::string(inputs::backward_kind_name(kind)), keys,
                    settings, kernel.deliberately_broken, nullptr));
    }
  }
}

// A plugin that declares the backward (ABI version 4) runs the backward sweep's problems whose
// masks and modifiers it declares; the sink with a log-sum-exp gradient needs version 5's entry.
void add_plugin_backward_cases(const GateSettings& settings, const std::string& prefix,
                               std::vector<GateCase>& cases) {
  const std::uint32_t features = settings.plugin->features();
  if ((features & SHARPCHECK_ATTENTION_BACKWARD) == 0) return;
  const auto needs = [](inputs::BackwardKind kind) -> std::uint32_t {
    switch (kind) {
      case inputs::BackwardKind::normal_causal:
        return SHARPCHECK_ATTENTION_CAUSAL;
      case inputs::BackwardKind::near_softcap:
        return SHARPCHECK_ATTENTION_SOFTCAP;
      case inputs::BackwardKind::fully_masked_rows:
        return SHARPCHECK_ATTENTION_CAUSAL | SHARPCHECK_ATTENTION_BOTTOM_RIGHT;
      case inputs::BackwardKind::sink_and_lse:
        return SHARPCHECK_ATTENTION_SINK | SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK;
      case inputs::BackwardKind::alibi_window:
        return SHARPCHECK_ATTENTION_ALIBI | SHARPCHECK_ATTENTION_WINDOW | SHARPCHECK_ATTENTION_BOTTOM_RIGHT;
      default:
        return 0;
    }
  };
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
      if ((needs(kind) & ~features) != 0) continue;
      const std::size_t keys = inputs::backward_shape(kind).keys;
      cases.push_back(
          make_case(prefix + "attention_backward_" + std::string(format->name),
                    std::string(backward_input_prefix) + std::string(inputs::backward_kind_name(kind)), keys,
                    settings, false, format));
    }
  }
}

// Every case of the unsharded sweep, in sweep order.
std::vector<GateCase> all_cases(const GateSettings& settings, const std::vector<std::size_t>& sizes) {
  const auto wanted = [&](std::string_view name) {
    return std::any_of(settings.kernels.begin(), settings.kernels.end(),
                       [&](const std::string& k) { return k == "all" || k == name; });
  };
  std::vector<GateCase> cases;
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : sizes) {
        cases.push_back(make_case(std::string(kernel.name), std::string(inputs::row_kind_name(kind)), n,
                                  settings, kernel.deliberately_broken, nullptr));
      }
    }
  }
  for (const auto& kernel : kernels::attention_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const std::size_t n : sizes) {
      cases.push_back(make_case(std::string(kernel.name), attention_input, n, settings,
                                kernel.deliberately_broken, nullptr));
    }
    for (const auto& scenario : attention_scenarios())
      cases.push_back(
          scenario_case(std::string(kernel.name), scenario, settings, nullptr, kernel.deliberately_broken));
  }
  add_backward_cases(wanted, settings, cases);
  if (!settings.plugin) return cases;
  const std::string prefix = "plugin:" + settings.plugin->name() + ":";
  for (const FloatFormat* format : settings.plugin->softmax_formats()) {
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : sizes) {
        cases.push_back(make_case(prefix + std::string(format->name),
                                  std::string(inputs::row_kind_name(kind)), n, settings, false, format));
      }
    }
  }
  for (const FloatFormat* format : settings.plugin->attention_formats()) {
    for (const std::size_t n : sizes) {
      cases.push_back(make_case(prefix + "attention_" + std::string(format->name), attention_input, n,
                                settings, false, format));
    }
  }
  add_feature_cases(settings, sizes, prefix, cases);
  add_scenario_cases(settings, prefix, cases);
  add_plugin_backward_cases(settings, prefix, cases);
  return cases;
}

}  // namespace

std::string GateCase::id() const {
  std::string modifiers;
  if (softmax_scale != 1) modifiers += "/scale=" + std::string(softmax_scale < 1 ? "0.25" : "4");
  if (attention_theta != 1) modifiers += "/theta=2";
  if (causal) modifiers += "/causal";
  return kernel + "/" + input + modifiers + "/n=" + std::to_string(n);
}

std::vector<GateCase> plan_cases(const GateSettings& settings) {
  check_kernel_names(settings);
  (void)metrics::tolerance_for(settings.plugin_attention_model);  // an unknown model is an input error now
  std::vector<GateCase> cases = all_cases(settings, sweep_sizes(settings));
  std::vector<GateCase> selected;
  for (std::size_t index = 0; index < cases.size(); ++index) {
    GateCase& gate_case = cases[index];
    gate_case.seed = settings.seed ^ fnv1a(gate_case.id());
    gate_case.index = index;
    if (!settings.only_case.empty() && gate_case.id() != settings.only_case) continue;
    if (index % settings.shard_count != settings.shard_index) continue;
    selected.push_back(gate_case);
  }
  if (!settings.only_case.empty() && selected.empty()) {
    throw InputError(InputProblem::out_of_range,
                     "gate: no case with id '" + settings.only_case + "' in this sweep");
  }
  if (selected.empty()) {
    throw InputError(InputProblem::empty_input,
                     cases.empty()
                         ? "gate: the sweep has no cases (no kernel selected, or a plugin without formats)"
                         : "gate: shard " + std::to_string(settings.shard_index) + "/" +
                               std::to_string(settings.shard_count) + " of " + std::to_string(cases.size()) +
                               " cases is empty");
  }
  return selected;
}

}  // namespace sharpcheck::gate
