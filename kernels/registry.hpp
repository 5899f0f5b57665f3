// The registry of built-in kernels: name, formats, a one-line description, and a uniform entry
// point over rows of doubles, so the gate, the studies and the tests can list and run them.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "kernels/tolerance.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

// What a kernel computes, which decides the reference it is judged against.
enum class Operation {
  softmax,                // softmax(e / theta)
  adaptive_temperature,   // the paper's adaptive-temperature softmax
  scalable_softmax,       // SSMax: softmax(ln(n) e / theta)
  length_scaled_softmax,  // softmax(f e / theta), f = max(1, ln n / ln 16)
  sigmoid_attention,      // sigmoid(e / theta - ln n), weights on their own
  stick_breaking,         // stick-breaking weights of sigmoid(e / theta), nearest key last
  attention,              // one attention head
};

struct SoftmaxKernel {
  std::string_view name;
  std::string_view description;
  Operation operation;
  const FloatFormat* input;
  const FloatFormat* output;
  const FloatFormat* accumulation;
  // Kept to prove the suite catches a classic bug: reported as an expected failure.
  bool deliberately_broken;
  // Its core is compiled once per Highway SIMD target and dispatched at run time, so tests run it
  // on every target.
  bool simd_dispatched = false;
  // Rows of logits (each a value of `input`) at temperature theta -> rows of outputs (values of
  // `output`). Throws InputError if a logit is not a value of `input`.
  void (*run)(const Matrix& logits, double theta, Matrix& out);
  // What the kernel is held to, with its derivation beside the row.
  Tolerance tolerance;
};

struct AttentionKernel {
  std::string_view name;
  std::string_view description;
  const FloatFormat* input;
  const FloatFormat* output;
  const FloatFormat* accumulation;
  bool deliberately_broken;
  // Q (m x d), K (n x d), V (n x dv), entries values of `input`; scores, masks and modifiers as
  // tensor/head_scores.hpp says. Writes the outputs (queries x dv, values of `output`) and, when
  // `lse` is not null, the natural log-sum-exp per query (values of `lse_format`).
  void (*run)(const Matrix& queries, const Matrix& keys, const Matrix& values,
              const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse);
  Tolerance tolerance;  // the kernel's own entry; unused when `recipe` names one
  const FloatFormat* lse_format = &fp32;
  // The precision recipe (metrics/recipes.hpp) the kernel's design implies and is judged under;
  // empty: judged under `tolerance`.
  std::string_view recipe = {};
  bool writes_lse = true;  // false: the kernel returns no log-sum-exp (PyTorch's math path)
  // A kernel that quantises its own inputs (the block-scaled kernels): the values its declared
  // quantisation gives, head by head (Q and K of one head, V of its KV head, with the head's
  // scores, on which a quantisation may depend), which the exact reference computes with instead
  // of the inputs; null: the inputs as given.
  void (*declared_inputs)(Matrix& queries, Matrix& keys, Matrix& values,
                          const tensor::HeadScores& scores) = nullptr;
};

// The row of `rows` with this name, or null: how every registry (forward, backward) is searched.
template <typename Row>
[[nodiscard]] const Row* find_named(std::span<const Row> rows, std::string_view name) {
  for (const Row& row : rows) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

[[nodiscard]] std::span<const SoftmaxKernel> softmax_kernels();
[[nodiscard]] std::span<const AttentionKernel> attention_kernels();
[[nodiscard]] const SoftmaxKernel* find_softmax_kernel(std::string_view name);
[[nodiscard]] const AttentionKernel* find_attention_kernel(std::string_view name);

}  // namespace sharpcheck::kernels
