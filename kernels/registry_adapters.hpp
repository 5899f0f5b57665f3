// Adapters from the native kernels (floats, bf16/fp16 storage, int8 codes) to the registry's
// uniform entry points over rows of doubles: inputs checked to be values of the kernel's input
// format, outputs widened exactly. Internal to kernels/registry.cpp.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.hpp"
#include "kernels/attention_kernels.hpp"
#include "kernels/escape_kernels.hpp"
#include "kernels/fp8_attention.hpp"
#include "kernels/mx_attention.hpp"
#include "kernels/quantized_softmax.hpp"
#include "kernels/registry.hpp"
#include "kernels/sage_attention.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels::adapters {

template <typename Storage>
Storage to_storage(double value, const FloatFormat& format, const char* what, std::size_t index) {
  if (!is_representable(value, format)) {
    throw InputError(InputProblem::out_of_range, std::string(what) + " " + std::to_string(index) + " (" +
                                                     hex_float(value) + ") is not a value of " +
                                                     std::string(format.name));
  }
  if constexpr (std::is_same_v<Storage, float>) {
    return static_cast<float>(value);
  } else {
    return Storage::from_float(static_cast<float>(value));
  }
}

template <typename Storage>
double from_storage(Storage value) {
  if constexpr (std::is_same_v<Storage, float>) {
    return value;
  } else {
    return value.to_float();
  }
}

template <typename Storage>
const FloatFormat& format_of() {
  if constexpr (std::is_same_v<Storage, float>) {
    return fp32;
  } else {
    return Storage::format;
  }
}

inline float kernel_scale(double theta) { return static_cast<float>(1.0 / theta); }

// Adapts a native row kernel to rows of doubles.
template <typename Storage, void (*Kernel)(const Storage*, Storage*, std::size_t, float)>
void run_rows(const Matrix& logits, double theta, Matrix& out) {
  const FloatFormat& format = format_of<Storage>();
  out = Matrix(logits.rows, logits.cols);
  std::vector<Storage> row(logits.cols);
  std::vector<Storage> result(logits.cols);
  for (std::size_t r = 0; r < logits.rows; ++r) {
    for (std::size_t j = 0; j < logits.cols; ++j)
      row[j] = to_storage<Storage>(logits(r, j), format, "logit", j);
    Kernel(row.data(), result.data(), logits.cols, kernel_scale(theta));
    for (std::size_t j = 0; j < logits.cols; ++j) out(r, j) = from_storage(result[j]);
  }
}

inline void blocked(const float* logits, float* out, std::size_t n, float scale) {
  softmax_blocked_fp32(logits, out, n, scale);
}

// Quantized kernels: logits are values of q8_logits (k/16), outputs codes with zero point zp.
template <typename Code, void (*Kernel)(const std::int8_t*, Code*, std::size_t, float), int ZeroPoint>
void run_quantized(const Matrix& logits, double theta, Matrix& out) {
  out = Matrix(logits.rows, logits.cols);
  std::vector<std::int8_t> codes(logits.cols);
  std::vector<Code> result(logits.cols);
  for (std::size_t r = 0; r < logits.rows; ++r) {
    for (std::size_t j = 0; j < logits.cols; ++j) {
      if (!is_representable(logits(r, j), q8_logits)) {
        throw InputError(InputProblem::out_of_range, "logit " + std::to_string(j) + " (" +
                                                         hex_float(logits(r, j)) +
                                                         ") is not a value of q8_logits (k/16, |k| <= 127)");
      }
      codes[j] = static_cast<std::int8_t>(logits(r, j) * 16);
    }
    Kernel(codes.data(), result.data(), logits.cols, kernel_scale(theta));
    for (std::size_t j = 0; j < logits.cols; ++j)
      out(r, j) = (static_cast<int>(result[j]) - ZeroPoint) / 256.0;
  }
}

