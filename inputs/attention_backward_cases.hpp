// The attention backward sweep's inputs: problems that find the bugs backward ports had, not only
// Gaussian ones (issue 17): realistic activations (low-rank Q and K with a few large singular
// values; heavy-tailed outliers, 1e-3 of the entries times 10..100), repeated maxima, scores near a
// soft-cap, a long row with one dominant key, queries that see no key, a sink with a gradient
// through the log-sum-exp, and ALiBi in a sliding window. Every problem is a function of (kind, format, seed)
// alone, its entries values of the format.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::inputs {

enum class BackwardKind {
  normal_causal,      // N(0, 1) entries, 96 x 96, d = dv = 64, causal
  low_rank,           // Q and K of rank 4 with singular values up to ~8 sqrt(d), 64 x 256
  outliers,           // 1e-3 of the entries of Q and K times 10..100, 64 x 256
  repeated_maxima,    // every key repeated 4 times: ties in every row, 48 x 192
  near_softcap,       // soft-cap 5 with raw scores of size ~5, 64 x 128
  one_dominant_key,   // 8 queries x 1,024 keys, each query's own key about 6 above the rest
  fully_masked_rows,  // causal bottom-right with 40 queries and 24 keys: 16 queries see nothing
  sink_and_lse,       // a sink of 1.0 and a gradient through the log-sum-exp, 64 x 128
  alibi_window,       // ALiBi slope 1/4 and a sliding window (48, 0) bottom-right, 64 x 160
};

inline constexpr BackwardKind all_backward_kinds[] = {
    BackwardKind::normal_causal,     BackwardKind::low_rank,     BackwardKind::outliers,
    BackwardKind::repeated_maxima,   BackwardKind::near_softcap, BackwardKind::one_dominant_key,
    BackwardKind::fully_masked_rows, BackwardKind::sink_and_lse, BackwardKind::alibi_window};

[[nodiscard]] std::string_view backward_kind_name(BackwardKind kind);

// A problem's extents: queries, keys and the head dimension (the value dimension equals it).
struct BackwardShape {
  std::size_t queries = 0, keys = 0, dim = 0;
};
[[nodiscard]] BackwardShape backward_shape(BackwardKind kind);

struct BackwardInputs {
  Matrix queries, keys, values, d_out;
  std::vector<double> d_lse;  // empty unless the kind has a gradient through the log-sum-exp
  tensor::HeadScores scores;
};

[[nodiscard]] BackwardInputs make_backward_inputs(BackwardKind kind, const FloatFormat& format,
                                                  std::uint64_t seed);

}  // namespace sharpcheck::inputs
