// attention: softmax(scale Q K^T + masks and modifiers) V per head, batched, multi-head, GQA, in
// the layouts of tensor/attention_problem.hpp, with an optional log-sum-exp. Built-in kernels
// (kernels/attention_registry.cpp) on a normal Q, K, V and on the scenarios of
// gate/attention_scenarios.hpp; a plugin's sharpcheck_attention and sharpcheck_attention_layer;
// tensors computed elsewhere judged under the precision recipes (metrics/recipes.hpp).
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation attention_operation;

// The per-head tensors every attention-like operation takes (attention, its backward, paged).
inline constexpr gate::TensorSpec sinks_tensor{.name = "sinks",
                                               .role = gate::TensorRole::optional_input,
                                               .shape = "[H]",
                                               .meaning = "one sink logit per query head",
                                               .format = "fp64"};
inline constexpr gate::TensorSpec alibi_slopes_tensor{.name = "alibi_slopes",
                                                      .role = gate::TensorRole::optional_input,
                                                      .shape = "[H]",
                                                      .meaning = "one ALiBi slope per query head",
                                                      .format = "fp64"};

// The options of an attention problem's scores and layout, shared with attention_backward.
[[nodiscard]] std::span<const gate::OptionSpec> attention_options();
// The same less the log-sum-exp's own (lse_base2, lse_format), which the backward's judge does not
// read: accepted there, they would be ignored silently.
[[nodiscard]] std::span<const gate::OptionSpec> attention_backward_options();
// The sweep's attention cases for a kernel outside the gate (ops/attention/attention_external.cpp).
[[nodiscard]] std::vector<gate::ExternalCase> attention_external_cases(const gate::ExternalSweep& sweep);
// One attention problem as an external case: q, k, v in its layout (and its sinks and ALiBi
// slopes), its scores' options (scale always; causal, align, window, softcap, theta, lengths, cu_seqlens
// as set) and what a kernel must declare to be given it ("gqa" for fewer KV heads).
[[nodiscard]] gate::ExternalCase attention_problem_case(std::string id,
                                                        const tensor::AttentionProblem& problem,
                                                        std::vector<double> q, std::vector<double> k,
                                                        std::vector<double> v);
// A 1-D tensor of one value per query head; InputError for another shape.
[[nodiscard]] std::vector<double> head_values(const gate::Array& array);
// The per-head values given as 1-D tensors ("sinks", "alibi_slopes"), read into `arrays`.
void read_head_values(const gate::OpCall& call, gate::AttentionArrays& arrays);

}  // namespace sharpcheck::ops
