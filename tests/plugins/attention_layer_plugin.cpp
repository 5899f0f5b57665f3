// A plugin that implements every version-3 attention feature (kernels/plugin_abi.h) in fp32 and
// bf16 with fp32 accumulation, and, chosen at compile time (SHARPCHECK_LAYER_MUTANT), mutants that
// each get one feature wrong the way real ports did: 1 ignores the window, 2 aligns causal
// top-left, 3 skips the sink, 4 forgets GQA's mapping (h % kv_heads), 5 drops the soft-cap,
// 6 ignores ALiBi, 7 reads padded keys, 8 returns a log-sum-exp off by 1e-3, 9 forms the backward's
// D = rowsum(dO * O) from half the columns (a partial tile), 10 drops the gradient reaching the
// log-sum-exp in the backward (version 5's entry).
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

const sharpcheck_plugin_description info{
    SHARPCHECK_PLUGIN_ABI_VERSION,
    SHARPCHECK_TEST_PLUGIN_NAME,
    "every attention feature and the backward (ABI version 5), scalar",
    0,
    SHARPCHECK_FP32 | SHARPCHECK_BF16,
    SHARPCHECK_ATTENTION_SCALE | SHARPCHECK_ATTENTION_CAUSAL | SHARPCHECK_ATTENTION_BOTTOM_RIGHT |
        SHARPCHECK_ATTENTION_WINDOW | SHARPCHECK_ATTENTION_SOFTCAP | SHARPCHECK_ATTENTION_ALIBI |
        SHARPCHECK_ATTENTION_SINK | SHARPCHECK_ATTENTION_GQA | SHARPCHECK_ATTENTION_LSE |
        SHARPCHECK_ATTENTION_KEY_PADDING | SHARPCHECK_ATTENTION_BACKWARD |
        SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK,
    nullptr,
    0};

// One query row's softmax weights (one head; ALiBi and the sink as attend_row), each logit's
// slope d logit / d (q . k), and the sink's weight.
float row_weights(uint32_t format, const void* q, const void* k, const sharpcheck_attention_call& c, size_t i,
                  std::vector<float>& p, std::vector<float>& slope) {
  p.assign(c.keys, 0.0F);
  slope.assign(c.keys, 0.0F);
  const bool bottom_right = c.bottom_right != 0 && mutant != 2;
  const auto diagonal =
      bottom_right ? static_cast<int64_t>(c.valid_keys) - static_cast<int64_t>(c.queries) : 0;
  float largest = c.sinks != nullptr ? c.sinks[0] : -std::numeric_limits<float>::infinity();
  std::vector<float> logits(c.keys, -std::numeric_limits<float>::infinity());
  for (size_t j = 0; j < c.keys; ++j) {
    if (!sees(c, i, j)) continue;
    float s = 0;
    for (size_t t = 0; t < c.dim; ++t) s += load(format, q, i * c.dim + t) * load(format, k, j * c.dim + t);
    s *= c.scale;
    slope[j] = c.scale;
    if (c.softcap != 0 && mutant != 5) {
      const float t = std::tanh(s / c.softcap);
      s = c.softcap * t;
      slope[j] = c.scale * (1 - t * t);
    }
    if (c.alibi_slopes != nullptr && mutant != 6)
      s -= c.alibi_slopes[0] *
           static_cast<float>(std::llabs(static_cast<int64_t>(i) + diagonal - static_cast<int64_t>(j)));
    logits[j] = s;
    largest = std::fmax(largest, s);
  }
  float sum = c.sinks != nullptr ? std::exp(c.sinks[0] - largest) : 0.0F;
  const float sink_term = sum;
  for (size_t j = 0; j < c.keys; ++j) {
    if (logits[j] != -std::numeric_limits<float>::infinity()) sum += p[j] = std::exp(logits[j] - largest);
  }
  for (float& w : p) w = sum == 0 ? 0.0F : w / sum;
  return sum == 0 ? 0.0F : sink_term / sum;
}

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

