// The forward attention judgement's tolerance geometry for one head, a block of query rows at a
// time: each row's RowScale (what the proven tier charges), its magnitudes sum_j p_j |v_jc| and its
// RowRounding (the statistical tier's spreads), with the row sums over keys as BLAS products of the
// block's weight matrices and the values' images (as the backward's geometry, backward_pair_block.hpp).
//
// What each quantity is and why it bounds what it bounds is written where it is used:
// tolerance_table.hpp (RowScale), inside_rounding.hpp (RowRounding) and recipes.cpp. Here only how it
// is computed: the dot products q . k and sum_t |q_t k_t| of every pair by two products; each row's
// logits, weights and groups of equal weight in double, row by row; then the sums over keys
// (o = P V, sum_j p_j |v_j|, sum_j p_j^2 v_j^2, ...) by products. Rows that need more care than the
// products give (weights tied in groups, scores or sums past double's range) take the row-by-row
// sums of inside_rounding.cpp instead.
#pragma once

#include <vector>

#include "core/matrix.hpp"
#include "metrics/inside_rounding.hpp"
#include "metrics/tolerance_table.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::metrics {

struct HeadGeometry {
  std::vector<RowScale> scales;        // per query row
  Matrix magnitudes;                   // rows x value columns: sum_j p_j |v_jc| (1 + 1e-9)
  std::vector<RowRounding> roundings;  // per query row, for the scores' unit roundoff u_s
};

// How the RowRoundings' sums over keys are formed: by the block's products where a row allows it,
// or row by row for every row (inside_rounding.cpp's row_rounding; what the tests compare with).
enum class RowSums { by_products, by_rows };

// `head` with queries, keys and row_stride filled in (judge_attention does).
[[nodiscard]] HeadGeometry attention_head_geometry(const Matrix& queries, const Matrix& keys,
                                                   const Matrix& values, const tensor::HeadScores& head,
                                                   double u_s, RowSums sums = RowSums::by_products);

}  // namespace sharpcheck::metrics
