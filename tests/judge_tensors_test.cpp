// Judging whole attention layers: a bf16 [2, 4, 37, 16] GQA problem computed head by head with
// the flash kernel (causal bottom-right on 37 x 53, a window, a soft-cap, sinks) passes with its
// log-sum-exp; the same outputs with a forgotten GQA mapping, a misaligned causal mask, a skipped
// sink or a wrong log-sum-exp fail, each naming the worst element's full index. Then `sharpcheck
// compare` on the same tensors as 4-D .npy files, as a user runs it.
#include "metrics/judge_tensors.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "io/npy.hpp"
#include "kernels/registry.hpp"

namespace sharpcheck {
namespace {

struct Layer {
  tensor::AttentionProblem problem;
  std::vector<double> q, k, v, out, lse;
};

// Runs a registry kernel head by head, reading KV head `kv_of(h)`.
template <typename KvOf>
void run_kernel(Layer& layer, const kernels::AttentionKernel& kernel,
                const tensor::AttentionProblem& computed, const KvOf& kv_of) {
  const auto& p = layer.problem;
  const auto& s = p.shape;
  layer.out.assign(p.output_elements(), 0.0);
  layer.lse.assign(p.lse_elements(), 0.0);
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      Matrix q(s.queries, s.head_dim), k(s.keys, s.head_dim), v(s.keys, s.value_dim), out;
      for (std::size_t i = 0; i < s.queries; ++i)
        for (std::size_t t = 0; t < s.head_dim; ++t) q(i, t) = layer.q[p.query_offset(b, h, i, t)];
      for (std::size_t j = 0; j < s.keys; ++j) {
        for (std::size_t t = 0; t < s.head_dim; ++t) k(j, t) = layer.k[p.key_offset(b, kv_of(h), j, t)];
        for (std::size_t t = 0; t < s.value_dim; ++t) v(j, t) = layer.v[p.value_offset(b, kv_of(h), j, t)];
      }
      std::vector<double> lse;
      kernel.run(q, k, v, computed.head(b, h), out, &lse);
      for (std::size_t i = 0; i < s.queries; ++i) {
        layer.lse[p.lse_offset(b, h, i)] = lse[i];
        for (std::size_t c = 0; c < s.value_dim; ++c) layer.out[p.output_offset(b, h, i, c)] = out(i, c);
      }
    }
  }
}

Layer make_layer() {
  Layer layer;
  auto& p = layer.problem;
  p.shape = {2, 4, 2, 37, 53, 16, 16};
  p.scores.causal = true;
  p.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  p.scores.window_left = 24;
  p.scores.softcap = 5.0;
  p.sinks = {0.5, -1.0, 2.0, 0.0};
  DeterministicRandom random(11);
  for (auto [data, count] : {std::pair{&layer.q, p.query_elements()}, std::pair{&layer.k, p.key_elements()},
                             std::pair{&layer.v, p.value_elements()}}) {
    data->resize(count);
    for (double& x : *data) x = round_to_format(random.normal(0, 1.5), bf16);
  }
  return layer;
}

metrics::TensorJudgement judge(const Layer& layer, bool with_lse = true) {
  const auto& kernel = *kernels::find_attention_kernel("attention_flash_bf16");
  const metrics::JudgeSpec spec{kernels::Operation::attention, &bf16, &kernel.tolerance};
  return metrics::judge_attention_tensors(
      spec, layer.problem, layer.q, layer.k, layer.v, layer.out,
      with_lse ? std::span<const double>(layer.lse) : std::span<const double>{});
}

const auto grouped = [](std::size_t h) { return h / 2; };

TEST(JudgeTensors, AnHonestLayerPassesAndEachMutantFailsNamingItsWorstElement) {
  Layer layer = make_layer();
  const auto& kernel = *kernels::find_attention_kernel("attention_flash_bf16");
  run_kernel(layer, kernel, layer.problem, grouped);
  const auto honest = judge(layer);
  EXPECT_TRUE(honest.passed()) << honest.describe_worst();
  EXPECT_EQ(honest.output.elements, 2u * 4 * 37 * 16);
  ASSERT_TRUE(honest.lse.has_value());
  EXPECT_EQ(honest.lse->elements, 2u * 4 * 37);

  Layer forgot_gqa = layer;
  run_kernel(forgot_gqa, kernel, layer.problem, [](std::size_t h) { return h % 2; });
  const auto gqa = judge(forgot_gqa, false);
  EXPECT_FALSE(gqa.passed());
  EXPECT_NE(gqa.describe_worst().find("[batch "), std::string::npos);
  EXPECT_NE(gqa.worst_output.head % 2, gqa.worst_output.head / 2) << "heads 0 and 3 read the right KV head";

  tensor::AttentionProblem top_left = layer.problem;
  top_left.scores.alignment = tensor::DiagonalAlignment::top_left;
  Layer misaligned = layer;
  run_kernel(misaligned, kernel, top_left, grouped);
  EXPECT_FALSE(judge(misaligned, false).passed());

  tensor::AttentionProblem no_sink = layer.problem;
  no_sink.sinks.clear();
  Layer sinkless = layer;
  run_kernel(sinkless, kernel, no_sink, grouped);
  EXPECT_FALSE(judge(sinkless, false).passed());

  Layer wrong_lse = layer;
  wrong_lse.lse[wrong_lse.problem.lse_offset(1, 2, 30)] += 1e-3;
  const auto lse = judge(wrong_lse);
  EXPECT_TRUE(lse.output.passed());
  ASSERT_TRUE(lse.lse.has_value());
  EXPECT_FALSE(lse.lse->passed());
  EXPECT_EQ(lse.worst_lse.batch, 1u);
  EXPECT_EQ(lse.worst_lse.head, 2u);
  EXPECT_EQ(lse.worst_lse.position, 30u);
}

