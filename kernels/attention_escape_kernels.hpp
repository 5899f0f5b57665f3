// Kernels under test for linear, selective and Differential attention (issue 19): fp32
// arithmetic, and bf16 forms that take bf16 inputs (exact in fp32), compute in fp32 and round each
// result once. Each has a registry entry with its derivation (metrics/judge_attention_escapes.hpp
// evaluates it), and each operation a deliberately broken twin with a bug a port could have.
#pragma once

#include <functional>
#include <span>
#include <string_view>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/escape_problem.hpp"

namespace sharpcheck::kernels {

// What a kernel returns: linear attention's outputs (m x dv), or the weights (n x n, m x n).
using EscapeResult = Matrix;

struct AttentionEscapeKernel {
  std::string_view name;
  std::string_view description;
  tensor::EscapeOperation operation;
  const FloatFormat* format;  // inputs and results
  bool deliberately_broken;
  std::function<EscapeResult(const tensor::EscapeProblem&)> run;
};

[[nodiscard]] std::span<const AttentionEscapeKernel> attention_escape_kernels();
[[nodiscard]] const AttentionEscapeKernel* find_attention_escape_kernel(std::string_view name);

}  // namespace sharpcheck::kernels
