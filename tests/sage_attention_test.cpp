// SageAttention-2-style attention (kernels/sage_attention.hpp) under sharpcheck's entry and, on the
// same outputs, the peers' gates (cosine >= 0.99, RMSE <= 11% of the reference's range, mean
// |error| <= 0.02: the SageAttention and Transformer Engine practice of issue 36). The honest kernel
// passes, output and log-sum-exp, on keys with a large common offset (what smoothing is for);
// every twin fails sharpcheck, and the test states which twins the peers miss.
#include "kernels/sage_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "kernels/attention_layer.hpp"
#include "kernels/registry.hpp"
#include "metrics/judge_tensors.hpp"

namespace sharpcheck {
namespace {

struct Layer {
  tensor::AttentionProblem problem;
  std::vector<double> q, k, v;
};

// Two query heads over one KV head; K = N(0, 1) plus `key_offset` in every channel (a common
// offset, as real keys have and smoothing removes), V = N(0, 1). Query 5's dominant key lies in
// the last tile when `late_dominant_key`, some 1.5 above every earlier score (above log(448/256)).
Layer make_layer(std::uint64_t seed, std::size_t queries, std::size_t keys, double key_offset,
                 bool late_dominant_key = false) {
  Layer layer;
  auto& p = layer.problem;
  p.shape = {.batch = 1,
             .heads = 2,
             .kv_heads = 1,
             .queries = queries,
             .keys = keys,
             .head_dim = 64,
             .value_dim = 32};
  DeterministicRandom random(seed);
  layer.q.resize(p.query_elements());
  layer.k.resize(p.key_elements());
  layer.v.resize(p.value_elements());
  for (double& x : layer.q) x = round_to_format(random.normal(), bf16);
  for (double& x : layer.k) x = round_to_format(random.normal() + key_offset, bf16);
  for (double& x : layer.v) x = round_to_format(random.normal(), bf16);
  if (late_dominant_key) {
    for (std::size_t i = 0; i < queries; ++i) {
      for (std::size_t t = 0; t < 64; ++t)
        layer.k[p.key_offset(0, 0, keys - 1 - i, t)] =
            round_to_format(0.6 * layer.q[p.query_offset(0, 0, i, t)], bf16);
    }
  }
  return layer;
}

struct PeerVerdicts {
  bool cosine = false, rmse = false, mean_error = false;
};

PeerVerdicts peer_gates(std::span<const double> expected, std::span<const double> actual) {
  double dot = 0, ee = 0, aa = 0, squared = 0, absolute = 0;
  const auto [low, high] = std::minmax_element(expected.begin(), expected.end());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    dot += e * a;
    ee += e * e;
    aa += a * a;
    squared += (a - e) * (a - e);
    absolute += std::fabs(a - e);
  }
  const auto n = static_cast<double>(expected.size());
  return {.cosine = dot / std::sqrt(ee * aa) >= 0.99,
          .rmse = std::sqrt(squared / n) <= 0.11 * (*high - *low),
          .mean_error = absolute / n <= 0.02};
}

struct Outcome {
  metrics::TensorJudgement sharpcheck;
  PeerVerdicts peers;
};

// `kernel` on the layer, judged on its declared inputs under `entry` (its own when null), output
// and log-sum-exp; the peers on the output against the honest kernel's exact reference.
Outcome judge(std::string_view name, const Layer& layer, const kernels::Tolerance* entry = nullptr) {
  const kernels::AttentionKernel& kernel = *kernels::find_attention_kernel(name);
  const kernels::LayerOutputs got =
      kernels::run_attention_layer(kernel, layer.problem, layer.q, layer.k, layer.v);
  const kernels::LayerInputs in =
      kernels::declared_layer_inputs(kernel, layer.problem, layer.q, layer.k, layer.v);
  const metrics::JudgeSpec spec{.operation = kernels::Operation::attention,
                                .output = &bf16,
                                .tolerance = entry != nullptr ? entry : &kernel.tolerance};
  Outcome outcome{metrics::judge_attention_tensors(spec, layer.problem, in.q, in.k, in.v, got.out, got.lse),
                  {}};
  const kernels::AttentionKernel& honest = *kernels::find_attention_kernel("attention_sage");
  const kernels::LayerOutputs exact =
      kernels::run_attention_layer(honest, layer.problem, layer.q, layer.k, layer.v);
  outcome.peers = peer_gates(exact.out, got.out);
  return outcome;
}

TEST(SageAttention, TheHonestKernelPassesOutputAndLogSumExp) {
  double worst_lse = 0;
  for (const double offset : {0.0, 4.0, 30.0}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      const Outcome o = judge("attention_sage", make_layer(seed, 40, 300 + 50 * seed, offset));
      ASSERT_TRUE(o.sharpcheck.lse.has_value());
      worst_lse =
          std::max({worst_lse, o.sharpcheck.lse->max_bound_ratio, o.sharpcheck.lse->max_statistical_ratio});
      EXPECT_TRUE(o.sharpcheck.passed())
          << "offset " << offset << " seed " << seed << ": " << o.sharpcheck.output.failure_summary() << " / "
          << o.sharpcheck.lse->failure_summary();
    }
  }
  std::printf("honest SageAttention kernel: worst log-sum-exp ratio %.3g\n", worst_lse);
}

