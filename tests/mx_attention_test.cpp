// MXFP8 attention (kernels/mx_attention.hpp) under sharpcheck's entry and, on the same outputs, the
// peers' gates (cosine >= 0.99, RMSE <= 11% of the reference's range, mean |error| <= 0.02: the
// Transformer Engine and SageAttention practice of issue 36): the honest kernel passes, every twin
// fails sharpcheck, and the test states which twin each peer gate misses.
#include "kernels/mx_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"

namespace sharpcheck {
namespace {

struct Problem {
  Matrix q, k, v;
};

double to_bf16(double x) { return round_to_format(x, bf16); }

// Normal Q and K, V uniform in (-1.5, 1.5) with 1.5 in every block of 32 keys of every column, so
// every V block has the same E8M0 scale (a uniform scale error is then invisible to cosine).
Problem uniform_scale_problem(std::uint64_t seed, std::size_t keys, bool late_dominant_key) {
  DeterministicRandom random(seed);
  Problem p{Matrix(32, 64), Matrix(keys, 64), Matrix(keys, 64)};
  for (double& x : p.q.values) x = to_bf16(random.normal());
  for (double& x : p.k.values) x = to_bf16(random.normal());
  for (std::size_t r = 0; r < keys; ++r) {
    for (std::size_t c = 0; c < 64; ++c)
      p.v(r, c) = r % 32 == c % 32 ? 1.5 : to_bf16(random.uniform(-1.4, 1.4));
  }
  if (late_dominant_key) {
    // Query i's dominant key is 448 + i, in the last tile: its score 0.75 |q_i|^2 / 8 (about 6) is
    // some 3.5 above the earlier tiles' max, between log(448/16) = 3.33 and a threshold of 2^6
    // (4.16): a kernel rescaling that lazily keeps its stale max and saturates P there.
    for (std::size_t i = 0; i < 32; ++i) {
      for (std::size_t t = 0; t < 64; ++t) p.k(448 + i, t) = to_bf16(0.75 * p.q(i, t));
    }
  }
  return p;
}

struct PeerVerdicts {
  bool cosine = false, rmse = false, mean_error = false;
};

PeerVerdicts peer_gates(const Matrix& expected, const Matrix& actual) {
  double dot = 0, ee = 0, aa = 0, squared = 0, absolute = 0;
  const auto [low, high] = std::minmax_element(expected.values.begin(), expected.values.end());
  for (std::size_t i = 0; i < expected.values.size(); ++i) {
    const double e = expected.values[i], a = actual.values[i];
    dot += e * a;
    ee += e * e;
    aa += a * a;
    squared += (a - e) * (a - e);
    absolute += std::fabs(a - e);
  }
  const auto n = static_cast<double>(expected.values.size());
  return {.cosine = dot / std::sqrt(ee * aa) >= 0.99,
          .rmse = std::sqrt(squared / n) <= 0.11 * (*high - *low),
          .mean_error = absolute / n <= 0.02};
}

struct Outcome {
  bool sharpcheck = false;
  PeerVerdicts peers;
  double bound_ratio = 0;
};

Outcome judge(std::string_view kernel_name, const Problem& p) {
  const kernels::AttentionKernel* kernel = kernels::find_attention_kernel(kernel_name);
  EXPECT_NE(kernel, nullptr) << kernel_name;
  tensor::HeadScores scores;
  scores.causal = false;
  const metrics::Evaluation e = metrics::evaluate_attention(*kernel, p.q, p.k, p.v, scores);
  return {.sharpcheck = e.comparison.passed(metrics::Tier::proven),
          .peers = peer_gates(e.expected, e.actual),
          .bound_ratio = e.comparison.max_bound_ratio};
}

TEST(MxAttention, TheHonestKernelPassesEveryGate) {
  for (const bool late : {false, true}) {
    const Outcome o = judge("attention_mxfp8", uniform_scale_problem(1, 512, late));
    EXPECT_TRUE(o.sharpcheck) << "late " << late << " bound ratio " << o.bound_ratio;
    EXPECT_TRUE(o.peers.cosine && o.peers.rmse && o.peers.mean_error) << "late " << late;
  }
}

TEST(MxAttention, EveryTwinFailsSharpcheckAndThePeersMissSome) {
  const Problem plain = uniform_scale_problem(2, 512, false);
  const Outcome v_scale = judge("attention_mxfp8_v_scale_dropped", plain);
  EXPECT_FALSE(v_scale.sharpcheck);
  EXPECT_TRUE(v_scale.peers.cosine);  // every output scaled by 2^8: cosine cannot see it
  EXPECT_FALSE(v_scale.peers.mean_error);
  const Outcome q_scale = judge("attention_mxfp8_q_scale_missing", plain);
  EXPECT_FALSE(q_scale.sharpcheck);
  const Outcome lazy = judge("attention_mxfp8_lazy_rescale_6", uniform_scale_problem(3, 512, true));
  EXPECT_FALSE(lazy.sharpcheck) << "bound ratio " << lazy.bound_ratio;
  EXPECT_TRUE(lazy.peers.rmse);  // saturation in a few rows of the 32: the RMSE gate misses it
  for (const auto& [name, o] : {std::pair{"v_scale_dropped", v_scale}, std::pair{"q_scale_missing", q_scale},
                                std::pair{"lazy_rescale_6", lazy}}) {
    std::printf("%-16s sharpcheck %s (bound ratio %.3g), cosine %s, rmse %s, mean |error| %s\n", name,
                o.sharpcheck ? "pass" : "FAIL", o.bound_ratio, o.peers.cosine ? "pass" : "FAIL",
                o.peers.rmse ? "pass" : "FAIL", o.peers.mean_error ? "pass" : "FAIL");
  }
}

// A head as the gate's sweep makes them: normal Q and K (times `sharpness`), normal V, causal or
// not, with a sink or a soft-cap where asked.
struct Head {
  Problem p;
  tensor::HeadScores scores;
};

Head random_head(std::uint64_t seed, std::size_t queries, std::size_t keys, std::size_t d, double sharpness) {
  DeterministicRandom random(seed);
  Head h{{Matrix(queries, d), Matrix(keys, d), Matrix(keys, d)}, {}};
  for (double& x : h.p.q.values) x = to_bf16(sharpness * random.normal());
  for (double& x : h.p.k.values) x = to_bf16(random.normal());
  for (double& x : h.p.v.values) x = to_bf16(random.normal());
  h.scores.causal = seed % 2 == 0;
  if (seed % 3 == 0) h.scores.sink = 1.5;
  if (seed % 5 == 0) h.scores.softcap = 8;
  return h;
}

// The kernel's output on `h` judged on its declared inputs under `entry` (both tiers).
metrics::Comparison judged(const Matrix& actual, const Head& h, const kernels::Tolerance& entry) {
  Matrix q = h.p.q, k = h.p.k, v = h.p.v;
  kernels::declared_mx_inputs(q, k, v, ScaleRule::ocp_floor);
  const metrics::JudgeSpec spec{
      .operation = kernels::Operation::attention, .output = &bf16, .tolerance = &entry};
  return metrics::judge_attention(spec, q, k, v, h.scores, actual).comparison;
}

Matrix run_mxfp8(const Head& h, kernels::MxAttentionOptions options) {
  Matrix out;
  kernels::attention_mxfp8(h.p.q, h.p.k, h.p.v, h.scores, options, out, nullptr);
  return out;
}

const kernels::Tolerance& mxfp8_entry() {
  return kernels::find_attention_kernel("attention_mxfp8")->tolerance;
}

constexpr std::size_t head_shapes[][3] = {{40, 40, 64}, {24, 300, 59}, {8, 700, 128}, {33, 129, 32}};

// The rounding-flip recipe (metrics/quantized_weights.hpp): an honest kernel of the declared
// schedule passes whatever order its arithmetic takes, while the two bugs that fit the worst-case
// charge of e4m3 P fail around the emulated weights.
TEST(MxAttention, AnHonestKernelOfAnyArithmeticOrderFitsTheEmulatedWeights) {
  double worst = 0;
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    const auto& shape = head_shapes[seed % 4];
    const Head h = random_head(seed, shape[0], shape[1], shape[2], seed % 4 == 3 ? 3.0 : 1.0);
    for (const bool reordered : {false, true}) {
      const metrics::Comparison c =
          judged(run_mxfp8(h, {.reordered_arithmetic = reordered}), h, mxfp8_entry());
      EXPECT_TRUE(c.passed()) << "seed " << seed << " reordered " << reordered << ": " << c.failure_summary();
      worst = std::max(worst, c.max_statistical_ratio);
    }
  }
  std::printf("honest MXFP8 kernels, worst statistical ratio around the emulated weights: %.3g\n", worst);
}

TEST(MxAttention, TheEmulatedWeightsCatchWhatTheWorstCaseHid) {
  kernels::Tolerance worst_case = mxfp8_entry();
  worst_case.quantized_weights = nullptr;  // the mutation: P's rounding charged as a worst case
  int caught[2] = {0, 0}, hidden[2] = {0, 0};
  const kernels::MxAttentionBug bugs[] = {kernels::MxAttentionBug::ceil_rule,
                                          kernels::MxAttentionBug::row_sum_unrounded};
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const auto& shape = head_shapes[seed % 4];
    const Head h = random_head(seed, shape[0], shape[1], shape[2], 1.0);
    for (int b = 0; b < 2; ++b) {
      const Matrix out = run_mxfp8(h, {.bug = bugs[b]});
      caught[b] += judged(out, h, mxfp8_entry()).passed() ? 0 : 1;
      hidden[b] += judged(out, h, worst_case).passed() ? 1 : 0;
    }
  }
  std::printf("ceil rule: caught on %d of 8 heads (worst case passes %d); row sum of unrounded P: %d (%d)\n",
              caught[0], hidden[0], caught[1], hidden[1]);
  EXPECT_GE(caught[0], 7);
  EXPECT_GE(caught[1], 4);
  EXPECT_GE(hidden[0], 7);  // without the emulation both bugs pass: what it catches is its own
  EXPECT_GE(hidden[1], 7);
}

