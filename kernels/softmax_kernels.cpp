#include "kernels/softmax_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sharpcheck::kernels {
namespace {

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// The unmasked logit that maximises e * scale.
float shift_for(const float* logits, std::size_t n, float scale) {
  float shift = scale < 0 ? std::numeric_limits<float>::infinity() : negative_infinity;
  for (std::size_t i = 0; i < n; ++i) {
    if (logits[i] == negative_infinity) continue;
    shift = scale < 0 ? std::min(shift, logits[i]) : std::max(shift, logits[i]);
  }
  return shift;
}

}  // namespace

void softmax_bf16_accumulator(const Bfloat16* logits, Bfloat16* out, std::size_t n, float scale) {
  thread_local std::vector<float> widened;
  widened.resize(n);
  for (std::size_t i = 0; i < n; ++i) widened[i] = logits[i].to_float();
  const float shift = shift_for(widened.data(), n, scale);
  Bfloat16 sum = Bfloat16::from_float(0.0F);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] =
        Bfloat16::from_float(widened[i] == negative_infinity ? 0.0F : std::exp((widened[i] - shift) * scale));
    sum = Bfloat16::from_float(sum.to_float() + out[i].to_float());  // the bug: a bf16 running sum
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = Bfloat16::from_float(out[i].to_float() / sum.to_float());
}

float adaptive_inverse_temperature(float entropy) {
  if (!(entropy > 0.5F)) return 1.0F;
  const float h = entropy;
  // Horner's rule, as jnp.polyval evaluates the paper's coefficients.
  const float poly = (((-0.037F * h + 0.481F) * h - 2.3F) * h + 4.917F) * h - 1.791F;
  return std::max(poly, 1.0F);
}

void softmax_adaptive_fp32(const float* logits, float* out, std::size_t n, float scale) {
  softmax_safe3_fp32(logits, out, n, scale);
  float entropy = 0.0F;
  for (std::size_t i = 0; i < n; ++i) entropy += -out[i] * std::log(out[i] + 1e-9F);
  const float beta = adaptive_inverse_temperature(entropy);
  softmax_safe3_fp32(logits, out, n, scale * beta);
}

void softmax_adaptive_streaming_fp32(const float* logits, float* out, std::size_t n, float scale) {
  // Pass 1 (logits): running max m of t = e * scale, Z = sum exp(t - m), A = sum t exp(t - m),
  // both rescaled when m grows. Then H = log Z - A / Z (the shift cancels).
  float running_max = -std::numeric_limits<float>::infinity();
  float normaliser = 0.0F;
  float weighted = 0.0F;
  for (std::size_t i = 0; i < n; ++i) {
    if (logits[i] == negative_infinity) continue;
    const float t = logits[i] * scale;
    if (t > running_max) {
      const float rescale = std::exp(running_max - t);
      normaliser *= rescale;
      weighted = weighted * rescale;
      // A is kept relative to the current max: sum (t_i - m) exp(t_i - m); moving m to t adds
      // (m_old - t) * Z_old after rescaling.
      weighted +=
          (running_max == -std::numeric_limits<float>::infinity() ? 0.0F : (running_max - t) * normaliser);
      running_max = t;
    }
    const float w = std::exp(t - running_max);
    normaliser += w;
    weighted += (t - running_max) * w;
  }
  const float entropy = std::log(normaliser) - weighted / normaliser;
  const float beta = adaptive_inverse_temperature(entropy);
  // Pass 2 (logits): exp(beta (t - m)) and its sum; beta >= 1 > 0 keeps m the maximum.
  float sum = 0.0F;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = logits[i] == negative_infinity ? 0.0F : std::exp(beta * (logits[i] * scale - running_max));
    sum += out[i];
  }
  // Pass 3 (output only): normalise.
  const float inverse = 1.0F / sum;
  for (std::size_t i = 0; i < n; ++i) out[i] *= inverse;
}

}  // namespace sharpcheck::kernels
