#include "kernels/quantized_softmax.hpp"

#include <algorithm>
#include <array>
#include <cmath>

namespace sharpcheck::kernels {
namespace {

// p_i * 256, as TFLite computes it: table[d] = exp(-d * input_scale * beta) for d = max - q_i.
template <typename Store>
void quantized_softmax(const std::int8_t* codes, std::size_t n, float beta, Store store) {
  std::array<float, 256> table{};
  for (std::size_t d = 0; d < table.size(); ++d) {
    table[d] = std::exp(-static_cast<float>(d) * quantized_input_scale * beta);
  }
  const std::int8_t largest = *std::max_element(codes, codes + n);
  float sum = 0.0F;
  for (std::size_t i = 0; i < n; ++i) sum += table[static_cast<std::size_t>(largest - codes[i])];
  const float inverse = 256.0F / sum;
  for (std::size_t i = 0; i < n; ++i) {
    store(i, std::lround(table[static_cast<std::size_t>(largest - codes[i])] * inverse));
  }
}

}  // namespace

void softmax_int8(const std::int8_t* codes, std::int8_t* out, std::size_t n, float beta) {
  quantized_softmax(codes, n, beta, [&](std::size_t i, long scaled) {
    out[i] = static_cast<std::int8_t>(std::clamp(scaled - 128, -128L, 127L));
  });
}

void softmax_uint8(const std::int8_t* codes, std::uint8_t* out, std::size_t n, float beta) {
  quantized_softmax(codes, n, beta, [&](std::size_t i, long scaled) {
    out[i] = static_cast<std::uint8_t>(std::clamp(scaled, 0L, 255L));
  });
}

}  // namespace sharpcheck::kernels