// The centre matters: emulating a schedule the kernel does not run (tiles of 32 keys, so another
// running max rounds the weights) fails the honest kernel, so the emulated tier is not a second
// worst case. (Another power-of-two offset would not: e4m3 rounds 2x as it rounds x, away from
// its subnormals and its saturation.)
TEST(MxAttention, AWrongScheduleFailsTheHonestKernel) {
  kernels::QuantizedWeights wrong = *mxfp8_entry().quantized_weights;
  wrong.tile = 32;
  kernels::Tolerance entry = mxfp8_entry();
  entry.quantized_weights = &wrong;
  const Head h = random_head(7, 40, 300, 64, 1.0);
  EXPECT_FALSE(judged(run_mxfp8(h, {}), h, entry).passed());
  EXPECT_TRUE(judged(run_mxfp8(h, {}), h, mxfp8_entry()).passed());
}

// A row whose rescale decision an honest kernel may take either way (its tile max exactly at the
// running max plus the threshold, as a double) keeps the worst-case charge; the head's other rows
// are still judged around their emulated weights, so a 3% scale of one of them fails, where the
// worst case (the entry without emulation) lets it pass.
TEST(MxAttention, ARowTheEmulationCannotFollowKeepsTheWorstCaseAlone) {
  DeterministicRandom random(12);
  Head h{{Matrix(2, 32), Matrix(129, 32), Matrix(129, 32)}, {}};
  h.p.q(0, 0) = 1.0;  // scores q . k = k_j0: tile 1's max 1, then key 128's 4 = 1 + threshold
  h.p.q(1, 0) = 0.5;  // half those: 2 < 0.5 + threshold, no rescale to decide
  for (std::size_t j = 0; j < 128; ++j) h.p.k(j, 0) = round_to_format(random.uniform(-1, 1), fp8_e4m3);
  h.p.k(0, 0) = 1.0;
  h.p.k(128, 0) = 4.0;
  for (double& x : h.p.v.values) x = to_bf16(random.normal());
  h.scores.scale = 1.0;
  const double threshold_log2 = 3.0 / std::log(2.0);
  kernels::QuantizedWeights schedule = *mxfp8_entry().quantized_weights;
  schedule.rescale_threshold_log2 = threshold_log2;
  kernels::Tolerance entry = mxfp8_entry();
  entry.quantized_weights = &schedule;
  kernels::Tolerance worst_case = entry;
  worst_case.quantized_weights = nullptr;
  Matrix out = run_mxfp8(h, {.rescale_threshold_log2 = threshold_log2});
  EXPECT_TRUE(judged(out, h, entry).passed()) << judged(out, h, entry).failure_summary();
  for (std::size_t c = 0; c < out.cols; ++c) out(1, c) = to_bf16(out(1, c) * 1.03);
  EXPECT_FALSE(judged(out, h, entry).passed());
  EXPECT_TRUE(judged(out, h, worst_case).passed());
}

