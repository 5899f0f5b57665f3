// Runs a built-in kernel on inputs, computes the correctly rounded reference for the same
// inputs, and compares them under the kernel's tolerance-table entry: the one path from inputs
// to a verdict that the tests, the gate and the studies share.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "kernels/registry.hpp"
#include "metrics/comparison.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::metrics {

struct Evaluation {
  Comparison comparison;
  Matrix expected;  // the correctly rounded reference, in the kernel's output format
  Matrix actual;    // the kernel's output
  Matrix allowed;   // each element's allowed error under the tolerance table
  reference::ZivStatistics reference_statistics;  // how the reference decided (balls, MPFR loop, exact cases)
  std::vector<double> expected_lse;  // attention with spec.lse: the correctly rounded log-sum-exp per query
  std::vector<RowScale> row_scales;  // attention: each query's geometry (for judging the log-sum-exp)
  // Attention: each query's log-sum-exp spreads of the recipe's inside roundings (P's with a row
  // sum of the rounded P, the scores' first and second order; evaluate.cpp's RowRounding).
  struct LseSpreads {
    double p = 0, s = 0, s_second = 0;
  };
  std::vector<LseSpreads> lse_spreads;
  // A recipe with emulated scores: the variant whose centre the statistical tier was judged around
  // (metrics/score_emulation.hpp, described), empty where the head's scores could not be emulated.
  std::string score_chain;
  // The same, the comparison under every variant (score_emulation.hpp's score_variants, in order),
  // so that a judgement of many heads picks one for all (empty where not emulated).
  std::vector<Comparison> emulated_variants;
};

[[nodiscard]] Evaluation evaluate_softmax(const kernels::SoftmaxKernel& kernel, const Matrix& logits,
                                          double theta);

// One head's correctly rounded attention output (and log-sum-exp) with how the reference decided
// them: computed by the first recipe a judgement tries and reused by the others (a recipe changes
// the allowance, never the reference).
struct KnownReference {
  Matrix output;
  std::vector<double> lse;
  reference::ZivStatistics statistics;
};

// What outputs computed elsewhere (a plugin in a child process, a .npy file, Python) are judged
// as: the operation they claim to compute, their format, and the tolerance entry to judge by.
struct JudgeSpec {
  kernels::Operation operation = kernels::Operation::softmax;
  const FloatFormat* output = &fp32;
  const Tolerance* tolerance = nullptr;
  bool lse = false;        // attention: also compute the reference log-sum-exp per query
  bool lse_base2 = false;  // ... over ln 2
  const FloatFormat* lse_format = &fp32;
  // Attention: where this head's reference is kept between the recipes tried (empty: not yet
  // computed); null: computed for this judgement alone. The same output format, log-sum-exp options
  // and inputs for every use of one slot.
  std::optional<KnownReference>* known = nullptr;
  // A whole layer's (judge_attention_tensors): one slot per head (batch x heads), for `known`.
  std::vector<std::optional<KnownReference>>* known_heads = nullptr;
};

// first_row_number: the number the first row has in reports (when judging a block of a larger file).
[[nodiscard]] Evaluation judge_softmax(const JudgeSpec& spec, const Matrix& logits, double theta,
                                       Matrix actual, std::size_t first_row_number = 0);

// Log-probabilities computed elsewhere (log_softmax), judged against the correctly rounded
// log-softmax. Allowance: a kernel forms z_j - ln S; S carries the softmax denominator's relative
// error (the entry's units u at the row's spread, which ln turns into an absolute error of the
// same size), z_j the argument's, and the subtraction rounds in the output format:
// 2 u_out |log p_j|. So: the entry's allowance at magnitude 1, plus 2 u_out |log p_j|.
// Masked entries must be -inf exactly.
[[nodiscard]] Evaluation judge_log_softmax(const JudgeSpec& spec, const Matrix& logits, double theta,
                                           Matrix actual, std::size_t first_row_number = 0);

[[nodiscard]] Evaluation evaluate_attention(const kernels::AttentionKernel& kernel, const Matrix& queries,
                                            const Matrix& keys, const Matrix& values,
                                            const tensor::HeadScores& scores);
// Judges attention outputs computed elsewhere under the given scores (masks, modifiers, scale;
// fully masked rows are judged against zeros).
[[nodiscard]] Evaluation judge_attention(const JudgeSpec& spec, const Matrix& queries, const Matrix& keys,
                                         const Matrix& values, const tensor::HeadScores& scores,
                                         Matrix actual);

}  // namespace sharpcheck::metrics
