// Runs a registry attention kernel (one head per call) over a whole attention problem: each
// (batch, head) gathered from the stored tensors with its KV head (GQA) and its scores
// (tensor::AttentionProblem::head), the outputs and log-sum-exp scattered back in the problem's
// layout. Padding query rows are left 0.
#pragma once

#include <span>
#include <vector>

#include "kernels/registry.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::kernels {

struct LayerOutputs {
  std::vector<double> out;  // problem.output_elements()
  std::vector<double> lse;  // problem.lse_elements(), or empty when the kernel writes none
};

[[nodiscard]] LayerOutputs run_attention_layer(const AttentionKernel& kernel,
                                               const tensor::AttentionProblem& problem,
                                               std::span<const double> q, std::span<const double> k,
                                               std::span<const double> v);

struct LayerInputs {
  std::vector<double> q, k, v;
};

// The inputs as `kernel` declares it computes with them (AttentionKernel::declared_inputs), each
// head's Q, K and V replaced in the problem's layout; copies of the inputs when it declares none.
[[nodiscard]] LayerInputs declared_layer_inputs(const AttentionKernel& kernel,
                                                const tensor::AttentionProblem& problem,
                                                std::span<const double> q, std::span<const double> k,
                                                std::span<const double> v);

}  // namespace sharpcheck::kernels
