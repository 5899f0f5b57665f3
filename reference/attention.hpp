// The correctly rounded reference for attention: one head (2-D matrices) or a whole problem of
// batched multi-head tensors (tensor/attention_problem.hpp), with every mask and score modifier of
// tensor/head_scores.hpp.
//
// output_i = sum_j p_ij V_j with p_ij = softmax over the keys query i sees (and the sink) of the
// logits (softcap(scale * Q_i . K_j) + bias_ij) / theta. The dot products are exact (exact
// products, an exactly rounded sum), never a float dot product; the bias terms are exact.
//
// Accuracy contract: every output element, every weight (when asked for) and the log-sum-exp
// (when asked for: ln sum_j exp(logit_j) over the keys seen and the sink, or that over ln 2) is
// the exact real result rounded to nearest-even in the target format, as in
// reference/softmax.hpp. The termination argument, and where it is incomplete (soft-capping),
// is in reference/attention_exact.cpp; an undecided case throws UndecidedRounding. An output that
// rounds to a zero is -0 where its enclosure lies below 0 and +0 otherwise: every -0 is claimed,
// and a +0 is claimed only where the enclosure lay at or above 0 (an exact zero, such as keys whose
// values cancel within each group of equal logits, always straddles; its sign is +0 by the rule).
//
// Scale semantics: with no scale given, the scale is exactly 1/sqrt(d) as a real number (so
// for d = 128 it is irrational and never rounded); a given scale is used exactly as the double
// it is (pass float(1/sqrt(d)) to match a kernel that rounds its scale to fp32).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/errors.hpp"
#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/exact_rounding.hpp"
#include "tensor/attention_problem.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

struct AttentionOptions {
  // Scale, temperature, masks and modifiers. queries, keys and row_stride left at 0 are taken
  // from the matrices (all queries computed, all keys present, masks queries x keys).
  tensor::HeadScores scores;
  bool return_weights = false;
  bool return_lse = false;
  bool lse_base2 = false;                   // the log-sum-exp over ln 2, as kernels that use exp2 store it
  const FloatFormat* lse_format = nullptr;  // the log-sum-exp's format (null: the target's)
  ZivStatistics* statistics = nullptr;
  bool mpfr_only = false;  // skip the double and Arb stages (same results, slower), for tests
};

struct AttentionResult {
  Matrix output;                  // queries x value columns (padding rows and fully masked rows: 0)
  std::optional<Matrix> weights;  // queries x keys, when asked for
  std::vector<double> lse;        // per query, when asked for (-inf on a fully masked row)
};

// queries: m x d, keys: n x d, values: n x dv. All entries finite.
[[nodiscard]] AttentionResult attention(const Matrix& queries, const Matrix& keys, const Matrix& values,
                                        const FloatFormat& target, const AttentionOptions& options = {});

struct AttentionTensorOptions {
  bool return_lse = false;
  bool return_weights = false;  // P, correctly rounded to the target (for outside audits)
  bool lse_base2 = false;
  const FloatFormat* lse_format = nullptr;  // null: the target's
  unsigned threads = 0;                     // 0: every core; rows are computed in parallel
  ZivStatistics* statistics = nullptr;
  bool mpfr_only = false;
};

struct AttentionTensorResult {
  std::vector<double> output;  // laid out as problem.output_offset says
  std::vector<double> lse;     // laid out as problem.lse_offset says, when asked for
  // When asked for: [batch, heads, weight_queries, weight_keys], the stored sequence lengths
  // (packed: the longest of the batch); a key a query does not see, and padding, hold 0 (a
  // sink's share is not listed: such a row sums to less than 1).
  std::vector<double> weights;
  std::size_t weight_queries = 0, weight_keys = 0;
};

// q, k, v hold problem.query_elements(), key_elements() and value_elements() doubles in the
// problem's layout. Holds one head's keys and values as matrices at a time, beside the result.
[[nodiscard]] AttentionTensorResult attention(const tensor::AttentionProblem& problem,
                                              std::span<const double> q, std::span<const double> k,
                                              std::span<const double> v, const FloatFormat& target,
                                              const AttentionTensorOptions& options = {});

}  // namespace sharpcheck::reference