// Left padding under a finite mask: the first tile's keys are all hidden by -1e9, so the kernel's
// max there is about -1e9 with an error of hundreds, and the rescale to the next tile scales that
// share by exactly 0. Charged as a drift of that error (a review's finding), the allowance let the
// ceil-rule twin and a 5% scale of every output through; the share being 0, nothing is charged.
TEST(MxAttention, AMaskedFirstTileChargesNothingForItsRescale) {
  Head h = random_head(21, 16, 300, 64, 1.0);
  h.scores.causal = false;
  h.scores.sink.reset();
  h.scores.softcap = 0;
  std::vector<double> bias(16 * 300, 0.0);
  for (std::size_t i = 0; i < 16; ++i) {
    for (std::size_t j = 0; j < 128; ++j) bias[i * 300 + j] = -1e9;
  }
  h.scores.bias = bias;
  Matrix honest = run_mxfp8(h, {});
  EXPECT_TRUE(judged(honest, h, mxfp8_entry()).passed());
  EXPECT_FALSE(judged(run_mxfp8(h, {.bug = kernels::MxAttentionBug::ceil_rule}), h, mxfp8_entry()).passed());
  for (double& x : honest.values) x = to_bf16(x * 1.05);
  EXPECT_FALSE(judged(honest, h, mxfp8_entry()).passed());
}

TEST(MxAttention, DeclaredInputsAreTheFloorRulesValuesAndAFixedPoint) {
  Problem p = uniform_scale_problem(4, 64, false);
  p.q(0, 0) = 480.0;  // significand 1.875: the floor rule saturates it to 448
  p.q(0, 1) = 1.0;
  Matrix q = p.q, k = p.k, v = p.v;
  kernels::declared_mx_inputs(q, k, v, ScaleRule::ocp_floor);
  EXPECT_EQ(q(0, 0), 448.0);
  EXPECT_NE(v.values, p.v.values);  // bf16 values lose bits in e4m3
  Matrix q2 = q, k2 = k, v2 = v;
  kernels::declared_mx_inputs(q2, k2, v2, ScaleRule::ocp_floor);
  EXPECT_EQ(q2.values, q.values);
  EXPECT_EQ(k2.values, k.values);
  Matrix bad = p.q;
  bad(3, 3) = NAN;
  EXPECT_THROW(kernels::declared_mx_inputs(bad, k, v, ScaleRule::ocp_floor), InputError);
}

}  // namespace
}  // namespace sharpcheck
