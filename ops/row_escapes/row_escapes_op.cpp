// The row escapes' records: one per operation, each the softmax rows' plan, run and judge with its
// own kernels::Operation and default tolerance entry (its fp32 kernel's, metrics/tolerance_table.cpp).
#include "ops/row_escapes/row_escapes_op.hpp"

#include "ops/softmax/softmax_op.hpp"

namespace sharpcheck::ops {
namespace {

constexpr gate::TensorSpec escape_tensors[] = {
    {.name = "logits", .role = gate::TensorRole::input, .shape = "any rank", .meaning = "the logits"},
    {.name = "weights",
     .role = gate::TensorRole::judged,
     .shape = "as logits",
     .meaning = "the kernel's attention weights",
     .format = "format"},
};

constexpr char adaptive_entry[] = "adaptive", ssmax_entry[] = "ssmax", length_entry[] = "length_scaled",
               sigmoid_entry[] = "sigmoid", stick_entry[] = "stick_breaking";
constexpr char adaptive_name[] = "adaptive_temperature", ssmax_name[] = "scalable_softmax",
               length_name[] = "length_scaled_softmax", sigmoid_name[] = "sigmoid_attention",
               stick_name[] = "stick_breaking_attention";

// The record of one row escape: `operation` picks the reference and the kernels, `entry` the default
// tolerance entry (its fp32 kernel's); its sweep for kernels outside the gate is the softmax rows'.
template <kernels::Operation operation, const char* entry, const char* name>
gate::Operation row_escape(std::string_view summary, std::string_view allowance) {
  return {
      .name = std::string_view(name),
      .summary = summary,
      .tensors = escape_tensors,
      .options = row_options(),
      .allowance = allowance,
      .plugin_entry = {},
      .kernels = [] { return row_kernels(operation); },
      .plan_builtin = [](const gate::PlanContext& c,
                         std::vector<gate::GateCase>& cases) { plan_row_kernels(c, operation, cases); },
      .plan_plugin = nullptr,
      .run = run_row_case,
      .judge = [](const gate::OpCall& call) { return judge_rows(call, operation, "weights", entry); },
      .external_cases =
          [](const gate::ExternalSweep& sweep) { return row_external_cases(name, sweep, "weights"); },
  };
}

}  // namespace

const gate::Operation adaptive_temperature_operation =
    row_escape<kernels::Operation::adaptive_temperature, adaptive_entry, adaptive_name>(
        "the paper's adaptive-temperature softmax: softmax(beta(H) logits / theta)",
        "the adaptive kernel's tolerance entry, at the row's beta");

const gate::Operation scalable_softmax_operation =
    row_escape<kernels::Operation::scalable_softmax, ssmax_entry, ssmax_name>(
        "SSMax: softmax(ln(n) logits / theta)", "the ssmax kernel's tolerance entry, at ln(n) / theta");

const gate::Operation length_scaled_softmax_operation =
    row_escape<kernels::Operation::length_scaled_softmax, length_entry, length_name>(
        "softmax(max(1, ln n / ln 16) logits / theta), Qwen's logn attention",
        "the length_scaled kernel's tolerance entry");

const gate::Operation sigmoid_attention_operation =
    row_escape<kernels::Operation::sigmoid_attention, sigmoid_entry, sigmoid_name>(
        "sigmoid(logits / theta - ln n), each weight on its own", "the sigmoid kernel's tolerance entry");

const gate::Operation stick_breaking_operation =
    row_escape<kernels::Operation::stick_breaking, stick_entry, stick_name>(
        "stick-breaking weights of sigmoid(logits / theta), nearest key last",
        "the stick_breaking kernel's tolerance entry");

}  // namespace sharpcheck::ops
