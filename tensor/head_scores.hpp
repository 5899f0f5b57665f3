// How one attention head scores its keys: which keys each query sees and the logit it gives
// them. The one description of masks and score modifiers that the reference, the kernels, the
// tolerance geometry and the file readers share (tensor/attention_problem.hpp slices a whole
// [batch, heads, ...] problem into these).
//
//   logit_ij = (softcap(scale * q_i . k_j) + bias_ij) / theta      softcap(s) = cap tanh(s / cap)
//   bias_ij  = additive_bias[i][j] - alibi_slope * |i + diagonal - j|
//
// with scale = 1/sqrt(d) exactly when none is given, no soft-cap when cap = 0, and
// diagonal = 0 (top-left, PyTorch's is_causal) or keys - queries (bottom-right, FlashAttention
// >= 2.1 and decode kernels). Query i sees key j when j < keys, the explicit mask keeps it, and
//   causal:  j <= i + diagonal
//   window:  i + diagonal - left <= j <= i + diagonal + right   (FlashAttention's window_size)
// A sink adds one logit sink / theta, with no value, to every row's softmax (gpt-oss,
// FlashAttention 4): it takes mass from the keys and appears in the log-sum-exp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace sharpcheck::tensor {

enum class DiagonalAlignment { top_left, bottom_right };

// What a query that sees no key (and has no sink) produces.
enum class FullyMaskedRows {
  error,  // an InputError naming the row
  zeros,  // output zeros and log-sum-exp -inf (+inf, as FlashAttention 2/3 write it, is accepted)
};

struct HeadScores {
  std::optional<double> scale;  // nullopt: exactly 1/sqrt(d) as a real number
  // The scale stands for ln 2 exactly (a merge of base-2 log-sum-exps, read as scores): `scale`
  // holds ln 2 rounded for the kernels and the allowances, the reference uses the real ln 2.
  bool scale_is_ln2 = false;
  double theta = 1.0;       // temperature: any finite non-zero value
  double softcap = 0.0;     // 0: none; otherwise cap > 0
  std::size_t queries = 0;  // query rows of this head that are computed (the rest are padding)
  std::size_t keys = 0;     // keys that exist (the rest are padding, never seen)
  DiagonalAlignment alignment = DiagonalAlignment::top_left;
  bool causal = false;
  std::optional<std::size_t> window_left;   // nullopt: unbounded
  std::optional<std::size_t> window_right;  // nullopt: unbounded
  // Explicit mask (keep[i * row_stride + j] == 0 hides key j from query i) and additive bias (an
  // entry -inf hides the key too, as an additive mask does), over at least queries x keys with the
  // given row stride; empty when absent.
  std::span<const std::uint8_t> keep;
  std::span<const double> bias;
  std::size_t row_stride = 0;
  double alibi_slope = 0.0;
  std::optional<double> sink;
  FullyMaskedRows fully_masked = FullyMaskedRows::error;

  // keys - queries for bottom-right alignment, 0 for top-left.
  [[nodiscard]] std::ptrdiff_t diagonal() const;
  [[nodiscard]] bool sees(std::size_t query, std::size_t key) const;
  // The explicit mask and the bias's -inf entries only (not the causal or window limits).
  [[nodiscard]] bool kept(std::size_t query, std::size_t key) const;
  // bias_ij above, exactly: additive - slope * distance (the reference forms it exactly, a
  // kernel in its own arithmetic).
  struct BiasTerms {
    double additive = 0.0;
    double slope = 0.0;
    std::int64_t distance = 0;  // |i + diagonal - j|
  };
  [[nodiscard]] BiasTerms bias_terms(std::size_t query, std::size_t key) const;
  // bias_ij rounded once to double.
  [[nodiscard]] double bias_of(std::size_t query, std::size_t key) const;
  [[nodiscard]] bool has_bias() const { return !bias.empty() || alibi_slope != 0.0; }
  // Whether every row scores the keys alike (no causal mask, window, explicit mask, bias or ALiBi):
  // rows with equal queries then have equal scores wherever they sit.
  [[nodiscard]] bool rows_alike() const {
    return !causal && !window_left && !window_right && keep.empty() && !has_bias();
  }
  // The keys query i sees, in increasing order, into `keys_seen` (cleared first).
  void visible_keys(std::size_t query, std::vector<std::size_t>& keys_seen) const;
  // The modifiers in words, for reports ("causal bottom-right, window (128, 0), soft-cap 50").
  [[nodiscard]] std::string describe() const;
  // Throws InputError for a zero or non-finite theta, a negative or non-finite cap, scale,
  // slope or sink, masks shorter than queries x keys, or a NaN or +inf bias (with its index).
  void validate(const std::string& where) const;
};

}  // namespace sharpcheck::tensor
