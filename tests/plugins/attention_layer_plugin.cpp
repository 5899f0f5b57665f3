// A plugin that implements every version-3 attention feature (kernels/plugin_abi.h) in fp32 and
// bf16 with fp32 accumulation, and, chosen at compile time (SHARPCHECK_LAYER_MUTANT), mutants that
// each get one feature wrong the way real ports did: 1 ignores the window, 2 aligns causal
// top-left, 3 skips the sink, 4 forgets GQA's mapping (h % kv_heads), 5 drops the soft-cap,
// 6 ignores ALiBi, 7 reads padded keys, 8 returns a log-sum-exp off by 1e-3.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {

constexpr int mutant = SHARPCHECK_LAYER_MUTANT;

float load(uint32_t format, const void* data, size_t i) {
  if (format == SHARPCHECK_FP32) return static_cast<const float*>(data)[i];
  const std::uint32_t word = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(data)[i]) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

void store(uint32_t format, void* data, size_t i, float value) {
  if (format == SHARPCHECK_FP32) {
    static_cast<float*>(data)[i] = value;
    return;
  }
  std::uint32_t word;
  std::memcpy(&word, &value, 4);
  static_cast<std::uint16_t*>(data)[i] =
      static_cast<std::uint16_t>((word + 0x7FFFU + ((word >> 16) & 1U)) >> 16);
}

bool sees(const sharpcheck_attention_call& c, size_t i, size_t j) {
  const size_t limit = mutant == 7 ? c.keys : c.valid_keys;
  if (j >= limit) return false;
  const bool bottom_right = c.bottom_right != 0 && mutant != 2;
  const auto diagonal =
      bottom_right ? static_cast<int64_t>(c.valid_keys) - static_cast<int64_t>(c.queries) : 0;
  const int64_t aligned = static_cast<int64_t>(i) + diagonal;
  const auto jj = static_cast<int64_t>(j);
  if (c.causal != 0 && jj > aligned) return false;
  if (mutant == 1) return true;
  if (c.window_left >= 0 && jj < aligned - c.window_left) return false;
  if (c.window_right >= 0 && jj > aligned + c.window_right) return false;
  return true;
}

// One query row of head h: logits, the safe softmax with the sink, the weighted sum.
void attend_row(uint32_t format, const void* q, const void* k, const void* v, void* out,
                const sharpcheck_attention_call& c, size_t h, size_t i) {
  const size_t kv = mutant == 4 ? h % c.kv_heads : h / (c.heads / c.kv_heads);
  const bool bottom_right = c.bottom_right != 0 && mutant != 2;
  const auto diagonal =
      bottom_right ? static_cast<int64_t>(c.valid_keys) - static_cast<int64_t>(c.queries) : 0;
  std::vector<float> logits(c.keys, -std::numeric_limits<float>::infinity());
  float largest = (c.sinks != nullptr && mutant != 3) ? c.sinks[h] : -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < c.keys; ++j) {
    if (!sees(c, i, j)) continue;
    float s = 0;
    for (size_t t = 0; t < c.dim; ++t)
      s += load(format, q, (h * c.queries + i) * c.dim + t) * load(format, k, (kv * c.keys + j) * c.dim + t);
    s *= c.scale;
    if (c.softcap != 0 && mutant != 5) s = c.softcap * std::tanh(s / c.softcap);
    if (c.alibi_slopes != nullptr && mutant != 6)
      s -= c.alibi_slopes[h] *
           static_cast<float>(std::llabs(static_cast<int64_t>(i) + diagonal - static_cast<int64_t>(j)));
    logits[j] = s;
    largest = std::fmax(largest, s);
  }
  float sum = (c.sinks != nullptr && mutant != 3) ? std::exp(c.sinks[h] - largest) : 0.0F;
  std::vector<float> accumulator(c.value_dim, 0.0F);
  for (size_t j = 0; j < c.keys; ++j) {
    if (logits[j] == -std::numeric_limits<float>::infinity()) continue;
    const float w = std::exp(logits[j] - largest);
    sum += w;
    for (size_t col = 0; col < c.value_dim; ++col)
      accumulator[col] += w * load(format, v, (kv * c.keys + j) * c.value_dim + col);
  }
  for (size_t col = 0; col < c.value_dim; ++col)
    store(format, out, (h * c.queries + i) * c.value_dim + col, sum == 0 ? 0.0F : accumulator[col] / sum);
  if (c.lse != nullptr) {
    c.lse[h * c.queries + i] = sum == 0 ? -std::numeric_limits<float>::infinity()
                                        : largest + std::log(sum) + (mutant == 8 ? 1e-3F : 0.0F);
  }
}

const sharpcheck_plugin_description info{SHARPCHECK_PLUGIN_ABI_VERSION,
                                         SHARPCHECK_TEST_PLUGIN_NAME,
                                         "every version-3 attention feature, scalar",
                                         0,
                                         SHARPCHECK_FP32 | SHARPCHECK_BF16,
                                         SHARPCHECK_ATTENTION_SCALE | SHARPCHECK_ATTENTION_CAUSAL |
                                             SHARPCHECK_ATTENTION_BOTTOM_RIGHT | SHARPCHECK_ATTENTION_WINDOW |
                                             SHARPCHECK_ATTENTION_SOFTCAP | SHARPCHECK_ATTENTION_ALIBI |
                                             SHARPCHECK_ATTENTION_SINK | SHARPCHECK_ATTENTION_GQA |
                                             SHARPCHECK_ATTENTION_LSE | SHARPCHECK_ATTENTION_KEY_PADDING};

}  // namespace

extern "C" const sharpcheck_plugin_description* sharpcheck_plugin_info() { return &info; }

extern "C" int sharpcheck_attention_layer(uint32_t format, const void* q, const void* k, const void* v,
                                          void* out, const sharpcheck_attention_call* call) {
  if (format != SHARPCHECK_FP32 && format != SHARPCHECK_BF16) return 1;
  for (size_t h = 0; h < call->heads; ++h) {
    for (size_t i = 0; i < call->queries; ++i) attend_row(format, q, k, v, out, *call, h, i);
  }
  return 0;
}

// The version-2 entry: one head, top-left causal.
extern "C" int sharpcheck_attention(uint32_t format, const void* q, const void* k, const void* v, void* out,
                                    size_t queries, size_t keys, size_t dim, size_t value_dim, float scale,
                                    int causal) {
  const sharpcheck_attention_call call{1,      1, queries, keys, keys, dim,     value_dim, scale,
                                       causal, 0, -1,      -1,   0.0F, nullptr, nullptr,   nullptr};
  return sharpcheck_attention_layer(format, q, k, v, out, &call);
}
