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

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

[[nodiscard]] double max_logit(const Matrix& queries, const Matrix& keys, const tensor::HeadScores& head,
                               const FloatFormat& target);

// The score of one pair, correctly rounded (the exact step above).
[[nodiscard]] double rounded_score(std::span<const double> query, std::span<const double> key,
                                   const tensor::HeadScores& head, const FloatFormat& target);

}  // namespace sharpcheck::reference
