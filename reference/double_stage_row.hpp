// The pieces the double stages share, proved in reference/double_stage.cpp: the unit roundoff and
// gamma_k, the rounding of a certified interval, one attention logit with its error, and a row's
// exponentials with their bounded sum. The forward's row stage (double_stage.cpp) and the
// backward's (attention_backward_double.cpp) are built from them, so one proof covers both.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

inline constexpr double unit_roundoff = 0x1p-53;

// Whether this thread's arithmetic is what the proofs assume: rounding to nearest, and subnormals
// kept (no flush-to-zero or denormals-are-zero, whose absolute errors reach 2^-1022, not 2^-1075).
// The stages stand aside otherwise; their worker threads inherit the caller's settings.
[[nodiscard]] bool certified_arithmetic();

// gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
[[nodiscard]] inline double gamma_of(double k) { return k * unit_roundoff / (1 - k * unit_roundoff); }

// The value of the format every point of [low, high] rounds to, if there is one (ties to even;
// both ends a zero of the format gives that zero, signed only where the interval lies below 0).
[[nodiscard]] std::optional<double> round_if_decided(double low, double high, const FloatFormat& target);

// The bias additive - slope distance in double: one fused multiply-add, within u |bias|.
[[nodiscard]] double bias_in_double(const tensor::HeadScores::BiasTerms& terms);

// The logit z = (dot scale + bias) / theta in double, with its absolute error, given the dot
// product's own error bound `dot_error` (its rounding and underflow). scale is the head's, or
// fl(1 / fl(sqrt(d))) (within 2u of 1/sqrt(d)).
struct LogitInDouble {
  double z;
  double error;
};
[[nodiscard]] LogitInDouble logit_in_double(double dot, double dot_error, double scale, double bias,
                                            double theta);

// The error of a sink's logit sink / theta as computed in double (one division).
[[nodiscard]] double sink_logit_error(double z);

// One attention row's double-stage state: the logits, their exponentials against the largest,
// each exponential's relative error eta_j, and the bounded sum.
struct AttentionRowInDouble {
  std::vector<double>& logits;
  std::vector<double>& errors;  // first the logits' absolute errors, then eta_j
  std::vector<double>& exponentials;
  double eta_max = 0;
  double sum = 0;
  double depth = 0;
  double tiny_mass = 0;
  double sum_error = 0;
};

// The exponentials of the first `count` logits against the largest, each eta_j, and their bounded
// pairwise sum (the proof in double_stage.cpp). An exponential of 0 stands for an argument below
// -700, whose weight is below 2^-1008 (counted in tiny_mass).
void bound_attention_exponentials(std::size_t count, std::vector<double>& scratch, AttentionRowInDouble& row);

// The relative error of the coefficient exponentials[a] / sum as computed in double, division
// included: p~ = fl(w~ / S~) lies within p (1 +- coefficient_error(row, a)).
[[nodiscard]] inline double coefficient_error(const AttentionRowInDouble& row, std::size_t a) {
  return (row.errors[a] + row.sum_error + unit_roundoff) * (1 + 0x1p-20) + 4 * unit_roundoff;
}

}  // namespace sharpcheck::reference
