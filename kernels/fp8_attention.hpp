// FP8 attention as FlashAttention 3 computes it, a kernel under test (issue 20): Q, K and V in
// fp8 e4m3 with descale factors (one per tensor, or one per block of rows), optionally rotated by
// a random Hadamard matrix first ("incoherent processing", which spreads outliers over the head
// dimension), and the producer-side quantisation that makes such inputs.
//
// The kernel, per query row (one head; masks and modifiers as tensor/head_scores.hpp says):
//   score  s_j = logit(fl(fl(q8 . k8) * fl(qd * kd)))  the dot product of e4m3 payloads in fp32
//               (each product exact), times the descales, then kernels/logit_maker.hpp's logit;
//   online softmax over tiles of `tile` visible keys, as attention_flash_fp32, but with
//   P scaled by 2^8 (FlashAttention 3's max offset: the largest weight is 256, using e4m3's
//   range up to 448) and rounded to e4m3 with saturation (cvt .satfinite) before P V;
//   the normaliser l summed from the unrounded fp32 weights; V dequantised per key,
//   fl(v8 * vd); the output acc / l rounded once to bf16; the log-sum-exp in fp32.
// rescale_threshold > 0 gives FlashAttention 4's conditional rescaling: the running max moves
// only when a tile's max exceeds it by more than the threshold. With fp8 P that is a bug: a score
// more than ln(448 / 256) (0.807 in log2 units) above the stale max saturates at 448.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/matrix.hpp"
#include "formats/storage.hpp"
#include "kernels/attention_kernels.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

// An e4m3 tensor (rows x cols, row-major) and its descale factors: value = payload * descale of
// the row's block (block_rows rows per factor; 0: one factor for the whole tensor).
struct Fp8Tensor {
  std::size_t rows = 0, cols = 0;
  std::vector<Float8E4M3> payload;
  std::vector<float> descales;
  std::size_t block_rows = 0;

  [[nodiscard]] float descale_of(std::size_t row) const {
    return block_rows == 0 ? descales.front() : descales[row / block_rows];
  }
  // The values the kernel computes with, exactly (payload * descale fits in a double).
  [[nodiscard]] Matrix dequantized() const;
};

// Quantises as FlashAttention 3's callers do: descale = amax / 448 of each block (per tensor
// when block_rows is 0), payload = RN_e4m3(x / descale). All-zero blocks get descale 1.
// InputError for a non-finite entry.
[[nodiscard]] Fp8Tensor quantize_e4m3(const Matrix& values, std::size_t block_rows);
// The same with descales that are powers of two, chosen so that each block's amax lies in
// (224, 448]: values that are already e4m3 values come back exactly (payload * descale = x).
[[nodiscard]] Fp8Tensor quantize_e4m3_exactly(const Matrix& values, std::size_t block_rows);

// x -> x H with H = D W / sqrt(d): W the Walsh-Hadamard matrix, D a diagonal of random signs
// drawn from `seed`. H is orthogonal, so (q H) . (k H) = q . k exactly in real arithmetic.
// InputError unless the number of columns is a power of two.
[[nodiscard]] Matrix hadamard_rotate(const Matrix& values, std::uint64_t seed);

struct Fp8AttentionOptions {
  std::size_t tile = 64;
  double rescale_threshold = 0;  // natural-log units; 0: rescale whenever the max grows
};

// Counts of probabilities rounded to e4m3, and of those clipped at 448 (saturated).
struct Fp8Saturation {
  std::size_t probabilities = 0;
  std::size_t saturated = 0;
};

// out: queries x value_dimension in bf16; lse (optional): one float per query. A query that
// sees no key and has no sink gets zeros and -inf, as attention_flash_fp32.
void attention_fp8(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v, Bfloat16* out, float* lse,
                   const tensor::HeadScores& scores, const Fp8AttentionOptions& options,
                   Fp8Saturation* saturation = nullptr);

}  // namespace sharpcheck::kernels
