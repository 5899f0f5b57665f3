// One head's attention backward problem, as the reference, the kernels under test and the judges
// all take it (the tensor layer they share): Q, K, V, the gradient reaching the output (and the
// log-sum-exp), the scores' masks and modifiers, and grouped-query heads stacked.
#pragma once

#include <cstddef>
#include <span>

#include "core/matrix.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::tensor {

struct AttentionBackwardProblem {
  AttentionBackwardProblem(const Matrix& q, const Matrix& k, const Matrix& v, const Matrix& dout,
                           std::span<const double> lse_gradient, const HeadScores& head_scores,
                           std::size_t heads = 1, std::span<const double> sinks = {})
      : queries(q),
        keys(k),
        values(v),
        d_out(dout),
        d_lse(lse_gradient),
        scores(head_scores),
        group(heads),
        group_sinks(sinks) {}
  const Matrix& queries;          // m x d: `group` query heads of m / group positions each, stacked
  const Matrix& keys;             // n x d
  const Matrix& values;           // n x dv
  const Matrix& d_out;            // m x dv, stacked as the queries
  std::span<const double> d_lse;  // m entries, or empty: no gradient through the log-sum-exp
  // Masks and modifiers by position: row r of the queries is position r mod (m / group).
  const HeadScores& scores;
  // Grouped-query attention: the query heads sharing these keys and values (dK and dV sum over
  // them), and their sink logits, one per head, overriding scores.sink.
  std::size_t group;
  std::span<const double> group_sinks;
};

}  // namespace sharpcheck::tensor
