// The fast softmax kernels under test, on their native storage types, one row at a time.
//
// Every kernel computes softmax_j(e / theta) over a row of n logits, given scale = 1/theta
// rounded to float (as production kernels take it). -inf logits are masked entries. Kernels
// shift by the row's largest e * scale (the smallest e when scale < 0) unless said otherwise.
// Their error is what sharpcheck measures; their contracts are the entries of the tolerance
// table (metrics/tolerance_table.cpp), not promises made here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/storage.hpp"

namespace sharpcheck::kernels {

// fp32 in, fp32 out, fp32 accumulation; vectorised with Highway, dispatched at run time.
// No max shift: exp overflows to inf once e * scale passes about 88.7 (deliberately broken).
void softmax_naive_fp32(const float* logits, float* out, std::size_t n, float scale);
// Three passes: max; exp and sum (exponentials stored in out); multiply by 1/sum.
void softmax_safe3_fp32(const float* logits, float* out, std::size_t n, float scale);
// Milakov-Gimelshein online normaliser: one pass keeps a running max and a sum rescaled
// whenever the max grows (per SIMD lane, merged at the end); a second pass normalises.
void softmax_online2_fp32(const float* logits, float* out, std::size_t n, float scale);
// FlashAttention-style: (max, sum) per tile of `tile` logits, tiles merged by the online rule.
void softmax_blocked_fp32(const float* logits, float* out, std::size_t n, float scale,
                          std::size_t tile = 256);

// bf16 / fp16 in and out, fp32 accumulation: the fp32 cores read and write the narrow format
// themselves (no widening passes), giving exactly the fp32 kernel's values on the widened row,
// each rounded to nearest even into the narrow format.
void softmax_safe3_bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale);
void softmax_online2_bf16(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale);
void softmax_safe3_fp16(const Float16* logits, Float16* out, std::size_t n, float scale);
void softmax_online2_fp16(const Float16* logits, Float16* out, std::size_t n, float scale);

// bf16 with a bf16 accumulator (deliberately broken): the running sum is rounded to bf16 after
// every addition, so adding 1 to 256 leaves 256 and a uniform row of 512 gives 1/256.
void softmax_bf16_accumulator(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale);

// Adaptive temperature exactly as the paper's code (fp32): p = softmax(e);
// H = sum(-p log(p + 1e-9)); beta = max(poly(H), 1) if H > 0.5 else 1, with
// poly(H) = -0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791; output softmax(beta e).
// `scale` multiplies e first, as for the other kernels (the paper uses scale 1).
void softmax_adaptive_fp32(const float* logits, float* out, std::size_t n, float scale);
// The same map from a streaming pass: the online pass also accumulates sum(e_i exp(e_i - m))
// so H = log Z - sum(p_i e_i) comes without a stored p (no 1e-9 term: exact entropy); a second
// pass over the logits writes exp(beta (e - m)) and sums it; a last pass over the output
// normalises. Reads the logits twice in all.
void softmax_adaptive_streaming_fp32(const float* logits, float* out, std::size_t n, float scale);

// Row conversions for the narrow kernels (SIMD, dispatched): widening is exact, narrowing rounds
// to nearest even exactly as Bfloat16::from_float and Float16::from_float do.
void widen(const Bfloat16* in, float* out, std::size_t n);
void narrow(const float* in, Bfloat16* out, std::size_t n);
void widen(const Float16* in, float* out, std::size_t n);
void narrow(const float* in, Float16* out, std::size_t n);

// Runs an fp32 row kernel on a row of narrow values: widen (exact), compute, round once.
template <typename Storage>
void through_fp32(const Storage* logits, Storage* out, std::size_t n, float scale,
                  void (*core)(const float*, float*, std::size_t, float)) {
  thread_local std::vector<float> widened;
  thread_local std::vector<float> result;
  widened.resize(n);
  result.resize(n);
  widen(logits, widened.data(), n);
  core(widened.data(), result.data(), n, scale);
  narrow(result.data(), out, n);
}

// through_fp32 with the core fixed at compile time: a narrow kernel the registry can point to.
template <typename Storage, void (*Core)(const float*, float*, std::size_t, float)>
void narrow_through_fp32(const Storage* logits, Storage* out, std::size_t n, float scale) {
  through_fp32(logits, out, n, scale, Core);
}

// The paper's polynomial and clamp: beta(H) = max(poly(H), 1) for H > 0.5, else 1.
[[nodiscard]] float adaptive_inverse_temperature(float entropy);

}  // namespace sharpcheck::kernels