// A query that sees no key (bottom-right causal, 12 queries on 5 keys): its log-sum-exp is ln 0 =
// -inf, and FlashAttention 2/3 write +inf there (so that their backward's exp(s - L) is 0); both
// pass, and any finite value or NaN there fails naming that row.
TEST(JudgeTensors, AFullyMaskedRowsLogSumExpIsMinusOrPlusInfinity) {
  Layer layer;
  auto& p = layer.problem;
  p.shape = {1, 2, 1, 12, 5, 16, 16};
  p.scores.causal = true;
  p.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  p.scores.fully_masked = tensor::FullyMaskedRows::zeros;
  DeterministicRandom random(12);
  for (auto [data, count] : {std::pair{&layer.q, p.query_elements()}, std::pair{&layer.k, p.key_elements()},
                             std::pair{&layer.v, p.value_elements()}}) {
    data->resize(count);
    for (double& x : *data) x = round_to_format(random.normal(0, 1), bf16);
  }
  run_kernel(layer, *kernels::find_attention_kernel("attention_flash_bf16"), p,
             [](std::size_t) { return 0; });
  const std::size_t masked = p.lse_offset(0, 1, 3);  // query 3 of 12 aligns with key -4
  ASSERT_EQ(layer.lse[masked], -INFINITY);
  EXPECT_TRUE(judge(layer).passed()) << judge(layer).describe_worst();
  for (const double value : {double{INFINITY}, 0.0, -1e30, double{NAN}}) {
    Layer given = layer;
    given.lse[masked] = value;
    const auto judged = judge(given);
    EXPECT_EQ(judged.passed(), std::isinf(value)) << value;
    if (!std::isinf(value)) {
      EXPECT_EQ(judged.worst_lse.head, 1u);
      EXPECT_EQ(judged.worst_lse.position, 3u);
    }
  }
}

// The same layer through the command line: 4-D bf16 tensors as uint16 bit patterns, as torch
// dumps them with .view(torch.uint16) (or numpy with ml_dtypes).
TEST(JudgeTensors, CompareJudgesFourDimensionalDumps) {
  Layer layer = make_layer();
  run_kernel(layer, *kernels::find_attention_kernel("attention_flash_bf16"), layer.problem, grouped);
  const auto dir =
      std::filesystem::temp_directory_path() / ("sharpcheck_judge_tensors_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto bits = [](const std::vector<double>& values) {
    std::vector<double> out(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(encode(values[i], bf16));
    return out;
  };
  const auto& s = layer.problem.shape;
  io::write_npy((dir / "q.npy").string(), io::NpyType::uint16, {s.batch, s.heads, s.queries, s.head_dim},
                bits(layer.q));
  io::write_npy((dir / "k.npy").string(), io::NpyType::uint16, {s.batch, s.kv_heads, s.keys, s.head_dim},
                bits(layer.k));
  io::write_npy((dir / "v.npy").string(), io::NpyType::uint16, {s.batch, s.kv_heads, s.keys, s.value_dim},
                bits(layer.v));
  io::write_npy((dir / "out.npy").string(), io::NpyType::uint16, {s.batch, s.heads, s.queries, s.value_dim},
                bits(layer.out));
  io::write_npy((dir / "lse.npy").string(), io::NpyType::float32, {s.batch, s.heads, s.queries}, layer.lse);
  io::write_npy((dir / "sinks.npy").string(), io::NpyType::float32, {4}, layer.problem.sinks);
  const std::string files = " --q " + (dir / "q.npy").string() + " --k " + (dir / "k.npy").string() +
                            " --v " + (dir / "v.npy").string() + " --out " + (dir / "out.npy").string() +
                            " --lse " + (dir / "lse.npy").string() + " --sinks " +
                            (dir / "sinks.npy").string();
  const std::string options = " --format bf16 --causal --align bottom-right --window 24,-1 --softcap 5";
  const std::string command = std::string(SHARPCHECK_BINARY) + " compare" + files + options + " > /dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  const std::string top_left = std::string(SHARPCHECK_BINARY) + " compare" + files +
                               " --format bf16 --causal --window 24,-1 --softcap 5 > /dev/null";
  EXPECT_EQ(WEXITSTATUS(std::system(top_left.c_str())), 1) << "a misaligned judgement must fail";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sharpcheck
