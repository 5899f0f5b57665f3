// How much more a FlashAttention-style kernel deviates than plain attention as sequences grow
// (Golden et al. 2024, "Is Flash Attention Stable?", arXiv 2405.02803: about 10x in bf16), measured
// against the correctly rounded answer instead of an fp64 "golden" computed in floating point.
//
// Both kernels take inputs that are values of the format and are emulated operation by operation:
//   naive: PyTorch's math path in the format: S = RN(RN(q k^T in fp32) * scale), softmax in fp32
//          from those scores, P rounded to the format, P V accumulated in fp32, output rounded.
//   flash: FlashAttention 2: scores and the online softmax in fp32 over tiles of `tile` keys (the
//          running max, the rescale exp(m_old - m_new), the running sum l), P rounded to the format
//          before P V, the accumulator in fp32, the output acc / l rounded once.
// Deviation of each against reference::attention on sampled query rows: max |error|, max ulp,
// RMSE and the fraction of outputs equal to the correctly rounded value; R(N) = flash / naive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/matrix.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::studies {

// outliers: 1 in 1,000 entries of Q and K times 10..100 (the FlashAttention 3 paper's kind);
// large_outliers: times 1,000..10,000 (beyond e4m3's dynamic range once scaled per tensor).
enum class DeviationInputs { normal, outliers, large_outliers };
[[nodiscard]] const char* deviation_inputs_name(DeviationInputs inputs);

struct DeviationSettings {
  std::vector<std::size_t> sizes;  // keys N; empty: 128, 256, ..., 16,384
  std::vector<std::size_t> head_dims{64, 128};
  std::vector<const FloatFormat*> formats{&bf16, &fp16, &fp32};
  std::vector<DeviationInputs> inputs{DeviationInputs::normal, DeviationInputs::outliers};
  std::size_t tile = 64;        // keys per FlashAttention tile (Bc)
  std::size_t query_rows = 16;  // query rows sampled per point
  std::uint64_t seed = 20241008;
  unsigned threads = 0;  // 0: every core; results do not depend on it
};

struct Deviation {
  double max_absolute = 0;
  double max_ulps = 0;
  double rmse = 0;
  double correctly_rounded = 0;  // fraction of outputs equal to the correctly rounded value
};

struct DeviationPoint {
  const FloatFormat* format = nullptr;
  DeviationInputs inputs = DeviationInputs::normal;
  std::size_t head_dim = 0;
  std::size_t n = 0;
  Deviation naive, flash;
  [[nodiscard]] double ratio() const;  // flash max |error| / naive max |error| (infinite when naive is exact)
};

struct DeviationStudy {
  DeviationSettings settings;
  std::vector<DeviationPoint> points;  // format, inputs, head dim, n (outermost first)
};

// The kernels, on queries (rows x d), keys (n x d) and values (n x d) holding values of `format`.
[[nodiscard]] Matrix naive_attention_in(const FloatFormat& format, const Matrix& queries, const Matrix& keys,
                                        const Matrix& values);
[[nodiscard]] Matrix flash_attention_in(const FloatFormat& format, const Matrix& queries, const Matrix& keys,
                                        const Matrix& values, std::size_t tile);

// Normal(0, 1) entries (DeterministicRandom::normal) rounded to `format`, with outliers as
// `inputs` says: the same on every machine and compiler for the same generator state.
[[nodiscard]] Matrix random_attention_inputs(std::size_t rows, std::size_t cols, const FloatFormat& format,
                                             DeviationInputs inputs, DeterministicRandom& random);

// Deviation of outputs from the correctly rounded ones, in `format`.
[[nodiscard]] Deviation deviation_of(const Matrix& actual, const Matrix& expected, const FloatFormat& format);

// InputError for a size, head dimension, tile or row count of 0, or a size over 2^20.
[[nodiscard]] DeviationStudy run_deviation_study(const DeviationSettings& settings);

}  // namespace sharpcheck::studies
