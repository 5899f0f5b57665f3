// The attention problems the gate sweeps beyond plain single-head attention: the grid kernel
// ports are tested against (FlashAttention's and cuDNN's test grids, PyTorch's SDPA tests):
// causal bottom-right on uneven lengths, sliding windows, MQA and GQA, soft-capping, ALiBi (and
// both at once),
// sinks, key padding, packed variable lengths, additive masks, a KV-cache decode row, odd head
// dimensions and head dimensions to 256. Each is generated from the case's seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::gate {

// The scenario's problem and tensors (Q, K, V normal, rounded to `format`). The problem's
// scale is float(1/sqrt(d)) given explicitly, so a kernel that rounds its scale to fp32 and the
// reference compute the same function; its bias, when any, lives in `bias`.
struct ScenarioInputs {
  tensor::AttentionProblem problem;
  std::vector<double> q, k, v;
  std::vector<double> bias;
};

// One problem of the sweep, as data: its name, what a plugin must declare to be swept on it, and
// how its problem and tensors are made (no code branches on a scenario's name).
struct AttentionScenario {
  std::string_view name;
  std::uint32_t plugin_features = 0;  // enum sharpcheck_feature bits a plugin must declare to be swept on it
  bool plugin_callable = true;        // expressible in the plugin ABI (no explicit mask or bias tensor)
  // Every output known exactly (V constant, Q zero): a plugin's sweep has its own at its sizes.
  bool exact_probe = false;
  void (*problem)(tensor::AttentionProblem&) = nullptr;  // shape, mask and options
  // The tensors once drawn: a bias, a constant V, a planted key (nullptr: as drawn).
  void (*tensors)(ScenarioInputs&, const FloatFormat&) = nullptr;
};

[[nodiscard]] std::span<const AttentionScenario> attention_scenarios();
[[nodiscard]] const AttentionScenario* find_attention_scenario(std::string_view name);

[[nodiscard]] ScenarioInputs make_scenario(const AttentionScenario& scenario, std::uint64_t seed,
                                           const FloatFormat& format);

// The scenario's problem alone, no tensor drawn (a bias, when any, comes with the tensors), and the
// key count its cases report as n: what planning a case needs.
[[nodiscard]] tensor::AttentionProblem scenario_problem(const AttentionScenario& scenario);
[[nodiscard]] std::size_t scenario_keys(const AttentionScenario& scenario);

}  // namespace sharpcheck::gate
