#include "ops/attention_merge/merge_kernels.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "gate/plugin_operations.hpp"
#include "ops/attention_merge/attention_merge_op.hpp"

namespace sharpcheck::ops::merge {
namespace {

constexpr Kernel all_kernels[] = {
    {"merge_states_bf16", "split-KV combine in fp32 (max, exp(lse - max), weighted sum), out in bf16"},
    {"merge_states_bf16_nan_when_all_empty", "no guard for a token with no partial: NaN there",
     Bug::nan_when_all_empty, true},
    {"merge_states_bf16_max_for_lse", "merged LSE = the largest partial LSE", Bug::max_for_lse, true},
    {"merge_states_bf16_wrong_lse_slot", "head h weighted by head h + 1's LSE", Bug::wrong_lse_slot, true},
    {"merge_states_bf16_fixed_max", "exp(lse) with no max subtracted (overflows at large LSEs)",
     Bug::fixed_max, true},
    {"merge_states_bf16_lse_in_bf16", "merged LSE stored in bf16 (the output's dtype), not fp32",
     Bug::lse_in_bf16, true},
    {"merge_states_bf16_sum_in_bf16", "the weights' sum accumulated in bf16", Bug::sum_in_bf16, true},
};

const gate::ExternalTensor& tensor_named(const std::vector<gate::ExternalTensor>& tensors,
                                         std::string_view name) {
  for (const gate::ExternalTensor& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::logic_error("a merge case without " + std::string(name));
}

// One token and head: the merged output (dim values) and LSE, in fp32 as the kernels compute.
struct Merged {
  std::vector<float> out;
  float lse = 0;
};

Merged merge_one(const Kernel& kernel, const gate::ExternalTensor& outs, const gate::ExternalTensor& lses,
                 std::size_t t, std::size_t h) {
  const std::size_t splits = outs.shape[1], heads = outs.shape[2], dim = outs.shape[3];
  const std::size_t lse_head = kernel.bug == Bug::wrong_lse_slot ? (h + 1) % heads : h;
  const auto lse_of = [&](std::size_t s) {
    return static_cast<float>(lses.values[(t * splits + s) * heads + lse_head]);
  };
  float top = -std::numeric_limits<float>::infinity();
  for (std::size_t s = 0; s < splits; ++s) top = std::max(top, lse_of(s));
  Merged merged{std::vector<float>(dim, 0.0F), -std::numeric_limits<float>::infinity()};
  if (top == -std::numeric_limits<float>::infinity() && kernel.bug != Bug::nan_when_all_empty) return merged;
  const float shift = kernel.bug == Bug::fixed_max ? 0.0F : top;
  float sum = 0;
  for (std::size_t s = 0; s < splits; ++s) {
    const float lse = lse_of(s);
    // An empty partial is skipped, not weighted by 0 (its output may be NaN); the twin with no guard
    // for an all-empty token still skips, and its NaN comes from exp(-inf - -inf).
    if (lse == -std::numeric_limits<float>::infinity() && top != lse) continue;
    const float weight = std::exp(lse - shift);
    sum += weight;
    if (kernel.bug == Bug::sum_in_bf16) sum = static_cast<float>(round_to_format(sum, bf16));
    const double* o = &outs.values[((t * splits + s) * heads + h) * dim];
    for (std::size_t d = 0; d < dim; ++d) merged.out[d] += weight * static_cast<float>(o[d]);
  }
  for (float& x : merged.out) x /= sum;
  merged.lse = kernel.bug == Bug::max_for_lse ? top : shift + std::log(sum);
  return merged;
}

}  // namespace

std::span<const Kernel> kernels() { return all_kernels; }

const Kernel* find_kernel(std::string_view name) {
  for (const Kernel& k : all_kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<double> run(const Kernel& kernel, const gate::ExternalCase& c, const FloatFormat& format) {
  const gate::ExternalTensor& outs = tensor_named(c.tensors, "partial_out");
  const gate::ExternalTensor& lses = tensor_named(c.tensors, "partial_lse");
  const std::size_t tokens = outs.shape[0], heads = outs.shape[2], dim = outs.shape[3];
  std::vector<double> out(tokens * heads * dim), lse(tokens * heads);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      const Merged merged = merge_one(kernel, outs, lses, t, h);
      for (std::size_t d = 0; d < dim; ++d)
        out[(t * heads + h) * dim + d] = round_to_format(merged.out[d], format);
      lse[t * heads + h] = kernel.bug == Bug::lse_in_bf16 ? round_to_format(merged.lse, bf16) : merged.lse;
    }
  }
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

std::vector<gate::KernelRow> kernel_rows() {
  return gate::kernel_rows_of(all_kernels, [](const Kernel&) { return true; });
}

void plan_builtin(const gate::PlanContext& context, std::vector<gate::GateCase>& cases) {
  const auto merge_cases = gate::external_cases_of(attention_merge_operation, bf16, context.settings);
  for (const Kernel& kernel : all_kernels) {
    if (!context.wanted(kernel.name)) continue;
    for (const gate::ExternalCase& c : *merge_cases)
      cases.push_back(gate::external_gate_case(c, std::string(kernel.name), context.settings,
                                               kernel.deliberately_broken, nullptr));
  }
}

void run_case(const gate::GateCase& gate_case, const gate::GateSettings& settings,
              gate::CaseOutcome& outcome) {
  const Kernel& kernel = *find_kernel(gate_case.kernel);
  const auto merge_cases = gate::external_cases_of(attention_merge_operation, bf16, settings);
  const gate::ExternalCase& c = gate::find_external_case(*merge_cases, gate_case);
  outcome.format = "bf16";
  gate::judge_external_outputs(attention_merge_operation, c, bf16, run(kernel, c, bf16), gate_case.kernel,
                               outcome);
}

}  // namespace sharpcheck::ops::merge
