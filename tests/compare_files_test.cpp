// gate::compare_files (what `sharpcheck compare` calls) on files as users dump them: log-softmax,
// bf16 as torch's int16 bits, fp8 outputs as uint8 bits, the int8/uint8 quantized grids, fp8
// inputs with FlashAttention 3's descale factors, and packed variable-length attention. Each is
// shown to pass on the correctly rounded output and to fail on a wrong one.
#include "gate/compare_files.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "io/npy.hpp"
#include "kernels/registry.hpp"
#include "reference/attention.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck {
namespace {

class CompareFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("sharpcheck_compare_files_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, io::NpyType type, const std::vector<std::size_t>& shape,
                    const std::vector<double>& values) {
    const std::string path = (dir_ / name).string();
    io::write_npy(path, type, shape, values);
    return path;
  }
  std::filesystem::path dir_;
};

std::vector<double> random_logits(std::size_t count, const FloatFormat& format, std::uint64_t seed,
                                  double sigma = 2) {
  DeterministicRandom random(seed);
  std::vector<double> values(count);
  for (double& x : values) x = round_to_format(random.normal(0, sigma), format);
  return values;
}

std::vector<double> rows_of(const std::vector<double>& logits, std::size_t n, const FloatFormat& format,
                            bool log) {
  std::vector<double> out;
  for (std::size_t r = 0; r < logits.size() / n; ++r) {
    const std::span<const double> row(logits.data() + r * n, n);
    const auto result = log ? reference::log_softmax(row, format) : reference::softmax(row, format);
    out.insert(out.end(), result.begin(), result.end());
  }
  return out;
}

std::vector<double> bits(const std::vector<double>& values, const FloatFormat& format) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(encode(values[i], format));
  return out;
}

TEST_F(CompareFiles, LogSoftmaxPassesWhenExactAndFailsWhenOffOrGivenAsProbabilities) {
  const auto logits = random_logits(8 * 300, fp32, 1);
  gate::CompareRequest request;
  request.logits = write("logits.npy", io::NpyType::float32, {8, 300}, logits);
  request.log_softmax = true;
  auto log_probs = rows_of(logits, 300, fp32, true);
  request.probabilities = write("logp.npy", io::NpyType::float32, {8, 300}, log_probs);
  EXPECT_TRUE(gate::compare_files(request).passed());
  log_probs[417] = round_to_format(log_probs[417] + 1e-4, fp32);
  request.probabilities = write("logp_off.npy", io::NpyType::float32, {8, 300}, log_probs);
  const auto off = gate::compare_files(request);
  EXPECT_FALSE(off.passed());
  EXPECT_EQ(off.comparison.worst.row, 1u);
  EXPECT_EQ(off.comparison.worst.index, 117u);
  request.log_softmax = false;  // log-probabilities judged as probabilities: refused or failed
  EXPECT_ANY_THROW({
    const auto wrong = gate::compare_files(request);
    if (!wrong.passed()) throw std::runtime_error("failed");
  });
}

TEST_F(CompareFiles, Bf16AsTorchsInt16BitsFp8AsUint8BitsAndTheQuantizedGrids) {
  const auto logits = random_logits(4 * 64, bf16, 2);
  gate::CompareRequest request;
  request.logits = write("logits.npy", io::NpyType::int16, {4, 64}, bits(logits, bf16));
  request.format = "bf16";
  request.probabilities =
      write("p.npy", io::NpyType::int16, {4, 64}, bits(rows_of(logits, 64, bf16, false), bf16));
  EXPECT_TRUE(gate::compare_files(request).passed());
  for (const FloatFormat* format : {&fp8_e4m3, &fp8_e5m2}) {
    request.format = std::string(format->name);
    request.input_format = "bf16";
    auto probs = rows_of(logits, 64, *format, false);
    request.probabilities = write("p8.npy", io::NpyType::uint8, {4, 64}, bits(probs, *format));
    EXPECT_TRUE(gate::compare_files(request).passed()) << format->name;
    for (int step = 0; step < 3; ++step) probs[5] = next_up(probs[5], *format);
    request.probabilities = write("p8_off.npy", io::NpyType::uint8, {4, 64}, bits(probs, *format));
    EXPECT_FALSE(gate::compare_files(request).passed()) << format->name;
  }
  // The int8 kernel's codes (zero point -128), from q8 logits.
  const auto& kernel = *kernels::find_softmax_kernel("int8");
  Matrix q8(2, 50);
  DeterministicRandom random(3);
  for (double& x : q8.values) x = static_cast<double>(static_cast<int>(random.below(200)) - 100) / 16;
  Matrix out;
  kernel.run(q8, 1.0, out);
  std::vector<double> codes(out.values.size());
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = out.values[i] * 256 - 128;
  gate::CompareRequest quantized;
  quantized.logits = write("q8.npy", io::NpyType::float32, {2, 50}, q8.values);
  quantized.format = "int8";
  quantized.probabilities = write("codes.npy", io::NpyType::int8, {2, 50}, codes);
  EXPECT_TRUE(gate::compare_files(quantized).passed());
  codes[7] += 3;
  quantized.probabilities = write("codes_off.npy", io::NpyType::int8, {2, 50}, codes);
  EXPECT_FALSE(gate::compare_files(quantized).passed());
}

TEST_F(CompareFiles, Fp8InputsWithDescaleFactorsAndPackedVariableLengths) {
  tensor::AttentionProblem problem;
  problem.layout = tensor::Layout::packed;
  problem.shape = {2, 2, 1, 0, 0, 16, 16};
  problem.cu_seqlens_q = {0, 5, 12};
  problem.cu_seqlens_k = {0, 9, 20};
  problem.scores.causal = true;
  problem.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  const auto q8 = random_logits(problem.query_elements(), fp8_e4m3, 4, 8);
  const auto k8 = random_logits(problem.key_elements(), fp8_e4m3, 5, 8);
  const auto v8 = random_logits(problem.value_elements(), fp8_e4m3, 6, 8);
  auto scaled = [](std::vector<double> values, double factor) {
    for (double& x : values) x *= factor;
    return values;
  };
  const auto expected =
      reference::attention(problem, scaled(q8, 0.125), scaled(k8, 0.25), scaled(v8, 0.5), bf16);
  gate::CompareRequest request;
  request.q = write("q.npy", io::NpyType::uint8, {12, 2, 16}, bits(q8, fp8_e4m3));
  request.k = write("k.npy", io::NpyType::uint8, {20, 1, 16}, bits(k8, fp8_e4m3));
  request.v = write("v.npy", io::NpyType::uint8, {20, 1, 16}, bits(v8, fp8_e4m3));
  request.out = write("out.npy", io::NpyType::uint16, {12, 2, 16}, bits(expected.output, bf16));
  request.format = "bf16";
  request.input_format = "fp8_e4m3";
  request.layout = "packed";
  request.cu_seqlens_q = problem.cu_seqlens_q;
  request.cu_seqlens_k = problem.cu_seqlens_k;
  request.scores = problem.scores;
  request.q_descale = 0.125;
  request.k_descale = 0.25;
  request.v_descale = 0.5;
  EXPECT_TRUE(gate::compare_files(request).passed());
  request.v_descale = 1;  // a forgotten descale
  EXPECT_FALSE(gate::compare_files(request).passed());
  request.v_descale = 0.1;  // not exact in double for every fp8 value: refused, never rounded
  EXPECT_THROW((void)gate::compare_files(request), InputError);
}

}  // namespace
}  // namespace sharpcheck
