#include "tensor/attention_problem.hpp"

#include <cmath>

#include "core/errors.hpp"

namespace sharpcheck::tensor {
namespace {

[[noreturn]] void reject(const std::string& what) {
  throw InputError(InputProblem::shape_mismatch, "attention problem: " + what);
}

std::string count(std::size_t value) { return std::to_string(value); }

void check_offsets(const std::vector<std::size_t>& offsets, std::size_t batch, const char* name) {
  if (offsets.size() != batch + 1 || offsets.front() != 0) {
    reject(std::string(name) + " must hold batch + 1 = " + count(batch + 1) + " offsets starting at 0, got " +
           count(offsets.size()));
  }
  for (std::size_t b = 0; b < batch; ++b) {
    if (offsets[b + 1] < offsets[b]) reject(std::string(name) + " decreases at entry " + count(b + 1));
  }
}

void check_lengths(const std::vector<std::size_t>& lengths, std::size_t batch, std::size_t limit,
                   const char* name) {
  if (lengths.empty()) return;
  if (lengths.size() != batch)
    reject(std::string(name) + " has " + count(lengths.size()) + " entries for batch " + count(batch));
  for (std::size_t b = 0; b < batch; ++b) {
    if (lengths[b] > limit) {
      reject(std::string(name) + "[" + count(b) + "] = " + count(lengths[b]) +
             " exceeds the sequence length " + count(limit));
    }
  }
}

std::size_t extent_size(const AttentionShape& shape, const Broadcast& extent) {
  return (extent.per_batch ? shape.batch : 1) * (extent.per_head ? shape.heads : 1) * shape.queries *
         shape.keys;
}

std::size_t extent_offset(const AttentionShape& shape, const Broadcast& extent, std::size_t b,
                          std::size_t h) {
  const std::size_t heads = extent.per_head ? shape.heads : 1;
  return ((extent.per_batch ? b : 0) * heads + (extent.per_head ? h : 0)) * shape.queries * shape.keys;
}

}  // namespace

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::bhsd:
      return "bhsd";
    case Layout::bshd:
      return "bshd";
    case Layout::packed:
      return "packed";
  }
  return "?";
}

Layout parse_layout(std::string_view name) {
  for (const Layout layout : {Layout::bhsd, Layout::bshd, Layout::packed}) {
    if (name == layout_name(layout)) return layout;
  }
  throw InputError(InputProblem::out_of_range,
                   "unknown layout '" + std::string(name) + "' (accepted: bhsd, bshd, packed)");
}

std::size_t AttentionProblem::query_length(std::size_t batch) const {
  if (layout == Layout::packed) return cu_seqlens_q[batch + 1] - cu_seqlens_q[batch];
  return query_lengths.empty() ? shape.queries : query_lengths[batch];
}

std::size_t AttentionProblem::key_length(std::size_t batch) const {
  if (layout == Layout::packed) return cu_seqlens_k[batch + 1] - cu_seqlens_k[batch];
  return key_lengths.empty() ? shape.keys : key_lengths[batch];
}

std::size_t AttentionProblem::stored_queries() const {
  return layout == Layout::packed ? cu_seqlens_q.back() : shape.batch * shape.queries;
}

std::size_t AttentionProblem::stored_keys() const {
  return layout == Layout::packed ? cu_seqlens_k.back() : shape.batch * shape.keys;
}

std::size_t AttentionProblem::query_elements() const {
  return stored_queries() * shape.heads * shape.head_dim;
}
std::size_t AttentionProblem::key_elements() const { return stored_keys() * shape.kv_heads * shape.head_dim; }
std::size_t AttentionProblem::value_elements() const {
  return stored_keys() * shape.kv_heads * shape.value_dim;
}
std::size_t AttentionProblem::output_elements() const {
  return stored_queries() * shape.heads * shape.value_dim;
}
std::size_t AttentionProblem::lse_elements() const { return stored_queries() * shape.heads; }

namespace {

// Row (the index over [.., heads, ..] rows of `width` columns) of token s of batch b, head h.
std::size_t row_of(const AttentionProblem& p, std::size_t b, std::size_t h, std::size_t s, std::size_t heads,
                   std::size_t length, const std::vector<std::size_t>& offsets) {
  switch (p.layout) {
    case Layout::bhsd:
      return (b * heads + h) * length + s;
    case Layout::bshd:
      return (b * length + s) * heads + h;
    case Layout::packed:
      return (offsets[b] + s) * heads + h;
  }
  return 0;
}

}  // namespace

