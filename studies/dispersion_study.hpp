// The dispersion study: how the largest weight any row of spread delta can give one item falls
// (or does not) as n grows, under softmax and each proposed escape, computed exactly by the
// references and rounded into each output format; with adaptive temperature's entropy and beta.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck::studies {

enum class Escape {
  softmax,
  adaptive_temperature,
  scalable_softmax,
  length_scaled,
  sigmoid,
  stick_breaking_nearest,   // the spike is the key nearest the query (breaks the stick first)
  stick_breaking_farthest,  // the spike is the key farthest from it
  // Issue 19's matrix-level escapes (reference/attention_escapes.hpp), on the same extremal row:
  linear,          // normalised linear attention, d = 1: q = 1, keys (delta, 0, ..., 0)
  selective,       // the readout query after n tokens, each selecting every earlier distractor
  selective_weak,  // the same with settings.weak_selection: disperses until n ~ 1 / selection
  differential,    // softmax(delta, 0, ..., 0) - lambda softmax(0, ..., 0)
};
inline constexpr Escape all_escapes[] = {Escape::softmax,
                                         Escape::adaptive_temperature,
                                         Escape::scalable_softmax,
                                         Escape::length_scaled,
                                         Escape::sigmoid,
                                         Escape::stick_breaking_nearest,
                                         Escape::stick_breaking_farthest,
                                         Escape::linear,
                                         Escape::selective,
                                         Escape::selective_weak,
                                         Escape::differential};
[[nodiscard]] std::string_view escape_name(Escape escape);

// The output formats of the study, in column order; q8_probabilities is the uint8 output grid.
inline constexpr const FloatFormat* study_formats[] = {
    &fp64, &fp32, &bf16, &fp16, &fp8_e4m3, &fp8_e5m2, &q8_probabilities};
inline constexpr std::size_t study_format_count = std::size(study_formats);

struct DispersionSettings {
  std::vector<double> spreads{2.28, 5.69, 14.78};  // Gemma 2B heads: min, mean, max
  std::vector<std::uint64_t> sizes;                // empty: 16, 32, ..., 1,048,576
  double ssmax_s = 1.0;                            // SSMax's per-head scalar
  std::uint64_t training_length = 16;              // L of the length-scaled logits
  // Selective attention: the selection logit every token gives every earlier distractor (so the
  // readout sees F_j = selection (n - 2 - j) for 1 <= j <= n - 2; the spike is token 0, which is
  // never masked).
  double selection = 1.0;
  double weak_selection = 1.0 / 64;
  // Differential attention's lambda: lambda_init of layer 12, 0.8 - 0.6 e^-3.3 (lambda's learned
  // part 0), and the largest n its (and linear attention's) matrix references are run at: they
  // cost O(n) balls per row where the row-level references group equal logits.
  double differential_lambda = 0.777870099559256;  // reference::differential_lambda_init(12)
  std::uint64_t matrix_size_limit = 16384;
  unsigned threads = 0;  // 0: every core; results do not depend on it
};

// One operator at one (delta, n): the spike's weight on the extremal row, correctly rounded to
// each study format. The row is (delta, 0, ..., 0), the spike first (last for stick-breaking's
// nearest key): for the shift-invariant operators the row that maximises the largest weight at
// spread delta; for sigmoid and stick-breaking, which see logits themselves, the one whose
// smallest logit is 0. Linear and Differential points past settings.matrix_size_limit are NaN (not
// computed).
struct DispersionPoint {
  Escape escape = Escape::softmax;
  double delta = 0;
  std::uint64_t n = 0;
  std::array<double, study_format_count> spike_weight{};
};

// Adaptive temperature on the same rows: the plain softmax row's entropy (correctly rounded to
// fp64), beta(H) (in double, as bounds::adaptive_beta), and whether the correction is active.
struct AdaptiveEntropyPoint {
  double delta = 0;
  std::uint64_t n = 0;
  double entropy = 0;
  double beta = 1;
  bool corrected = false;
};

struct DispersionStudy {
  DispersionSettings settings;
  std::vector<DispersionPoint> points;  // escape-major, then delta, then n
  std::vector<AdaptiveEntropyPoint> entropies;
  double seconds = 0;
};

[[nodiscard]] DispersionStudy run_dispersion_study(DispersionSettings settings);

// The spike weights of one operator at one spread, in fp64, in order of n.
[[nodiscard]] std::vector<const DispersionPoint*> series_of(const DispersionStudy& study, Escape escape,
                                                            double delta);

// The first n of the study at which the operator's spike weight (fp64) is below `threshold`.
[[nodiscard]] std::optional<std::uint64_t> first_size_below(const DispersionStudy& study, Escape escape,
                                                            double delta, double threshold);

// Where adaptive temperature's correction is off for good on the row (delta, 0, ..., 0) (delta >= 0):
// its entropy ln S - delta e^delta / S (S = e^delta + n - 1) reaches the upper root of
// poly(H) = 1 (bounds::adaptive_active_interval, certified). Found by bisection on the closed form in
// long double, written so that it overflows for no spread. `log_switch_off` is ln(n* - 1) at the
// real crossing n*; when that is below 62 ln 2 the integers are found too (`integers`), and
// `separated` says their entropies lie more than 1e-12 (far above the evaluation's error) outside
// the root's enclosure, on either side. Past 2^62 (delta above about 40) only the logarithm is given.
struct SwitchOff {
  long double log_switch_off = 0;
  bool integers = false;
  std::uint64_t last_corrected = 0;
  std::uint64_t first_uncorrected = 0;
  bool separated = false;
};
[[nodiscard]] SwitchOff adaptive_switch_off(double delta);

}  // namespace sharpcheck::studies
