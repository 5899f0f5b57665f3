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
                           std::size_t heads = 1, std::span<const double> sinks = {},
                           std::span<const HeadScores> heads_scores = {})
      : queries(q),
        keys(k),
        values(v),
        d_out(dout),
        d_lse(lse_gradient),
        scores(head_scores),
        group(heads),
        group_sinks(sinks),
        per_head(heads_scores) {}
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
  // Heads of the group that score differently (a bias, ALiBi slope or mask per head): one per
  // head, overriding `scores`; empty when every head scores as `scores`.
  std::span<const HeadScores> per_head;

  [[nodiscard]] std::size_t positions() const { return group == 0 ? 0 : queries.rows / group; }
  // How query head h of the group scores: its HeadScores with its sink, and the lengths left 0
  // filled in from the matrices (all positions computed, all keys exist, rows of n keys).
  [[nodiscard]] HeadScores head(std::size_t h) const {
    HeadScores head_scores = per_head.empty() ? scores : per_head[h];
    if (!group_sinks.empty()) head_scores.sink = group_sinks[h];
    if (head_scores.queries == 0) head_scores.queries = positions();
    if (head_scores.keys == 0) head_scores.keys = keys.rows;
    if (head_scores.row_stride == 0) head_scores.row_stride = keys.rows;
    return head_scores;
  }
};

}  // namespace sharpcheck::tensor
