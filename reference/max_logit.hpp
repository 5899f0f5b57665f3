// The largest attention logit of a head, correctly rounded: max over the (query, key) pairs the head
// sees of the scaled score s_ij = scale * q_i . k_j (before soft-cap, bias and temperature), what
// QK-Clip (Kimi K2's MuonClip; Transformer Engine's and MagiAttention's max_logit outputs) reads.
//
// Contract: returns RN_target(max s_ij) exactly (round to nearest, ties to even), or -inf when the
// head sees no pair. Rounding is monotone, so that is the largest of the rounded scores. Every
// pair's score is estimated in double with a bound on the estimate's error; only the pairs whose
// enclosure reaches the largest lower end are rounded exactly: the dot product in rationals, a
// rational scale (a given one, or 1/k for d = k^2) exactly, and 1/sqrt(d) otherwise as
// sqrt(dot^2 / d) in a Ziv loop, which ends because that value is irrational and so never a
// rounding boundary.
#pragma once

#include <cmath>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

// The scale a head's scores use in double: the given one, or 1/sqrt(d) (the root and the quotient
// each rounded once).
[[nodiscard]] inline double scale_in_double(const tensor::HeadScores& head, std::size_t dim) {
  return head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

// Calls visit(i, j, score, magnitude) for every pair the head sees: score = scale_in_double *
// (q_i . k_j summed in order in double) and magnitude = sum_t |q_i,t k_j,t|, what the reference's
// estimates and a judge's bounds on them start from.
template <typename Visit>
void for_each_visible_score(const Matrix& queries, const Matrix& keys, const tensor::HeadScores& head,
                            Visit&& visit) {
  const double scale = scale_in_double(head, queries.cols);
  const std::size_t rows = head.queries != 0 ? head.queries : queries.rows;
  std::vector<std::size_t> seen;
  for (std::size_t i = 0; i < rows; ++i) {
    head.visible_keys(i, seen);
    for (const std::size_t j : seen) {
      double dot = 0, magnitude = 0;
      for (std::size_t t = 0; t < queries.cols; ++t) {
        dot += queries(i, t) * keys(j, t);
        magnitude += std::abs(queries(i, t) * keys(j, t));
      }
      visit(i, j, dot * scale, magnitude);
    }
  }
}

[[nodiscard]] double max_logit(const Matrix& queries, const Matrix& keys, const tensor::HeadScores& head,
                               const FloatFormat& target);

// The score of one pair, correctly rounded (the exact step above).
[[nodiscard]] double rounded_score(std::span<const double> query, std::span<const double> key,
                                   const tensor::HeadScores& head, const FloatFormat& target);

}  // namespace sharpcheck::reference
