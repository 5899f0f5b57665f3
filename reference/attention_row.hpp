// One query row of attention as the reference's stages see it (double, Arb balls, the MPFR Ziv
// loop and the exact cases): the query, the keys it sees with their bias terms, and the head's
// scores (scale, temperature, soft-cap, sink). The sink, if any, is one more entry with no value.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "core/rational.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

struct AttentionRow {
  std::span<const double> query;
  const Matrix& keys;
  const Matrix& values;
  std::span<const std::size_t> active;                  // the keys this query sees
  std::span<const tensor::HeadScores::BiasTerms> bias;  // per active key; empty when none
  const tensor::HeadScores& scores;

  [[nodiscard]] bool has_sink() const { return scores.sink.has_value(); }
  // Entries of the softmax: the active keys, then the sink.
  [[nodiscard]] std::size_t entries() const { return active.size() + (has_sink() ? 1 : 0); }
};

// Where a stage writes what it decides, and what is already decided. weights (indexed by key)
// may be empty; lse is null when not asked for.
struct AttentionRowResults {
  std::span<double> output;
  std::span<double> weights;
  double* lse = nullptr;
  bool lse_base2 = false;
  const FloatFormat* lse_target = nullptr;  // the log-sum-exp's format (set whenever lse is)
  std::vector<bool> output_done;
  std::vector<bool> weight_done;  // indexed like active
  bool lse_done = false;

  [[nodiscard]] bool all_done() const;
  [[nodiscard]] long decided_count() const;
};

// The exact cases' rational arithmetic, shared by the forward's and the backward's
// (reference/attention_backward_exact.cpp): a bias additive - slope * distance, and the dot product
// of two rows of doubles, both exactly.
[[nodiscard]] Rational exact_bias(const tensor::HeadScores::BiasTerms& terms);
// The scale s as a rational when it is one: the given scale, or 1/k for head dimension d = k^2.
[[nodiscard]] std::optional<Rational> rational_scale(const tensor::HeadScores& scores, std::size_t dim);
[[nodiscard]] Rational exact_dot(std::span<const double> x, std::span<const double> y);

// The exact cases (reference/attention_exact.cpp): finds the results that are rational, rounds
// them exactly and marks them done; returns how many it decided.
long apply_attention_exact_cases(const AttentionRow& row, const FloatFormat& target,
                                 AttentionRowResults& results);

}  // namespace sharpcheck::reference
