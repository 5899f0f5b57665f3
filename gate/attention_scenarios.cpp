#include "gate/attention_scenarios.hpp"

#include <algorithm>
#include <cmath>

#include "core/random.hpp"
#include "kernels/plugin_abi.h"

namespace sharpcheck::gate {
namespace {

using tensor::AttentionProblem;
using tensor::AttentionShape;

constexpr std::uint32_t bottom_right = SHARPCHECK_ATTENTION_CAUSAL | SHARPCHECK_ATTENTION_BOTTOM_RIGHT;

void causal_bottom_right(AttentionProblem& p) {
  p.scores.causal = true;
  p.scores.alignment = tensor::DiagonalAlignment::bottom_right;
}

AttentionShape shape(std::size_t batch, std::size_t heads, std::size_t kv_heads, std::size_t queries,
                     std::size_t keys, std::size_t head_dim) {
  return {.batch = batch,
          .heads = heads,
          .kv_heads = kv_heads,
          .queries = queries,
          .keys = keys,
          .head_dim = head_dim,
          .value_dim = head_dim};
}

// The problems, one function each (shape(batch, heads, kv_heads, queries, keys, head_dim)).
void mqa_causal_uneven(AttentionProblem& p) {
  p.shape = shape(1, 2, 1, 113, 203, 59);
  causal_bottom_right(p);
}
void sliding_window(AttentionProblem& p) {
  p.shape = shape(1, 1, 1, 1023, 1024, 32);
  causal_bottom_right(p);
  p.scores.window_left = 127;
  p.scores.window_right = 0;
}
void gqa_softcap_50(AttentionProblem& p) {
  p.shape = shape(2, 4, 2, 61, 97, 111);
  p.scores.softcap = 50;
}
void softcap_2_causal(AttentionProblem& p) {
  p.shape = shape(1, 2, 2, 64, 64, 64);
  p.scores.causal = true;
  p.scores.softcap = 2;
}
void alibi_causal(AttentionProblem& p) {
  p.shape = shape(1, 4, 4, 64, 96, 128);
  causal_bottom_right(p);
  p.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};  // BLOOM's slopes for 4 heads: 2^(-8h/4)
}
// Gemma 2's cap with ALiBi: the cap must apply before the bias (a kernel that caps the biased score
// squeezes far keys' penalties into 30).
void softcap_30_alibi_causal(AttentionProblem& p) {
  p.shape = shape(1, 2, 2, 48, 80, 64);
  causal_bottom_right(p);
  p.scores.softcap = 30;
  p.alibi_slopes = {0.5, 0.125};
}
void sinks(AttentionProblem& p) {
  p.shape = shape(1, 2, 2, 33, 129, 256);
  p.sinks = {1.5, -0.5};
}
void kv_cache_decode(AttentionProblem& p) {
  p.shape = shape(1, 8, 2, 1, 1024, 128);
  causal_bottom_right(p);
}
void key_padding(AttentionProblem& p) {
  p.shape = shape(2, 2, 2, 40, 80, 64);  // not causal: every query could reach the padding
  p.key_lengths = {80, 57};
}
void packed_varlen(AttentionProblem& p) {
  p.shape = shape(2, 2, 2, 0, 0, 64);
  p.layout = tensor::Layout::packed;
  p.cu_seqlens_q = {0, 17, 60};
  p.cu_seqlens_k = {0, 30, 101};
  causal_bottom_right(p);
}
void additive_mask(AttentionProblem& p) { p.shape = shape(1, 2, 1, 16, 48, 32); }
void late_dominant_key(AttentionProblem& p) { p.shape = shape(1, 1, 1, 64, 512, 64); }
void probe(AttentionProblem& p) { p.shape = shape(1, 2, 2, 16, 256, 64); }

// A padding mask as Hugging Face adds it (finfo(float32).min), BERT's -1e4, and -inf.
void padding_bias(ScenarioInputs& inputs, const FloatFormat&) {
  const tensor::AttentionShape& s = inputs.problem.shape;
  inputs.bias.resize(s.queries * s.keys);
  for (std::size_t i = 0; i < inputs.bias.size(); ++i) {
    const std::size_t key = i % s.keys;
    inputs.bias[i] =
        key >= 40 ? -3.4028234663852886e38 : (key % 7 == 3 ? -1e4 : (key % 11 == 5 ? -INFINITY : 0.0));
  }
  inputs.problem.bias = inputs.bias;
}
// Query i's dominant key is 448 + i, in the last tile of 64: its score 0.75 |q_i|^2 / 8 (about 6) is
// some 3.5 above every earlier tile's max (about 2.5): enough to dominate the row, too little for a
// lazily rescaling kernel (FlashAttention 4's threshold is 8 in log2 units) to move its running
// max, so one whose weights saturate (e4m3 P) or whose stale max is otherwise wrong shows it.
void plant_dominant_keys(ScenarioInputs& inputs, const FloatFormat& format) {
  const std::size_t d = inputs.problem.shape.head_dim;
  for (std::size_t i = 0; i < inputs.problem.shape.queries; ++i) {
    for (std::size_t t = 0; t < d; ++t)
      inputs.k[(448 + i) * d + t] = round_to_format(0.75 * inputs.q[i * d + t], format);
  }
}
// 3, not 1: an expected 1 is not informative (the judge's MISTRUSTED rule).
void constant_v(ScenarioInputs& inputs, const FloatFormat&) {
  std::fill(inputs.v.begin(), inputs.v.end(), 3.0);
}
void zero_q(ScenarioInputs& inputs, const FloatFormat&) { std::fill(inputs.q.begin(), inputs.q.end(), 0.0); }

constexpr AttentionScenario scenarios[] = {
    {.name = "causal_bottom_right_113x203_d59_mqa",
     .plugin_features = bottom_right | SHARPCHECK_ATTENTION_GQA | SHARPCHECK_ATTENTION_LSE,
     .problem = mqa_causal_uneven},
    {.name = "window_127_0_1023x1024_d32",
     .plugin_features = bottom_right | SHARPCHECK_ATTENTION_WINDOW | SHARPCHECK_ATTENTION_LSE,
     .problem = sliding_window},
    {.name = "gqa_4_2_softcap_50_61x97_d111",
     .plugin_features = SHARPCHECK_ATTENTION_GQA | SHARPCHECK_ATTENTION_SOFTCAP,
     .problem = gqa_softcap_50},
    {.name = "softcap_2_causal_64x64_d64",
     .plugin_features = SHARPCHECK_ATTENTION_CAUSAL | SHARPCHECK_ATTENTION_SOFTCAP,
     .problem = softcap_2_causal},
    {.name = "alibi_causal_64x96_d128",
     .plugin_features = bottom_right | SHARPCHECK_ATTENTION_ALIBI,
     .problem = alibi_causal},
    {.name = "sinks_33x129_d256",
     .plugin_features = SHARPCHECK_ATTENTION_SINK | SHARPCHECK_ATTENTION_LSE,
     .problem = sinks},
    {.name = "softcap_30_alibi_causal_48x80_d64",
     .plugin_features =
         bottom_right | SHARPCHECK_ATTENTION_SOFTCAP | SHARPCHECK_ATTENTION_ALIBI | SHARPCHECK_ATTENTION_LSE,
     .problem = softcap_30_alibi_causal},
    {.name = "kv_cache_decode_1x1024_d128_gqa_8_2",
     .plugin_features = bottom_right | SHARPCHECK_ATTENTION_GQA | SHARPCHECK_ATTENTION_LSE,
     .problem = kv_cache_decode},
    {.name = "key_padding_2x40x80_d64",
     .plugin_features = SHARPCHECK_ATTENTION_KEY_PADDING,
     .problem = key_padding},
    {.name = "packed_varlen_17_43_d64", .plugin_features = bottom_right, .problem = packed_varlen},
    {.name = "additive_mask_16x48_d32",
     .plugin_callable = false,
     .problem = additive_mask,
     .tensors = padding_bias},
    {.name = "late_dominant_key_64x512_d64", .problem = late_dominant_key, .tensors = plant_dominant_keys},
    // Exact probes: V constant (every output exactly 3) and Q zero (every weight exactly 1/n, the
    // log-sum-exp ln n), which show a row sum picked up from a neighbour or a denominator off by a
    // rounding at once (an FP8 kernel gave 0.637 with V = ones).
    {.name = "probe_constant_v_16x256_d64", .exact_probe = true, .problem = probe, .tensors = constant_v},
    {.name = "probe_zero_q_16x256_d64", .exact_probe = true, .problem = probe, .tensors = zero_q},
};

void fill(std::vector<double>& data, std::size_t count, DeterministicRandom& random,
          const FloatFormat& format) {
  data.resize(count);
  for (double& x : data) x = round_to_format(random.normal(0, 1), format);
}

}  // namespace