std::size_t AttentionProblem::query_offset(std::size_t b, std::size_t h, std::size_t s, std::size_t t) const {
  return row_of(*this, b, h, s, shape.heads, shape.queries, cu_seqlens_q) * shape.head_dim + t;
}
std::size_t AttentionProblem::key_offset(std::size_t b, std::size_t kv, std::size_t s, std::size_t t) const {
  return row_of(*this, b, kv, s, shape.kv_heads, shape.keys, cu_seqlens_k) * shape.head_dim + t;
}
std::size_t AttentionProblem::value_offset(std::size_t b, std::size_t kv, std::size_t s,
                                           std::size_t t) const {
  return row_of(*this, b, kv, s, shape.kv_heads, shape.keys, cu_seqlens_k) * shape.value_dim + t;
}
std::size_t AttentionProblem::output_offset(std::size_t b, std::size_t h, std::size_t s,
                                            std::size_t t) const {
  return row_of(*this, b, h, s, shape.heads, shape.queries, cu_seqlens_q) * shape.value_dim + t;
}
std::size_t AttentionProblem::lse_offset(std::size_t b, std::size_t h, std::size_t s) const {
  if (layout == Layout::packed) return h * stored_queries() + cu_seqlens_q[b] + s;
  return (b * shape.heads + h) * shape.queries + s;
}

HeadScores AttentionProblem::head(std::size_t b, std::size_t h) const {
  HeadScores head_scores = scores;
  head_scores.queries = query_length(b);
  head_scores.keys = key_length(b);
  head_scores.row_stride = shape.keys;
  if (!keep.empty()) head_scores.keep = keep.subspan(extent_offset(shape, keep_extent, b, h));
  if (!bias.empty()) head_scores.bias = bias.subspan(extent_offset(shape, bias_extent, b, h));
  if (!alibi_slopes.empty()) head_scores.alibi_slope = alibi_slopes[h];
  if (!sinks.empty()) head_scores.sink = sinks[h];
  return head_scores;
}

std::string AttentionProblem::describe() const {
  std::string text = layout == Layout::packed
                         ? "packed [" + count(stored_queries()) + ", " + count(shape.heads) + ", " +
                               count(shape.head_dim) + "]"
                         : "[" + count(shape.batch) + ", " + count(shape.heads) + ", " +
                               count(shape.queries) + "x" + count(shape.keys) + ", " + count(shape.head_dim) +
                               "] " + std::string(layout_name(layout));
  if (shape.kv_heads != shape.heads) text += ", " + count(shape.kv_heads) + " KV heads";
  if (!query_lengths.empty() || !key_lengths.empty()) text += ", padded lengths";
  HeadScores described = scores;
  described.keep = keep;
  described.bias = bias;
  if (!alibi_slopes.empty()) described.alibi_slope = 1;
  if (!sinks.empty()) described.sink = 0;
  return text + ", " + described.describe();
}

void AttentionProblem::validate() const {
  if (shape.batch == 0 || shape.heads == 0 || shape.kv_heads == 0 || shape.head_dim == 0 ||
      shape.value_dim == 0) {
    throw InputError(InputProblem::empty_input,
                     "attention problem: batch, heads, KV heads and head dims must be positive");
  }
  if (shape.heads % shape.kv_heads != 0) {
    reject("KV heads (" + count(shape.kv_heads) + ") must divide the query heads (" + count(shape.heads) +
           ")");
  }
  if (layout == Layout::packed) {
    check_offsets(cu_seqlens_q, shape.batch, "cu_seqlens_q");
    check_offsets(cu_seqlens_k, shape.batch, "cu_seqlens_k");
    if (!keep.empty() || !bias.empty())
      reject("an explicit mask or bias needs a padded layout (bhsd or bshd)");
  } else {
    if (shape.queries == 0 || shape.keys == 0)
      throw InputError(InputProblem::empty_input, "attention problem: empty sequence");
    check_lengths(query_lengths, shape.batch, shape.queries, "query_lengths");
    check_lengths(key_lengths, shape.batch, shape.keys, "key_lengths");
  }
  if (!keep.empty() && keep.size() != extent_size(shape, keep_extent)) {
    reject("the mask has " + count(keep.size()) + " entries, expected " +
           count(extent_size(shape, keep_extent)));
  }
  if (!bias.empty() && bias.size() != extent_size(shape, bias_extent)) {
    reject("the bias has " + count(bias.size()) + " entries, expected " +
           count(extent_size(shape, bias_extent)));
  }
  if (!alibi_slopes.empty() && alibi_slopes.size() != shape.heads) {
    reject(count(alibi_slopes.size()) + " ALiBi slopes for " + count(shape.heads) + " heads");
  }
  if (!sinks.empty() && sinks.size() != shape.heads)
    reject(count(sinks.size()) + " sinks for " + count(shape.heads) + " heads");
  for (std::size_t b = 0; b < shape.batch; ++b) {
    for (std::size_t h = 0; h < shape.heads; ++h) {
      if (h > 0 && keep_extent.per_head == false && bias_extent.per_head == false && alibi_slopes.empty() &&
          sinks.empty())
        break;
      head(b, h).validate("attention problem, batch " + count(b) + " head " + count(h));
    }
  }
}

std::string ElementIndex::to_string(bool with_column) const {
  return "[batch " + count(batch) + ", head " + count(head) + ", row " + count(position) +
         (with_column ? ", column " + count(column) : std::string()) + "]";
}

}  // namespace sharpcheck::tensor