namespace {

// One head's gradients, P recomputed per query row, D = rowsum(dO * O), fp32 sums; with d_lse
// the gradient reaching the log-sum-exp (dz += P g), with a sink its gradient P_sink (g - D).
int backward(uint32_t format, const void* q, const void* k, const void* v, const void* dout,
             const float* d_lse, void* dq, void* dk, void* dv, float* d, float* d_sinks,
             const sharpcheck_attention_call& c) {
  if (format != SHARPCHECK_FP32 && format != SHARPCHECK_BF16) return 1;
  if (c.heads != 1 || c.kv_heads != 1) return 2;
  std::vector<float> gq(c.queries * c.dim, 0.0F), gk(c.keys * c.dim, 0.0F), gv(c.keys * c.value_dim, 0.0F);
  std::vector<float> p, slope, out(c.value_dim);
  float g_sink = 0;
  for (size_t i = 0; i < c.queries; ++i) {
    const float sink_weight = row_weights(format, q, k, c, i, p, slope);
    std::fill(out.begin(), out.end(), 0.0F);
    for (size_t j = 0; j < c.keys; ++j) {
      for (size_t col = 0; col < c.value_dim; ++col)
        out[col] += p[j] * load(format, v, j * c.value_dim + col);
    }
    float big_d = 0;
    const size_t columns = mutant == 9 ? c.value_dim / 2 : c.value_dim;
    for (size_t col = 0; col < columns; ++col) big_d += load(format, dout, i * c.value_dim + col) * out[col];
    if (d != nullptr) d[i] = big_d;
    const float g = d_lse != nullptr && mutant != 10 ? d_lse[i] : 0.0F;
    g_sink += sink_weight * (g - big_d);
    for (size_t j = 0; j < c.keys; ++j) {
      if (p[j] == 0) continue;
      float dp = 0;
      for (size_t col = 0; col < c.value_dim; ++col)
        dp += load(format, dout, i * c.value_dim + col) * load(format, v, j * c.value_dim + col);
      const float dr = p[j] * (dp - big_d + g) * slope[j];
      for (size_t t = 0; t < c.dim; ++t) {
        gq[i * c.dim + t] += dr * load(format, k, j * c.dim + t);
        gk[j * c.dim + t] += dr * load(format, q, i * c.dim + t);
      }
      for (size_t col = 0; col < c.value_dim; ++col)
        gv[j * c.value_dim + col] += p[j] * load(format, dout, i * c.value_dim + col);
    }
  }
  for (size_t e = 0; e < gq.size(); ++e) store(format, dq, e, gq[e]);
  for (size_t e = 0; e < gk.size(); ++e) store(format, dk, e, gk[e]);
  for (size_t e = 0; e < gv.size(); ++e) store(format, dv, e, gv[e]);
  if (d_sinks != nullptr && c.sinks != nullptr) d_sinks[0] = g_sink;
  // Mutant 11 writes 16 floats past its one-float d_sinks, as a port that sized it by heads did:
  // no unmapped page is reached, so only the host's canary sees it.
  if (mutant == 11 && d_sinks != nullptr && c.sinks != nullptr) {
    for (int z = 1; z <= 16; ++z) d_sinks[z] = 12345.0F;
  }
  return 0;
}

}  // namespace

// Version 4: one head's gradients.
extern "C" int sharpcheck_attention_backward(uint32_t format, const void* q, const void* k, const void* v,
                                             const void* dout, void* dq, void* dk, void* dv, float* d,
                                             const sharpcheck_attention_call* call) {
  return backward(format, q, k, v, dout, nullptr, dq, dk, dv, d, nullptr, *call);
}

// Version 5: with the gradient reaching the log-sum-exp and the sink's gradient.
extern "C" int sharpcheck_attention_backward_lse(uint32_t format, const void* q, const void* k, const void* v,
                                                 const void* dout, const float* d_lse, void* dq, void* dk,
                                                 void* dv, float* d, float* d_sinks,
                                                 const sharpcheck_attention_call* call) {
  return backward(format, q, k, v, dout, d_lse, dq, dk, dv, d, d_sinks, *call);
}