template <typename Storage>
std::vector<Storage> matrix_to_storage(const Matrix& matrix, const FloatFormat& format, const char* what) {
  std::vector<Storage> values(matrix.values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = to_storage<Storage>(matrix.values[i], format, what, i);
  return values;
}

template <typename Storage, typename Kernel>
void run_attention(const Matrix& queries, const Matrix& keys, const Matrix& values,
                   const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse,
                   const FloatFormat& format, Kernel kernel) {
  const AttentionShape shape{queries.rows, keys.rows, queries.cols, values.cols};
  tensor::HeadScores head = scores;
  if (head.queries == 0) head.queries = shape.queries;
  if (head.keys == 0) head.keys = shape.keys;
  if (head.row_stride == 0) head.row_stride = shape.keys;
  const auto q = matrix_to_storage<Storage>(queries, format, "Q entry");
  const auto k = matrix_to_storage<Storage>(keys, format, "K entry");
  const auto v = matrix_to_storage<Storage>(values, format, "V entry");
  std::vector<Storage> result(shape.queries * shape.value_dimension);
  std::vector<float> lse32(lse != nullptr ? shape.queries : 0);
  kernel(q.data(), k.data(), v.data(), result.data(), lse != nullptr ? lse32.data() : nullptr, shape, head);
  out = Matrix(shape.queries, shape.value_dimension);
  for (std::size_t i = 0; i < result.size(); ++i) out.values[i] = from_storage(result[i]);
  if (lse != nullptr) lse->assign(lse32.begin(), lse32.end());
}

inline void attention_naive(const Matrix& q, const Matrix& k, const Matrix& v,
                            const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse) {
  run_attention<float>(q, k, v, scores, out, lse, fp32, attention_naive_fp32);
}
inline void attention_flash(const Matrix& q, const Matrix& k, const Matrix& v,
                            const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse) {
  run_attention<float>(q, k, v, scores, out, lse, fp32,
                       [](auto... arguments) { attention_flash_fp32(arguments...); });
}
inline void attention_flash_bf16_inputs(const Matrix& q, const Matrix& k, const Matrix& v,
                                        const tensor::HeadScores& scores, Matrix& out,
                                        std::vector<double>* lse) {
  run_attention<Bfloat16>(q, k, v, scores, out, lse, bf16,
                          [](auto... arguments) { attention_flash_bf16(arguments...); });
}

// FP8 attention on inputs that are e4m3 values: quantised with power-of-two descales (exact), so
// the reference on the same values judges the kernel's arithmetic alone.
template <std::size_t BlockRows, int RescaleThresholdLog2>
void attention_fp8_inputs(const Matrix& q, const Matrix& k, const Matrix& v, const tensor::HeadScores& scores,
                          Matrix& out, std::vector<double>* lse) {
  for (const auto& [matrix, what] :
       {std::pair{&q, "Q entry"}, std::pair{&k, "K entry"}, std::pair{&v, "V entry"}}) {
    for (std::size_t i = 0; i < matrix->values.size(); ++i)
      (void)to_storage<Float8E4M3>(matrix->values[i], fp8_e4m3, what, i);
  }
  Fp8AttentionOptions options;
  options.rescale_threshold = RescaleThresholdLog2 * 0.6931471805599453;
  std::vector<Bfloat16> result(q.rows * v.cols);
  std::vector<float> lse32(lse != nullptr ? q.rows : 0);
  attention_fp8(quantize_e4m3_exactly(q, BlockRows), quantize_e4m3_exactly(k, BlockRows),
                quantize_e4m3_exactly(v, BlockRows), result.data(), lse != nullptr ? lse32.data() : nullptr,
                scores, options);
  out = Matrix(q.rows, v.cols);
  for (std::size_t i = 0; i < result.size(); ++i) out.values[i] = result[i].to_float();
  if (lse != nullptr) lse->assign(lse32.begin(), lse32.end());
}

// MXFP8 attention (kernels/mx_attention.hpp) on bf16 inputs, which it quantises itself under the
// OCP floor rule it declares; Bug and the lazy-rescale threshold (log2 units) make the twins.
template <MxAttentionBug Bug, int RescaleThresholdLog2>
void attention_mxfp8_inputs(const Matrix& q, const Matrix& k, const Matrix& v,
                            const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse) {
  MxAttentionOptions options;
  options.bug = Bug;
  options.rescale_threshold_log2 = RescaleThresholdLog2;
  attention_mxfp8(q, k, v, scores, options, out, lse);
}

inline void mxfp8_floor_inputs(Matrix& q, Matrix& k, Matrix& v, const tensor::HeadScores& /*scores*/) {
  declared_mx_inputs(q, k, v, ScaleRule::ocp_floor);
}

// SageAttention-2-style attention (kernels/sage_attention.hpp) on bf16 inputs, which it quantises
// itself; Bug and the lazy-rescale threshold (log2 units) make the twins.
template <SageAttentionBug Bug, int RescaleThresholdLog2>
void attention_sage_inputs(const Matrix& q, const Matrix& k, const Matrix& v,
                           const tensor::HeadScores& scores, Matrix& out, std::vector<double>* lse) {
  SageAttentionOptions options;
  options.bug = Bug;
  options.rescale_threshold_log2 = RescaleThresholdLog2;
  attention_sage(q, k, v, scores, options, out, lse);
}

inline void sage_inputs(Matrix& q, Matrix& k, Matrix& v, const tensor::HeadScores& scores) {
  declared_sage_inputs(q, k, v, smooths_keys(scores));
}

}  // namespace sharpcheck::kernels::adapters
