// The rounded weights of an FP8/MXFP8 attention kernel, emulated from the exact scores
// (kernels::QuantizedWeights says how the kernel rounds them), and the statistical tier judged
// around the attention of those weights (issue 36's rounding-flip recipe).
//
// Why: a kernel that rounds P to e4m3 moves each weight by up to 2^-4, and charged as a worst case
// (u_P sum_j p_j |v_j|) that allowance hides real bugs of the same size: quantising the inputs
// under the ceil rule where the floor rule is declared, or summing the row over the unrounded P
// where the rounded P is declared. But the weights are not noise: given the scores and the
// kernel's schedule (offset, tile, lazy-rescale threshold), each is one definite code. Only where
// an honest kernel's fp32 score could land on the other side of a rounding boundary is the code
// ambiguous; those flips are charged in full, and nothing else of P's rounding is.
//
// Contract: for an honest kernel of the stated schedule (any fp32 summation order of the dot
// products, fp32 exponentials within 4 ulp), each weight the kernel rounds lies in
// [code_low, code_high] of its emulated key (EmulatedWeights::flip = code_high - code_low, 0 for
// all but keys whose enclosure straddles a boundary), and the kernel's running max takes the same
// values as the emulation's; where a tile's rescale decision is within the scores' error the row is
// not emulated (emulate_row returns false) and keeps the worst-case charge.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "kernels/tolerance.hpp"
#include "metrics/comparison.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::metrics {

// One query row's emulated weights, normalised by the kernel's row sum so that the output is
// sum_j weight_j v_j: weight_j = c_j e^(m_j - M) / l (c_j the code's value, m_j the running max
// when key j was rounded, M the last, l the row sum the recipe names, the sink's share included).
struct EmulatedWeights {
  std::vector<double> weight;  // per visible key, in the order given
  std::vector<double> flip;    // how far an honest kernel's weight_j may be from weight_j
  bool row_sum_of_rounded = true;
};

class WeightEmulator {
 public:
  WeightEmulator(const kernels::QuantizedWeights& recipe, const Matrix& queries, const Matrix& keys,
                 const tensor::HeadScores& scores);
  // Whether the head's scale and theta are finite (and theta non-zero): else every row keeps the
  // worst-case charge.
  [[nodiscard]] bool covers_head() const { return covers_; }
  // Row `query` over `visible`; false if the kernel's schedule could branch otherwise there (or a
  // score is not finite).
  bool emulate_row(std::size_t query, std::span<const std::size_t> visible, EmulatedWeights& out) const;

 private:
  struct Score {
    double value = 0, error = 0;  // the exact score and how far an honest kernel's fp32 one may be
  };
  [[nodiscard]] Score score(std::size_t query, std::size_t key) const;

  const kernels::QuantizedWeights& recipe_;
  const Matrix& queries_;
  const Matrix& keys_;
  const tensor::HeadScores& scores_;
  double scale_ = 1;
  bool covers_ = false;
};

// The comparison of `base` (its proven tier unchanged) with the statistical tier centred on the
// emulated weights' attention and the row-scale test around it; rows the emulation cannot follow
// are centred on the exact output with the entry's worst case of P's rounding. nullopt where the
// head is not covered.
[[nodiscard]] std::optional<Comparison> judge_emulated_weights(
    const kernels::Tolerance& entry, const FloatFormat& output, const Matrix& queries, const Matrix& keys,
    const Matrix& values, const tensor::HeadScores& head, const ComparisonInput& base);

}  // namespace sharpcheck::metrics
