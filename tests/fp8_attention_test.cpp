// The FP8 attention kernel under test (kernels/fp8_attention.hpp): its quantisation and rotation
// do what they claim, the kernel passes its tolerance entry with arbitrary (not power-of-two)
// descales, per tensor and per block, under masks and modifiers; and the entry is not vacuous:
// a kernel that ignores its per-block V descales, and FlashAttention 4's lazy rescaling with
// e4m3 P, both fail it, as does the honest kernel under the bf16-P model it is too coarse for.
#include "kernels/fp8_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::kernels {
namespace {

Matrix normal_matrix(std::size_t rows, std::size_t cols, double sigma, DeterministicRandom& random) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = round_to_format(random.normal(0, sigma), bf16);
  return matrix;
}

struct KernelRun {
  Matrix out;
  Fp8Saturation saturation;
};

KernelRun run(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v, const tensor::HeadScores& scores,
              double rescale_threshold = 0) {
  std::vector<Bfloat16> out(q.rows * v.cols);
  Fp8AttentionOptions options;
  options.rescale_threshold = rescale_threshold;
  KernelRun result;
  attention_fp8(q, k, v, out.data(), nullptr, scores, options, &result.saturation);
  result.out = Matrix(q.rows, v.cols);
  for (std::size_t i = 0; i < out.size(); ++i) result.out.values[i] = out[i].to_float();
  return result;
}

bool passes(const char* entry, const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v,
            const tensor::HeadScores& scores, const Matrix& out) {
  const metrics::JudgeSpec spec{Operation::attention, &bf16, &metrics::tolerance_for(entry)};
  return metrics::judge_attention(spec, q.dequantized(), k.dequantized(), v.dequantized(), scores, out)
      .comparison.passed();
}

TEST(Fp8Quantisation, PowerOfTwoDescalesGiveE4m3ValuesBackExactly) {
  DeterministicRandom random(1);
  Matrix values = normal_matrix(130, 32, 3, random);
  for (double& x : values.values) x = round_to_format(x, fp8_e4m3);
  for (const std::size_t block : {std::size_t{0}, std::size_t{64}}) {
    const Fp8Tensor tensor = quantize_e4m3_exactly(values, block);
    EXPECT_EQ(tensor.descales.size(), block == 0 ? 1u : 3u);
    EXPECT_EQ(tensor.dequantized().values, values.values) << block;
    for (const float descale : tensor.descales) {
      int exponent = 0;
      EXPECT_EQ(std::frexp(descale, &exponent), 0.5F);  // a power of two
    }
  }
}

TEST(Fp8Quantisation, AmaxDescalesRoundEachEntryToE4m3Precision) {
  DeterministicRandom random(2);
  const Matrix values = normal_matrix(100, 16, 1, random);
  for (const std::size_t block : {std::size_t{0}, std::size_t{32}}) {
    const Fp8Tensor tensor = quantize_e4m3(values, block);
    const Matrix back = tensor.dequantized();
    for (std::size_t r = 0; r < values.rows; ++r) {
      const double descale = tensor.descale_of(r);
      for (std::size_t c = 0; c < values.cols; ++c) {
        const double x = values(r, c);
        // Relative 2^-4 for a normal payload, half the subnormal step 2^-9 otherwise.
        EXPECT_LE(std::fabs(back(r, c) - x), std::max(std::fabs(x) * 0x1p-4, descale * 0x1p-10) * 1.000001)
            << r << "," << c;
      }
    }
  }
  Matrix infinite = values;
  infinite(3, 4) = INFINITY;
  EXPECT_THROW((void)quantize_e4m3(infinite, 0), InputError);
}

