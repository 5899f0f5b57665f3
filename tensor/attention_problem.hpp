// An attention problem as real kernels have it: batched multi-head tensors in a stated layout,
// query heads sharing KV heads (MHA, GQA, MQA), padding or packed variable lengths, and the masks
// and score modifiers of tensor/head_scores.hpp. The reference, the kernels' adapter, compare and
// the gate take this description; `head(b, h)` slices it into one head's scores.
//
// Layouts (named as users dump them):
//   bhsd   [batch, heads, seq, dim]  (PyTorch's SDPA)
//   bshd   [batch, seq, heads, dim]  (FlashAttention's flash_attn_func)
//   packed [total_tokens, heads, dim] with cumulative sequence lengths (flash_attn_varlen_func)
// Outputs follow the query tensor's layout with the value dimension; the log-sum-exp is
// [batch, heads, seq_q] (bhsd and bshd) or [heads, total_q] (packed), natural log.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/head_scores.hpp"

namespace sharpcheck::tensor {

enum class Layout { bhsd, bshd, packed };

[[nodiscard]] std::string_view layout_name(Layout layout);
// Throws InputError naming the accepted layouts for any other name.
[[nodiscard]] Layout parse_layout(std::string_view name);

struct AttentionShape {
  std::size_t batch = 1;
  std::size_t heads = 1;
  std::size_t kv_heads = 1;  // divides heads: query head h reads KV head h / (heads / kv_heads)
  std::size_t queries = 0;   // seq_q (padded layouts); unused when packed
  std::size_t keys = 0;      // seq_k (padded layouts); unused when packed
  std::size_t head_dim = 0;
  std::size_t value_dim = 0;
};

// The [batch | 1, heads | 1, seq_q, seq_k] extent of a mask or bias tensor: a dimension of 1
// broadcasts, as in PyTorch's attn_mask.
struct Broadcast {
  bool per_batch = false;
  bool per_head = false;
};

struct AttentionProblem {
  AttentionShape shape;
  Layout layout = Layout::bhsd;
  // Padded layouts: valid lengths per batch element (empty: all of seq_q / seq_k). Queries past
  // the length are padding: not computed, output zeros, not judged.
  std::vector<std::size_t> query_lengths;
  std::vector<std::size_t> key_lengths;
  // Packed layout: batch + 1 cumulative offsets each (cu_seqlens_q, cu_seqlens_k), from 0.
  std::vector<std::size_t> cu_seqlens_q;
  std::vector<std::size_t> cu_seqlens_k;
  // Scores: everything in HeadScores except lengths, masks and per-head values.
  HeadScores scores;
  std::span<const std::uint8_t> keep;  // explicit mask [B|1, H|1, seq_q, seq_k], padded layouts only
  Broadcast keep_extent;
  std::span<const double> bias;  // additive bias, same extents
  Broadcast bias_extent;
  std::vector<double> alibi_slopes;  // one per query head, or empty
  std::vector<double> sinks;         // one per query head, or empty

  [[nodiscard]] std::size_t group_size() const { return shape.heads / shape.kv_heads; }
  [[nodiscard]] std::size_t kv_head_of(std::size_t head) const { return head / group_size(); }
  [[nodiscard]] std::size_t query_length(std::size_t batch) const;
  [[nodiscard]] std::size_t key_length(std::size_t batch) const;
  // Rows of the stored query / key tensor along the sequence (seq_q or total_q, ...).
  [[nodiscard]] std::size_t stored_queries() const;
  [[nodiscard]] std::size_t stored_keys() const;
  // Element counts of the tensors as stored.
  [[nodiscard]] std::size_t query_elements() const;
  [[nodiscard]] std::size_t key_elements() const;
  [[nodiscard]] std::size_t value_elements() const;
  [[nodiscard]] std::size_t output_elements() const;
  [[nodiscard]] std::size_t lse_elements() const;
  // Offsets of element (batch, head, position, column) in the tensors as stored.
  [[nodiscard]] std::size_t query_offset(std::size_t b, std::size_t h, std::size_t s, std::size_t t) const;
  [[nodiscard]] std::size_t key_offset(std::size_t b, std::size_t kv, std::size_t s, std::size_t t) const;
  [[nodiscard]] std::size_t value_offset(std::size_t b, std::size_t kv, std::size_t s, std::size_t t) const;
  [[nodiscard]] std::size_t output_offset(std::size_t b, std::size_t h, std::size_t s, std::size_t t) const;
  [[nodiscard]] std::size_t lse_offset(std::size_t b, std::size_t h, std::size_t s) const;
  // One query head of one batch element.
  [[nodiscard]] HeadScores head(std::size_t b, std::size_t h) const;
  // "[2, 8, 256, 64] bhsd, 2 KV heads, causal bottom-right" for reports.
  [[nodiscard]] std::string describe() const;
  // Throws InputError naming the field for: zero sizes, kv_heads not dividing heads, lengths or
  // offsets that do not fit the shape, masks, biases, slopes or sinks of the wrong size, and
  // everything HeadScores::validate rejects.
  void validate() const;
};

// The (batch, head, position, column) of an element of a stored output (or, with column absent,
// of the log-sum-exp), for naming the worst element of a report.
struct ElementIndex {
  std::size_t batch = 0;
  std::size_t head = 0;
  std::size_t position = 0;
  std::size_t column = 0;
  [[nodiscard]] std::string to_string(bool with_column = true) const;
};

}  // namespace sharpcheck::tensor