TEST(SageAttention, EveryTwinFailsSharpcheckAndThePeersMissSome) {
  const Layer plain = make_layer(4, 40, 400, 4.0);
  const Outcome q_scale = judge("attention_sage_q_scale_missing", plain);
  EXPECT_FALSE(q_scale.sharpcheck.passed());
  const Outcome lse = judge("attention_sage_lse_unsmoothed", plain);
  EXPECT_FALSE(lse.sharpcheck.lse->passed());
  EXPECT_TRUE(lse.sharpcheck.output.passed());
  EXPECT_TRUE(lse.peers.cosine && lse.peers.rmse && lse.peers.mean_error);  // they read no LSE
  // The correction formed in bf16, as a wrapper computing q . mean(k) in the inputs' dtype does:
  // the LSE's allowance (fp32's, with the correction's own error derived) is tight enough to see it.
  const Outcome bf16_correction = judge("attention_sage_lse_correction_bf16", plain);
  EXPECT_FALSE(bf16_correction.sharpcheck.lse->passed());
  const Outcome row_sum = judge("attention_sage_row_sum_rounded", make_layer(5, 40, 40, 0.0));
  EXPECT_FALSE(row_sum.sharpcheck.passed());
  EXPECT_TRUE(row_sum.peers.cosine && row_sum.peers.rmse && row_sum.peers.mean_error);
  const Outcome lazy = judge("attention_sage_lazy_rescale_1", make_layer(6, 8, 400, 0.0, true));
  EXPECT_FALSE(lazy.sharpcheck.passed());
  for (const auto& [name, o] : {std::pair{"q_scale_missing", q_scale}, std::pair{"lse_unsmoothed", lse},
                                std::pair{"lse_correction_bf16", bf16_correction},
                                std::pair{"row_sum_rounded", row_sum}, std::pair{"lazy_rescale_1", lazy}}) {
    std::printf("%-16s sharpcheck %s (output %.3g / %.3g, lse %.3g), cosine %s, rmse %s, mean |error| %s\n",
                name, o.sharpcheck.passed() ? "pass" : "FAIL", o.sharpcheck.output.max_bound_ratio,
                o.sharpcheck.output.max_statistical_ratio,
                o.sharpcheck.lse
                    ? std::max(o.sharpcheck.lse->max_bound_ratio, o.sharpcheck.lse->max_statistical_ratio)
                    : 0.0,
                o.peers.cosine ? "pass" : "FAIL", o.peers.rmse ? "pass" : "FAIL",
                o.peers.mean_error ? "pass" : "FAIL");
  }
}

TEST(SageAttention, DeclaredInputsSmoothOnlyWhereTheShiftIsInvariant) {
  const Layer layer = make_layer(7, 4, 100, 30.0);
  Matrix q(4, 64), k(100, 64), v(100, 32);
  std::copy(layer.q.begin(), layer.q.begin() + 4 * 64, q.values.begin());
  std::copy(layer.k.begin(), layer.k.begin() + 100 * 64, k.values.begin());
  std::copy(layer.v.begin(), layer.v.begin() + 100 * 32, v.values.begin());
  Matrix qs = q, ks = k, vs = v, qu = q, ku = k, vu = v;
  kernels::declared_sage_inputs(qs, ks, vs, true);
  kernels::declared_sage_inputs(qu, ku, vu, false);
  // Smoothed, K's INT8 step is that of K - mean (about 3 / 127), not of K (about 33 / 127).
  double smoothed = 0, unsmoothed = 0;
  for (std::size_t e = 0; e < k.values.size(); ++e) {
    smoothed = std::max(smoothed, std::fabs(ks.values[e] - k.values[e]));
    unsmoothed = std::max(unsmoothed, std::fabs(ku.values[e] - k.values[e]));
  }
  EXPECT_LT(smoothed * 4, unsmoothed);
  EXPECT_EQ(qs.values, qu.values);
  tensor::HeadScores with_sink;
  with_sink.sink = 1.0;
  EXPECT_FALSE(kernels::smooths_keys(with_sink));
  EXPECT_TRUE(kernels::smooths_keys(tensor::HeadScores{}));
  Matrix bad = q;
  bad(1, 1) = INFINITY;
  EXPECT_THROW(kernels::declared_sage_inputs(bad, ks, vs, true), InputError);
}

}  // namespace
}  // namespace sharpcheck
