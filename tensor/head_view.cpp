#include "tensor/head_view.hpp"

#include <algorithm>
#include <limits>

namespace sharpcheck::tensor {

Matrix gather_heads(const AttentionProblem& problem, HeadTensor which, const TensorSource& stored,
                    std::size_t b, std::size_t first_head, std::size_t count,
                    std::optional<std::size_t> rows) {
  const bool by_query = which == HeadTensor::query || which == HeadTensor::output;
  const std::size_t length = rows.value_or(by_query ? problem.query_length(b) : problem.key_length(b));
  const std::size_t columns = which == HeadTensor::query || which == HeadTensor::key
                                  ? problem.shape.head_dim
                                  : problem.shape.value_dim;
  const auto offset = [&](std::size_t head, std::size_t s) {
    switch (which) {
      case HeadTensor::query:
        return problem.query_offset(b, head, s, 0);
      case HeadTensor::key:
        return problem.key_offset(b, head, s, 0);
      case HeadTensor::value:
        return problem.value_offset(b, head, s, 0);
      case HeadTensor::output:
        break;
    }
    return problem.output_offset(b, head, s, 0);
  };
  Matrix matrix(count * length, columns);
  for (std::size_t h = 0; h < count; ++h) {
    // Each row is contiguous in every layout: one read per row.
    for (std::size_t s = 0; s < length; ++s)
      stored.read(offset(first_head + h, s), matrix.row(h * length + s));
  }
  return matrix;
}

KeyRange visible_keys_of_rows(const HeadScores& head, std::size_t first, std::size_t count,
                              std::vector<std::vector<std::size_t>>& seen) {
  seen.resize(count);
  KeyRange range{.first = std::numeric_limits<std::size_t>::max(), .last = 0};
  for (std::size_t r = 0; r < count; ++r) {
    head.visible_keys(first + r, seen[r]);
    for (const std::size_t j : seen[r]) {
      range.first = std::min(range.first, j);
      range.last = std::max(range.last, j + 1);
    }
  }
  if (range.last <= range.first) range = {};
  return range;
}

}  // namespace sharpcheck::tensor
