#include "kernels/attention_layer.hpp"

namespace sharpcheck::kernels {
namespace {

template <typename Offset>
Matrix gather(std::span<const double> stored, std::size_t rows, std::size_t columns,
              const Offset& offset_of) {
  Matrix matrix(rows, columns);
  for (std::size_t s = 0; s < rows; ++s) {
    for (std::size_t t = 0; t < columns; ++t) matrix(s, t) = stored[offset_of(s) + t];
  }
  return matrix;
}

template <typename Offset>
void scatter(const Matrix& matrix, std::vector<double>& stored, const Offset& offset_of) {
  for (std::size_t s = 0; s < matrix.rows; ++s) {
    for (std::size_t t = 0; t < matrix.cols; ++t) stored[offset_of(s) + t] = matrix(s, t);
  }
}

}  // namespace

LayerInputs declared_layer_inputs(const AttentionKernel& kernel, const tensor::AttentionProblem& problem,
                                  std::span<const double> q, std::span<const double> k,
                                  std::span<const double> v) {
  LayerInputs inputs{{q.begin(), q.end()}, {k.begin(), k.end()}, {v.begin(), v.end()}};
  if (kernel.declared_inputs == nullptr) return inputs;
  problem.validate();
  const tensor::AttentionShape& shape = problem.shape;
  for (std::size_t b = 0; b < shape.batch; ++b) {
    const std::size_t rows = problem.query_length(b), keys = problem.key_length(b);
    for (std::size_t h = 0; h < shape.heads; ++h) {
      const std::size_t kv = problem.kv_head_of(h);
      const auto query_at = [&](std::size_t s) { return problem.query_offset(b, h, s, 0); };
      const auto key_at = [&](std::size_t s) { return problem.key_offset(b, kv, s, 0); };
      const auto value_at = [&](std::size_t s) { return problem.value_offset(b, kv, s, 0); };
      Matrix queries = gather(q, rows, shape.head_dim, query_at);
      Matrix key_rows = gather(k, keys, shape.head_dim, key_at);
      Matrix values = gather(v, keys, shape.value_dim, value_at);
      kernel.declared_inputs(queries, key_rows, values,
                             problem.head(b, h));  // K and V: the same for every head of a group
      scatter(queries, inputs.q, query_at);
      scatter(key_rows, inputs.k, key_at);
      scatter(values, inputs.v, value_at);
    }
  }
  return inputs;
}

LayerOutputs run_attention_layer(const AttentionKernel& kernel, const tensor::AttentionProblem& problem,
                                 std::span<const double> q, std::span<const double> k,
                                 std::span<const double> v) {
  problem.validate();
  const tensor::AttentionShape& shape = problem.shape;
  LayerOutputs outputs{std::vector<double>(problem.output_elements(), 0.0),
                       std::vector<double>(problem.lse_elements(), 0.0)};
  for (std::size_t b = 0; b < shape.batch; ++b) {
    const std::size_t rows = problem.query_length(b);
    const std::size_t keys = problem.key_length(b);
    if (rows == 0) continue;
    for (std::size_t h = 0; h < shape.heads; ++h) {
      const std::size_t kv = problem.kv_head_of(h);
      const Matrix queries =
          gather(q, rows, shape.head_dim, [&](std::size_t s) { return problem.query_offset(b, h, s, 0); });
      const Matrix key_rows =
          gather(k, keys, shape.head_dim, [&](std::size_t s) { return problem.key_offset(b, kv, s, 0); });
      const Matrix values =
          gather(v, keys, shape.value_dim, [&](std::size_t s) { return problem.value_offset(b, kv, s, 0); });
      Matrix out;
      std::vector<double> lse;
      kernel.run(queries, key_rows, values, problem.head(b, h), out, &lse);
      for (std::size_t s = 0; s < rows; ++s) {
        if (kernel.writes_lse) outputs.lse[problem.lse_offset(b, h, s)] = lse[s];
        for (std::size_t c = 0; c < shape.value_dim; ++c)
          outputs.out[problem.output_offset(b, h, s, c)] = out(s, c);
      }
    }
  }
  if (!kernel.writes_lse) outputs.lse.clear();
  return outputs;
}

}  // namespace sharpcheck::kernels
