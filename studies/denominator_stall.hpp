// The low-precision denominator stall (precision studies): a softmax whose running sum of
// exponentials is kept in a narrow format stops growing once each new term is at most half an ulp
// of the sum. With equal logits every term is 1, and a bf16 sum stalls at 256 (257 rounds back to
// 256), an fp16 sum at 2048, an fp32 sum at 2^24. Each point is measured against the exact answer:
// the correctly rounded softmax and the exact denominator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck::studies {

enum class StallRows { equal, random_normal };

struct StallPoint {
  const FloatFormat* accumulation = nullptr;
  StallRows rows = StallRows::equal;
  std::size_t n = 0;
  double denominator_error = 0;   // |computed sum / exact sum - 1| (the worst row)
  double row_sum = 0;             // sum of the outputs of the worst row (1 if nothing stalled)
  double max_relative_error = 0;  // max |p_j / RN(p_j) - 1| over elements with RN(p_j) != 0
};

struct StallSettings {
  std::vector<std::size_t> sizes;  // empty: 16, 32, ..., 16,384
  std::vector<const FloatFormat*> accumulations{&bf16, &fp16, &fp32};
  const FloatFormat* output = &bf16;
  std::size_t rows = 4;  // random rows per point
  std::uint64_t seed = 20241008;
};

struct StallStudy {
  StallSettings settings;
  std::vector<StallPoint> points;  // accumulation x rows x n, in that order
  // The value at which a running sum of ones stops growing, per accumulation (0: not within the
  // sizes): found by summing, not by formula.
  std::vector<double> stall_values;
};

// The kernel studied: e_j = exp(z_j - max) rounded to fp32, summed left to right with every
// partial sum rounded to `accumulation`, p_j = e_j / sum rounded to the output format.
[[nodiscard]] std::vector<double> softmax_with_running_sum(const std::vector<double>& logits,
                                                           const FloatFormat& accumulation,
                                                           const FloatFormat& output);

// InputError for a size of 0 or above 2^24.
[[nodiscard]] StallStudy run_stall_study(const StallSettings& settings);

}  // namespace sharpcheck::studies
