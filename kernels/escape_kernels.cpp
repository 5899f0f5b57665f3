#include "kernels/escape_kernels.hpp"

#include <cmath>
#include <limits>

#include "kernels/softmax_kernels.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

std::size_t unmasked_count(const float* logits, std::size_t n) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += logits[i] != negative_infinity ? 1 : 0;
  return count;
}

// softplus(x) = ln(1 + e^x) without overflow (x > 0) or loss of tiny values (x <= 0).
float softplus(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

}  // namespace

void scalable_softmax_fp32(const float* logits, float* out, std::size_t n, float scale) {
  const auto length = static_cast<float>(unmasked_count(logits, n));
  softmax_safe3_fp32(logits, out, n, scale * std::log(length));
}

void length_scaled_softmax_fp32(const float* logits, float* out, std::size_t n, float scale) {
  const std::size_t length = unmasked_count(logits, n);
  const float factor =
      length > length_scaled_training_length
          ? std::log(static_cast<float>(length)) / std::log(static_cast<float>(length_scaled_training_length))
          : 1.0F;
  softmax_safe3_fp32(logits, out, n, scale * factor);
}

void sigmoid_attention_fp32(const float* logits, float* out, std::size_t n, float scale) {
  const float bias = -std::log(static_cast<float>(unmasked_count(logits, n)));
  for (std::size_t i = 0; i < n; ++i) {
    if (logits[i] == negative_infinity) {
      out[i] = 0.0F;
      continue;
    }
    const float x = logits[i] * scale + bias;
    if (x >= 0) {
      out[i] = 1.0F / (1.0F + std::exp(-x));
    } else {
      const float e = std::exp(x);
      out[i] = e / (1.0F + e);
    }
  }
}

void stick_breaking_fp32(const float* logits, float* out, std::size_t n, float scale) {
  float later = 0.0F;  // sum of softplus(z_k) over the unmasked keys after this one
  for (std::size_t i = n; i-- > 0;) {
    if (logits[i] == negative_infinity) {
      out[i] = 0.0F;
      continue;
    }
    const float z = logits[i] * scale;
    out[i] = std::exp(-softplus(-z) - later);
    later += softplus(z);
  }
}

}  // namespace sharpcheck::kernels
