// One head's view of an attention problem's stored tensors: the rows a query head reads from Q
// and writes to the output, and the rows its KV head reads from K and V, gathered from any layout
// (bhsd, bshd, packed) into matrices whose row s is position s of batch element b. The one place
// that maps a head to its storage: the reference, the tensor judges, the backward's array judge and
// the plugin host read heads through it.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "core/matrix.hpp"
#include "tensor/attention_problem.hpp"
#include "tensor/tensor_source.hpp"

namespace sharpcheck::tensor {

enum class HeadTensor {
  query,   // Q: a query head's rows, head_dim wide
  key,     // K: a KV head's rows, head_dim wide
  value,   // V: a KV head's rows, value_dim wide
  output,  // O (and dO): a query head's rows, value_dim wide
};

// Heads first_head .. first_head + count - 1 of `which` (query heads for Q and O, KV heads for K
// and V) of batch element b, stacked head after head: count * rows rows. `rows` defaults to the
// element's valid length (query_length(b) for Q and O, key_length(b) for K and V); a caller may
// ask for fewer, or for a padded layout's stored rows.
[[nodiscard]] Matrix gather_heads(const AttentionProblem& problem, HeadTensor which,
                                  const TensorSource& stored, std::size_t b, std::size_t first_head,
                                  std::size_t count, std::optional<std::size_t> rows = std::nullopt);

// One head: gather_heads with count 1.
[[nodiscard]] inline Matrix gather_head(const AttentionProblem& problem, HeadTensor which,
                                        const TensorSource& stored, std::size_t b, std::size_t head) {
  return gather_heads(problem, which, stored, b, head, 1);
}

// The keys each of `count` consecutive query positions from `first` sees (HeadScores::visible_keys,
// into seen[r]), and the smallest range [first, last) of keys holding them all: {0, 0} when none
// sees a key. The blocks of query rows of the backward's double stage and tolerance geometry.
struct KeyRange {
  std::size_t first = 0, last = 0;
};
KeyRange visible_keys_of_rows(const HeadScores& head, std::size_t first, std::size_t count,
                              std::vector<std::vector<std::size_t>>& seen);

}  // namespace sharpcheck::tensor
