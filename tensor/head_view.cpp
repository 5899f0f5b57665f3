#include "tensor/head_view.hpp"

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

}  // namespace sharpcheck::tensor
