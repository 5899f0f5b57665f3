// FP8 attention indexed by the spread of its logits (precision studies): the error of FlashAttention
// 3-style FP8 attention (kernels/fp8_attention.hpp) against the correctly rounded attention of
// the unquantised inputs, as the logits' standard deviation grows with the shape held fixed.
// Published: with outlier inputs FP8 baseline attention has RMSE 2.4e-2 and FlashAttention 3's
// FP8 (block quantisation and Hadamard rotation) 9.1e-3 (Shah et al. 2024); FlashAttention 4's
// tests show FP8 rescaling saturating once the logits' standard deviation passes about 0.8
// (log2(448) - 8 = 0.807).
//
// Variants, each on the same inputs (bf16 values: the activations FP8 is made from):
//   plain:   one descale per tensor (the FP8 baseline);
//   block:   one descale per block of 64 rows of Q, K and V;
//   rotated: Q and K rotated by the same random Hadamard matrix, then block quantisation
//            (FlashAttention 3's FP8);
//   lazy:    plain with FlashAttention 4's conditional rescaling (8 in log2 units), whose e4m3
//            P saturates at 448.
// The logits are made to have standard deviation sigma by scaling Q: s = c q . k / sqrt(d).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "studies/flash_deviation.hpp"

namespace sharpcheck::studies {

enum class Fp8Variant { plain, block, rotated, lazy };
inline constexpr Fp8Variant all_fp8_variants[] = {Fp8Variant::plain, Fp8Variant::block, Fp8Variant::rotated,
                                                  Fp8Variant::lazy};
[[nodiscard]] const char* fp8_variant_name(Fp8Variant variant);

struct Fp8SpreadSettings {
  std::vector<double> sigmas;  // logit standard deviations; empty: 0.25 to 8
  std::vector<DeviationInputs> inputs{DeviationInputs::normal, DeviationInputs::outliers,
                                      DeviationInputs::large_outliers};
  std::size_t keys = 1024;
  std::size_t head_dim = 128;  // a power of two (the Hadamard rotation)
  std::size_t query_rows = 32;
  // Independent draws of Q, K and V per point, pooled: which entries are outliers varies a lot
  // from draw to draw (a single draw's rotated/plain ratio ranged from 0.5 to 6).
  std::size_t draws = 4;
  std::uint64_t seed = 20240711;
  unsigned threads = 0;  // 0: every core; results do not depend on it
};

struct Fp8Error {
  double rmse = 0;  // over every output of every draw
  double max_absolute = 0;
  double saturated = 0;  // fraction of probabilities clipped at 448
};

struct Fp8SpreadPoint {
  DeviationInputs inputs = DeviationInputs::normal;
  double sigma = 0;     // asked for
  double measured = 0;  // the exact logits' standard deviation over every query-key pair (draws' mean)
  // Indexed by Fp8Variant; `unscaled` marks the point with Q as drawn (no scaling), the
  // published figures' setting.
  Fp8Error errors[4];
  bool unscaled = false;
};

struct Fp8SpreadStudy {
  Fp8SpreadSettings settings;
  std::vector<Fp8SpreadPoint> points;  // inputs x (sigmas, then the unscaled point)
  // Per inputs kind (nullopt: none within the sigmas): the least sigma at which the lazy
  // variant saturates at all, and the saturation point, the least sigma at which its RMSE is at
  // least twice the plain variant's (saturation dominating the error).
  std::vector<std::optional<double>> first_saturation;
  std::vector<std::optional<double>> saturation_point;
};

// InputError for a non-positive sigma, keys of 0 or over 2^20, a head dimension that is not a
// power of two, or query rows or draws of 0.
[[nodiscard]] Fp8SpreadStudy run_fp8_spread_study(const Fp8SpreadSettings& settings);

}  // namespace sharpcheck::studies
