#include "kernels/registry.hpp"

#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.hpp"
#include "kernels/attention_kernels.hpp"
#include "kernels/escape_kernels.hpp"
#include "kernels/quantized_softmax.hpp"
#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
namespace {

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

float kernel_scale(double theta) { return static_cast<float>(1.0 / theta); }

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

void blocked(const float* logits, float* out, std::size_t n, float scale) {
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
void run_attention(const Matrix& queries, const Matrix& keys, const Matrix& values, const tensor::HeadScores& scores,
                   Matrix& out, std::vector<double>* lse, const FloatFormat& format, Kernel kernel) {
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

void attention_naive(const Matrix& q, const Matrix& k, const Matrix& v, const tensor::HeadScores& scores, Matrix& out,
                     std::vector<double>* lse) {
  run_attention<float>(q, k, v, scores, out, lse, fp32, attention_naive_fp32);
}
void attention_flash(const Matrix& q, const Matrix& k, const Matrix& v, const tensor::HeadScores& scores, Matrix& out,
                     std::vector<double>* lse) {
  run_attention<float>(q, k, v, scores, out, lse, fp32, [](auto... arguments) { attention_flash_fp32(arguments...); });
}
void attention_flash_bf16_inputs(const Matrix& q, const Matrix& k, const Matrix& v, const tensor::HeadScores& scores,
                                 Matrix& out, std::vector<double>* lse) {
  run_attention<Bfloat16>(q, k, v, scores, out, lse, bf16,
                          [](auto... arguments) { attention_flash_bf16(arguments...); });
}

const SoftmaxKernel softmax_table[] = {
    {"naive", "fp32, no max shift: exp overflows once logits pass ~88 (kept to prove the gate catches it)",
     Operation::softmax, &fp32, &fp32, &fp32, true, run_rows<float, softmax_naive_fp32>},
    {"safe3", "fp32, three passes: max, exp and sum, normalise (Highway SIMD)", Operation::softmax, &fp32,
     &fp32, &fp32, false, run_rows<float, softmax_safe3_fp32>},
    {"online2", "fp32, Milakov-Gimelshein online normaliser: one pass for max and sum, one to normalise",
     Operation::softmax, &fp32, &fp32, &fp32, false, run_rows<float, softmax_online2_fp32>},
    {"blocked", "fp32, per-tile max and sum over tiles of 256 merged online, as FlashAttention does",
     Operation::softmax, &fp32, &fp32, &fp32, false, run_rows<float, blocked>},
    {"safe3_bf16", "bf16 in and out, fp32 accumulation (safe3)", Operation::softmax, &bf16, &bf16, &fp32,
     false, run_rows<Bfloat16, softmax_safe3_bf16>},
    {"online2_bf16", "bf16 in and out, fp32 accumulation (online2)", Operation::softmax, &bf16, &bf16, &fp32,
     false, run_rows<Bfloat16, softmax_online2_bf16>},
    {"safe3_fp16", "fp16 in and out, fp32 accumulation (safe3)", Operation::softmax, &fp16, &fp16, &fp32,
     false, run_rows<Float16, softmax_safe3_fp16>},
    {"online2_fp16", "fp16 in and out, fp32 accumulation (online2)", Operation::softmax, &fp16, &fp16, &fp32,
     false, run_rows<Float16, softmax_online2_fp16>},
    {"bf16acc", "bf16 with a bf16 running sum that stalls at 256 (kept to prove the gate catches it)",
     Operation::softmax, &bf16, &bf16, &bf16, true, run_rows<Bfloat16, softmax_bf16_accumulator>},
    {"int8",
     "TFLite-style int8 softmax: exp lookup table over 256 code differences, float sum, out scale 1/256, zp "
     "-128",
     Operation::softmax, &q8_logits, &q8_probabilities, &fp32, false,
     run_quantized<std::int8_t, softmax_int8, -128>},
    {"uint8", "TFLite-style softmax to uint8: exp lookup table, float sum, out scale 1/256, zero point 0",
     Operation::softmax, &q8_logits, &q8_probabilities, &fp32, false,
     run_quantized<std::uint8_t, softmax_uint8, 0>},
    {"adaptive",
     "fp32 adaptive temperature exactly as the paper's code (entropy, polynomial beta, re-softmax)",
     Operation::adaptive_temperature, &fp32, &fp32, &fp32, false, run_rows<float, softmax_adaptive_fp32>},
    {"adaptive_streaming",
     "fp32 adaptive temperature with the entropy from the online pass (logits read twice)",
     Operation::adaptive_temperature, &fp32, &fp32, &fp32, false,
     run_rows<float, softmax_adaptive_streaming_fp32>},
    {"adaptive_bf16", "bf16 in and out, the fp32 adaptive kernel inside", Operation::adaptive_temperature,
     &bf16, &bf16, &fp32, false, run_rows<Bfloat16, narrow_through_fp32<Bfloat16, softmax_adaptive_fp32>>},
    {"ssmax", "fp32 scalable softmax (SSMax): safe3 at scale s ln n, s = 1/theta",
     Operation::scalable_softmax, &fp32, &fp32, &fp32, false, run_rows<float, scalable_softmax_fp32>},
    {"ssmax_bf16", "bf16 in and out, the fp32 SSMax kernel inside", Operation::scalable_softmax, &bf16, &bf16,
     &fp32, false, run_rows<Bfloat16, narrow_through_fp32<Bfloat16, scalable_softmax_fp32>>},
    {"length_scaled", "fp32 softmax with logits scaled by max(1, ln n / ln 16) (Qwen's logn attention)",
     Operation::length_scaled_softmax, &fp32, &fp32, &fp32, false,
     run_rows<float, length_scaled_softmax_fp32>},
    {"length_scaled_bf16", "bf16 in and out, the fp32 length-scaled kernel inside",
     Operation::length_scaled_softmax, &bf16, &bf16, &fp32, false,
     run_rows<Bfloat16, narrow_through_fp32<Bfloat16, length_scaled_softmax_fp32>>},
    {"sigmoid", "fp32 sigmoid attention weights sigmoid(e/theta - ln n), stable for both signs",
     Operation::sigmoid_attention, &fp32, &fp32, &fp32, false, run_rows<float, sigmoid_attention_fp32>},
    {"sigmoid_bf16", "bf16 in and out, the fp32 sigmoid kernel inside", Operation::sigmoid_attention, &bf16,
     &bf16, &fp32, false, run_rows<Bfloat16, narrow_through_fp32<Bfloat16, sigmoid_attention_fp32>>},
    {"stick_breaking", "fp32 stick-breaking weights in log space (running softplus sum from the nearest key)",
     Operation::stick_breaking, &fp32, &fp32, &fp32, false, run_rows<float, stick_breaking_fp32>},
    {"stick_breaking_bf16", "bf16 in and out, the fp32 stick-breaking kernel inside",
     Operation::stick_breaking, &bf16, &bf16, &fp32, false,
     run_rows<Bfloat16, narrow_through_fp32<Bfloat16, stick_breaking_fp32>>},
};

const AttentionKernel attention_table[] = {
    {"attention_naive", "fp32, materialises the score row, three-pass softmax, weighted sum", &fp32, &fp32,
     &fp32, false, attention_naive},
    {"attention_flash", "fp32, FlashAttention tiles of 64 keys with online softmax; no score row", &fp32,
     &fp32, &fp32, false, attention_flash},
    {"attention_flash_bf16", "bf16 Q, K, V and output, fp32 accumulation, FlashAttention tiles", &bf16, &bf16,
     &fp32, false, attention_flash_bf16_inputs},
};

}  // namespace

std::span<const SoftmaxKernel> softmax_kernels() { return softmax_table; }
std::span<const AttentionKernel> attention_kernels() { return attention_table; }

const SoftmaxKernel* find_softmax_kernel(std::string_view name) {
  for (const auto& kernel : softmax_table) {
    if (kernel.name == name) return &kernel;
  }
  return nullptr;
}

const AttentionKernel* find_attention_kernel(std::string_view name) {
  for (const auto& kernel : attention_table) {
    if (kernel.name == name) return &kernel;
  }
  return nullptr;
}

}  // namespace sharpcheck::kernels
