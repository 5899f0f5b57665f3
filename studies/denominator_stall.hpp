// The low-precision denominator stall (precision studies): a softmax whose running sum of
// exponentials is kept in a narrow format stops growing once each new term is at most half an ulp
// of the sum. With equal logits every term is 1, and a bf16 sum stalls at 256 (257 rounds back to
// 256), an fp16 sum at 2048, an fp32 sum at 2^24; bounds::accumulation_horizon gives the count of
// terms at which that must happen. Pairwise and Kahan summation in the same narrow format, and an
// fp32 accumulator, are the strategies that avoid it. Each point is measured against the exact
// answer: the correctly rounded softmax and the exact denominator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck::studies {

enum class StallRows { equal, random_normal };

// How the denominator is summed: every partial sum (and, for Kahan, the compensation) rounded to
// `format`.
enum class Summation { sequential, pairwise, kahan };
struct AccumulationStrategy {
  Summation summation = Summation::sequential;
  const FloatFormat* format = &fp32;
  [[nodiscard]] std::string name() const;  // "sequential_bf16", "pairwise_bf16", "kahan_bf16", ...
};

struct StallPoint {
  AccumulationStrategy strategy;
  StallRows rows = StallRows::equal;
  std::size_t n = 0;
  double denominator_error = 0;   // |computed sum / exact sum - 1| (the worst row)
  double row_sum = 0;             // sum of the outputs of the worst row (1 if nothing stalled)
  double max_relative_error = 0;  // max |p_j / RN(p_j) - 1| over elements with RN(p_j) != 0
};

struct StallSettings {
  std::vector<std::size_t> sizes;  // empty: 16, 32, ..., 16,384
  // empty: sequential in bf16, fp16, fp8 e4m3 and e5m2; pairwise and Kahan in bf16; sequential fp32.
  std::vector<AccumulationStrategy> strategies;
  const FloatFormat* output = &bf16;
  std::size_t rows = 4;  // random rows per point
  std::uint64_t seed = 20241008;
  unsigned threads = 0;  // 0: every core; results do not depend on it
};

struct StallStudy {
  StallSettings settings;
  std::vector<StallPoint> points;  // strategy x rows x n, in that order
  // Per strategy: the value at which its sum of ones stops growing, found by summing (nullopt:
  // not within the sizes), and for a sequential sum the count of terms bounds/ says it stalls at.
  std::vector<std::optional<double>> stall_values;
  std::vector<std::optional<std::uint64_t>> horizons;
};

// The sum the study's kernel divides by: sum_j RN32(exp(z_j - max)) by `strategy`.
[[nodiscard]] double strategy_denominator(const std::vector<double>& logits,
                                          const AccumulationStrategy& strategy);

// The kernel studied: e_j = exp(z_j - max) rounded to fp32, summed by `strategy`,
// p_j = e_j / sum rounded to the output format.
[[nodiscard]] std::vector<double> softmax_with_running_sum(const std::vector<double>& logits,
                                                           const AccumulationStrategy& strategy,
                                                           const FloatFormat& output);

// InputError for a size of 0 or above 2^24.
[[nodiscard]] StallStudy run_stall_study(const StallSettings& settings);

}  // namespace sharpcheck::studies