std::span<const AttentionScenario> attention_scenarios() { return scenarios; }

const AttentionScenario* find_attention_scenario(std::string_view name) {
  for (const auto& scenario : scenarios) {
    if (scenario.name == name) return &scenario;
  }
  return nullptr;
}

AttentionProblem scenario_problem(const AttentionScenario& scenario) {
  AttentionProblem p;
  scenario.problem(p);
  p.scores.scale =
      static_cast<double>(static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.shape.head_dim))));
  return p;
}

std::size_t scenario_keys(const AttentionScenario& scenario) {
  const AttentionProblem p = scenario_problem(scenario);
  return p.layout == tensor::Layout::packed ? p.stored_keys() : p.shape.keys;
}

ScenarioInputs make_scenario(const AttentionScenario& scenario, std::uint64_t seed,
                             const FloatFormat& format) {
  ScenarioInputs inputs;
  inputs.problem = scenario_problem(scenario);
  const AttentionProblem& p = inputs.problem;
  DeterministicRandom random(seed);
  fill(inputs.q, p.query_elements(), random, format);
  fill(inputs.k, p.key_elements(), random, format);
  fill(inputs.v, p.value_elements(), random, format);
  if (scenario.tensors != nullptr) scenario.tensors(inputs, format);
  return inputs;
}

}  // namespace sharpcheck::gate
