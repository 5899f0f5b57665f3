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
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/matrix.hpp"
#include "kernels/tolerance.hpp"
#include "metrics/comparison.hpp"
#include "metrics/inside_rounding.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::metrics {

// One query row's emulated weights, normalised by the kernel's row sum so that the output is
// sum_j weight_j v_j: weight_j = c_j e^(m_j - M) / l (c_j the code's value, m_j the running max
// when key j was rounded, M the last, l the row sum the recipe names, the sink's share included).
struct EmulatedWeights {
  std::vector<double> weight;  // per visible key, in the order given
  std::vector<double> flip;    // how far an honest kernel's weight_j may be from weight_j
  bool row_sum_of_rounded = true;
  // How far, relative, the kernel's output may move with the weights' codes fixed: its rescale
  // factors fl(exp(m_old - m_new)) (each scales a share of numerator and row sum alike, moving the
  // output by at most that times M + |o|) and, with a row sum of the fp32 weights, their errors.
  double drift = 0;
};

// Whether a kernel of this recipe smooths the keys of a head with these scores: not under a
// soft-cap or a sink, where the shift is not softmax-invariant (kernels::QuantizedWeights).
[[nodiscard]] bool smooths(const kernels::QuantizedWeights& recipe, const tensor::HeadScores& scores);

// Keys smoothed by their mean (kernels::QuantizedWeights::smoothed_keys): per query row, a bound on
// the shift |c| = |q . k~ scale / theta| the kernel's logits are formed minus, and on what its fp32
// forming of c errs relative to: sum_t |q_t| (|k~_t| + delta) |scale / theta|, k~ the mean of the
// keys as given (the kernel's mean of the keys before quantisation differs from it by at most the
// quantisation's step and its fp32 sum's error, covered by delta_t = 2^-6 max_jt |k_jt - k~_t| +
// (n + 2) 2^-23 max_j |k_jt|).
struct SmoothingShift {
  double centre = 0;  // q . k~ scale, k~ the mean of the keys as given (before theta)
  double slack = 0;   // sum_t |q_t| delta |scale|: how far the kernel's own shift may be from it
  double bound = 0;   // sum_t |q_t| (|k~_t| + delta) |scale / theta| >= |c|
};
[[nodiscard]] std::vector<SmoothingShift> smoothing_shifts(const Matrix& queries, const Matrix& keys,
                                                           const tensor::HeadScores& scores);

// Sets each row's RowScale::smoothing_shift where `entry` rounds its weights as a key-smoothing
// kernel does (what the LSE's fp32 correction may err by: (d + 4) times the bound above).
void add_smoothing_shifts(const kernels::Tolerance& entry, const Matrix& queries, const Matrix& keys,
                          const tensor::HeadScores& scores, std::span<RowScale> rows);

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
  // An exact logit (a score, or the running max) and how far an honest kernel's fp32 one may be.
  struct Score {
    double value = -std::numeric_limits<double>::infinity();
    double error = 0;
  };
  // One row's emulation in progress: per visible key its code, how far it may flip, the fp32
  // weight before rounding and its error, the running max it was rounded against.
  struct RowState {
    std::vector<double> code, spread, unrounded, unrounded_error, at;
    Score max;
    // Each rescale: its factor's relative error and the number of keys rounded before it.
    std::vector<std::pair<double, std::size_t>> rescales;
  };
  [[nodiscard]] Score score(std::size_t query, std::size_t key) const;
  // The error of an fp32 logit formed from an exact dot product (QuantizedWeights::exact_dot_product).
  [[nodiscard]] double exact_dot_error(std::size_t query, double scaled, double bias, double value) const;
  void round_tile(std::span<const Score> tile, std::size_t first, RowState& state) const;
  void finish_row(const RowState& state, double sink, EmulatedWeights& out) const;
  // The largest logit of a tile: the kernel's max lies in [max_j (z_j - e_j), max_j (z_j + e_j)].
  [[nodiscard]] static Score largest_of(std::span<const Score> tile);

  const kernels::QuantizedWeights& recipe_;
  const Matrix& queries_;
  const Matrix& keys_;
  const tensor::HeadScores& scores_;
  double scale_ = 1;
  bool covers_ = false;
  std::vector<SmoothingShift> shifts_;  // where the recipe smooths the keys
};

// What the entry charges around the emulated weights: neither P's rounding nor its subnormal floor,
// nor the logits' fp32 errors (argument, spread, dot_product), which move a weight only by flipping
// its code (charged in full) or through the rescale factors and an fp32 row sum (the drift); the
// accumulation's (per_item, constant) and the output's rounding stay.
[[nodiscard]] kernels::Tolerance around_emulated_weights(const kernels::Tolerance& entry);

// The comparison of `base` (its proven tier unchanged) with the statistical tier centred on the
// emulated weights' attention and the row-scale test around it; rows the emulation cannot follow
// are centred on the correctly rounded output with the entry's worst case of P's rounding, and keep
// the row-scale test of their `standard` roundings (RowRounding). nullopt where the head is not
// covered.
[[nodiscard]] std::optional<Comparison> judge_emulated_weights(
    const kernels::Tolerance& entry, const FloatFormat& output, const Matrix& queries, const Matrix& keys,
    const Matrix& values, const tensor::HeadScores& head, const ComparisonInput& base,
    std::span<const RowRounding> standard);

}  // namespace sharpcheck::metrics