TEST(Fp8Quantisation, HadamardRotationKeepsDotProductsAndSpreadsAnOutlier) {
  DeterministicRandom random(3);
  const Matrix q = normal_matrix(4, 64, 1, random), k = normal_matrix(4, 64, 1, random);
  const Matrix qr = hadamard_rotate(q, 9), kr = hadamard_rotate(k, 9);
  for (std::size_t i = 0; i < 4; ++i) {
    double exact = 0, rotated = 0, scale = 0;
    for (std::size_t t = 0; t < 64; ++t) {
      exact += q(i, t) * k(i, t);
      rotated += qr(i, t) * kr(i, t);
      scale += std::fabs(q(i, t) * k(i, t));
    }
    EXPECT_NEAR(rotated, exact, 1e-13 * scale);
  }
  Matrix outlier(1, 64);
  outlier(0, 5) = 100;
  for (const double x : hadamard_rotate(outlier, 9).values) EXPECT_DOUBLE_EQ(std::fabs(x), 12.5);  // 100/8
  EXPECT_THROW((void)hadamard_rotate(Matrix(2, 48), 1), InputError);
}

TEST(Fp8Attention, PassesItsEntryWithArbitraryDescalesPerTensorAndPerBlock) {
  DeterministicRandom random(4);
  const Matrix q = normal_matrix(24, 64, 1.5, random), k = normal_matrix(300, 64, 1.5, random),
               v = normal_matrix(300, 64, 1, random);
  tensor::HeadScores causal;
  causal.causal = true;
  causal.alignment = tensor::DiagonalAlignment::bottom_right;
  tensor::HeadScores capped;
  capped.softcap = 5;
  capped.sink = 1.0;
  for (const std::size_t block : {std::size_t{0}, std::size_t{64}}) {
    const Fp8Tensor q8 = quantize_e4m3(q, block), k8 = quantize_e4m3(k, block), v8 = quantize_e4m3(v, block);
    for (const tensor::HeadScores& scores : {tensor::HeadScores{}, causal, capped}) {
      const KernelRun result = run(q8, k8, v8, scores);
      EXPECT_TRUE(passes("attention_fp8", q8, k8, v8, scores, result.out)) << block;
      EXPECT_EQ(result.saturation.saturated, 0u);
      EXPECT_GT(result.saturation.probabilities, 0u);
    }
  }
}

// Mutations: each must fail the entry the honest kernel passes.
TEST(Fp8Attention, BrokenVariantsFailTheEntry) {
  DeterministicRandom random(5);
  const Matrix q = normal_matrix(16, 64, 1, random), v = normal_matrix(512, 64, 1, random);
  Matrix k = normal_matrix(512, 64, 1, random);
  for (std::size_t i = 0; i < 16; ++i) {  // query i's dominant key 448 + i, about 3.5 above the rest
    for (std::size_t t = 0; t < 64; ++t) k(448 + i, t) = round_to_format(0.75 * q(i, t), bf16);
  }
  const Fp8Tensor q8 = quantize_e4m3(q, 64), k8 = quantize_e4m3(k, 64);
  Matrix v_blocks = v;  // V's blocks of very different sizes, so their descales differ
  for (std::size_t j = 0; j < 64; ++j) {
    for (std::size_t c = 0; c < 64; ++c) v_blocks(j, c) *= 40;
  }
  const Fp8Tensor v8 = quantize_e4m3(v_blocks, 64);
  const KernelRun honest = run(q8, k8, v8, {});
  ASSERT_TRUE(passes("attention_fp8", q8, k8, v8, {}, honest.out));
  EXPECT_FALSE(passes("attention_p_rounded", q8, k8, v8, {}, honest.out));  // bf16 P's model is too tight

  Fp8Tensor one_descale = v8;  // reads block 0's descale for every key
  one_descale.block_rows = 0;
  EXPECT_FALSE(passes("attention_fp8", q8, k8, v8, {}, run(q8, k8, one_descale, {}).out));

  const KernelRun lazy = run(q8, k8, v8, {}, 8 * std::log(2.0));
  EXPECT_GT(lazy.saturation.saturated, 0u);
  EXPECT_FALSE(passes("attention_fp8", q8, k8, v8, {}, lazy.out));
}

}  // namespace
}  // namespace sharpcheck::kernels
