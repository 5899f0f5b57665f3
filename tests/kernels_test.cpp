// The kernels against the correctly rounded reference under the tolerance table: written once,
// run over every kernel (and so every format it declares), every stressing row kind and sizes
// from 1 to 16,384; the deliberately broken kernels must be caught.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "formats/storage.hpp"
#include "inputs/rows.hpp"
#include "kernels/quantized_softmax.hpp"
#include "kernels/registry.hpp"
#include "kernels/softmax_kernels.hpp"
#include "metrics/evaluate.hpp"
#include "reference/attention.hpp"

namespace sharpcheck {
namespace {

using kernels::SoftmaxKernel;

Matrix rows_of(const std::vector<std::vector<double>>& rows) {
  Matrix matrix(rows.size(), rows.empty() ? 0 : rows[0].size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), matrix.row(r).begin());
  return matrix;
}

std::vector<const SoftmaxKernel*> sound_softmax_kernels() {
  std::vector<const SoftmaxKernel*> kernels;
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (!kernel.deliberately_broken) kernels.push_back(&kernel);
  }
  return kernels;
}

class EverySoundSoftmaxKernel : public ::testing::TestWithParam<const SoftmaxKernel*> {};

TEST_P(EverySoundSoftmaxKernel, StaysWithinItsTableEntryOnEveryRowKindAndSize) {
  const SoftmaxKernel& kernel = *GetParam();
  std::size_t judged = 0;
  for (const inputs::RowKind kind : inputs::all_row_kinds) {
    for (const std::size_t n : {1u, 2u, 3u, 17u, 100u, 1024u, 16384u}) {
      for (const double theta : {1.0, 0.75, -2.0}) {
        if (kernel.operation == kernels::Operation::adaptive_temperature && theta < 0) continue;
        // Rows near the overflow threshold are for kernels without a shift; a negative theta
        // makes their smallest logit the shift, which the fp16 inputs still hold.
        const Matrix logits = rows_of({inputs::make_row(kind, n, *kernel.input, n + 7)});
        const auto evaluation = metrics::evaluate_softmax(kernel, logits, theta);
        judged += evaluation.comparison.rows;
        ASSERT_TRUE(evaluation.comparison.passed())
            << kernel.name << " on " << inputs::row_kind_name(kind) << " n=" << n << " theta=" << theta
            << ": " << evaluation.comparison.worst.describe() << " (" << evaluation.comparison.violation_count
            << " violations)";
      }
    }
  }
  EXPECT_GT(judged, 100u);
}

std::string kernel_name(const ::testing::TestParamInfo<const SoftmaxKernel*>& parameter) {
  return std::string(parameter.param->name);
}
INSTANTIATE_TEST_SUITE_P(Kernels, EverySoundSoftmaxKernel, ::testing::ValuesIn(sound_softmax_kernels()),
                         kernel_name);

TEST(BrokenKernels, NaiveFailsOnALogitOfOneHundred) {
  std::vector<double> row(64, 0.0);
  row[5] = 100.0;
  const auto evaluation =
      metrics::evaluate_softmax(*kernels::find_softmax_kernel("naive"), rows_of({row}), 1.0);
  EXPECT_FALSE(evaluation.comparison.passed());
  EXPECT_GT(evaluation.comparison.non_finite, 0u);
  EXPECT_EQ(evaluation.comparison.worst.row, 0u);
  EXPECT_TRUE(std::isnan(evaluation.comparison.worst.actual));
  // ...and passes where the unshifted exponentials stay finite.
  row[5] = 10.0;
  EXPECT_TRUE(metrics::evaluate_softmax(*kernels::find_softmax_kernel("naive"), rows_of({row}), 1.0)
                  .comparison.passed());
}

TEST(BrokenKernels, Bf16AccumulatorFailsOnAUniformRowOf512AndTheWorstElementSaysSo) {
  const std::vector<double> row(512, 0.0);
  const auto evaluation =
      metrics::evaluate_softmax(*kernels::find_softmax_kernel("bf16acc"), rows_of({row}), 1.0);
  EXPECT_FALSE(evaluation.comparison.passed());
  EXPECT_EQ(evaluation.comparison.worst.expected, 1.0 / 512);
  EXPECT_EQ(evaluation.comparison.worst.actual, 1.0 / 256);  // the sum stalled at 256
  EXPECT_EQ(evaluation.comparison.worst.ulps, 128u);         // 2^-9 to 2^-8 is 128 bf16 steps
  ASSERT_FALSE(evaluation.comparison.violations.empty());
  EXPECT_NE(evaluation.comparison.violations.front().find("expected 0x1p-9 got 0x1p-8"), std::string::npos);
  // The same row through the fp32-accumulating bf16 kernel passes.
  EXPECT_TRUE(metrics::evaluate_softmax(*kernels::find_softmax_kernel("safe3_bf16"), rows_of({row}), 1.0)
                  .comparison.passed());
}

// Mutation checks for the escape kernels' entries: a wrong variant of each operator, computed
// carefully in double (so only the operator is wrong), must fail its table entry on ordinary rows.
template <void (*Row)(std::span<const double>, double, std::span<double>)>
void run_double_rows(const Matrix& logits, double theta, Matrix& out) {
  out = Matrix(logits.rows, logits.cols);
  for (std::size_t r = 0; r < logits.rows; ++r) Row(logits.row(r), theta, out.row(r));
}

void ssmax_with_log2(std::span<const double> row, double theta, std::span<double> out) {
  // The bug: log2 n where SSMax scales by ln n.
  const double multiplier = std::log2(static_cast<double>(row.size())) / theta;
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (std::size_t j = 0; j < row.size(); ++j) sum += out[j] = std::exp((row[j] - top) * multiplier);
  for (double& w : out) w /= sum;
}

void sigmoid_without_bias(std::span<const double> row, double theta, std::span<double> out) {
  for (std::size_t j = 0; j < row.size(); ++j)
    out[j] = 1 / (1 + std::exp(-row[j] / theta));  // the bug: no -ln n
}

void stick_breaking_farthest_first(std::span<const double> row, double theta, std::span<double> out) {
  double remaining = 1;  // the bug: the stick is broken from the first key, not the nearest
  for (std::size_t j = 0; j < row.size(); ++j) {
    const double beta = 1 / (1 + std::exp(-row[j] / theta));
    out[j] = beta * remaining;
    remaining *= 1 - beta;
  }
}

TEST(EscapeKernels, AWrongOperatorFailsItsTableEntry) {
  const Matrix logits = rows_of({inputs::make_row(inputs::RowKind::random_normal, 64, fp32, 5)});
  const struct {
    const char* entry;
    kernels::Operation operation;
    void (*run)(const Matrix&, double, Matrix&);
  } wrong[] = {
      {"ssmax", kernels::Operation::scalable_softmax, run_double_rows<ssmax_with_log2>},
      {"sigmoid", kernels::Operation::sigmoid_attention, run_double_rows<sigmoid_without_bias>},
      {"stick_breaking", kernels::Operation::stick_breaking, run_double_rows<stick_breaking_farthest_first>}};
  for (const auto& variant : wrong) {
    const SoftmaxKernel kernel{.name = variant.entry,
                               .description = "a wrong variant",
                               .operation = variant.operation,
                               .input = &fp32,
                               .output = &fp32,
                               .accumulation = &fp32,
                               .deliberately_broken = true,
                               .run = variant.run,
                               .tolerance = metrics::tolerance_for(variant.entry)};
    Matrix actual;
    kernel.run(logits, 1.0, actual);
    const auto evaluation =
        metrics::judge_softmax({kernel.operation, kernel.output, &metrics::tolerance_for(variant.entry)},
                               logits, 1.0, std::move(actual));
    EXPECT_FALSE(evaluation.comparison.passed()) << variant.entry;
    EXPECT_GT(evaluation.comparison.max_bound_ratio, 100.0) << variant.entry;
  }
  // ...while the registered kernels pass on the same row.
  for (const char* name : {"ssmax", "sigmoid", "stick_breaking"}) {
    EXPECT_TRUE(
        metrics::evaluate_softmax(*kernels::find_softmax_kernel(name), logits, 1.0).comparison.passed())
        << name;
  }
}

// The fused narrow cores (read bf16 or fp16, compute in fp32, write the narrow format) give
// exactly what the fp32 core gives on the widened row rounded once: the same arithmetic, so the
// same bits, on every row kind, size (tails included), temperature sign and SIMD target.
template <typename Storage>
std::size_t expect_fused_equals_widened(
    const std::vector<std::pair<void (*)(const Storage*, Storage*, std::size_t, float),
                                void (*)(const float*, float*, std::size_t, float)>>& pairs,
    const FloatFormat& format, std::int64_t target) {
  std::size_t compared = 0;
  for (const inputs::RowKind kind : inputs::all_row_kinds) {
    for (const std::size_t n : {1u, 5u, 16u, 33u, 1000u, 16384u}) {
      std::vector<double> row = inputs::make_row(kind, n, format, n + 11);
      // Masked entries leading the row (whole tiles of them where n allows) must still be written.
      if (kind == inputs::RowKind::masked_entries)
        std::fill(row.begin(), row.begin() + (n - 1) / 2, -INFINITY);
      std::vector<Storage> logits(n);
      for (std::size_t i = 0; i < n; ++i) logits[i] = Storage::from_float(static_cast<float>(row[i]));
      for (const float scale : {1.0F, 0.0F, -0.5F}) {
        for (const auto& [fused, core] : pairs) {
          std::vector<Storage> out(n, Storage{0x7E01}), expected(n);  // a NaN: unwritten entries show
          fused(logits.data(), out.data(), n, scale);
          kernels::through_fp32(logits.data(), expected.data(), n, scale, core);
          for (std::size_t i = 0; i < n; ++i) {
            EXPECT_EQ(out[i].bits, expected[i].bits)
                << hwy::TargetName(target) << " " << format.name << " " << inputs::row_kind_name(kind)
                << " n=" << n << " scale=" << scale << " index " << i;
            if (out[i].bits != expected[i].bits) return compared;
          }
          compared += n;
        }
      }
    }
  }
  return compared;
}

TEST(FusedNarrowCores, EqualTheFp32CoreOnTheWidenedRowBitForBit) {
  std::size_t compared = 0;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    compared += expect_fused_equals_widened<Bfloat16>(
        {{kernels::softmax_safe3_bf16, kernels::softmax_safe3_fp32},
         {kernels::softmax_online2_bf16, kernels::softmax_online2_fp32}},
        bf16, target);
    compared +=
        expect_fused_equals_widened<Float16>({{kernels::softmax_safe3_fp16, kernels::softmax_safe3_fp32},
                                              {kernels::softmax_online2_fp16, kernels::softmax_online2_fp32}},
                                             fp16, target);
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GT(compared, 200000u);
}

// online2 keeps one segment per vector in which some lane's running max grew. A rising row (every
// vector a new segment), a falling one (one segment) and a rising row with masked entries
// interleaved are its extremes; each stays within the table.
TEST(Online2, SegmentExtremesStayWithinTheTable) {
  const SoftmaxKernel& kernel = *kernels::find_softmax_kernel("online2");
  for (const std::size_t n : {7u, 64u, 1000u, 16384u}) {
    std::vector<double> rising(n), falling(n), rising_masked(n);
    for (std::size_t i = 0; i < n; ++i) {
      rising[i] = static_cast<float>(-20.0 + 40.0 * static_cast<double>(i) / static_cast<double>(n));
      falling[n - 1 - i] = rising[i];
      rising_masked[i] = i % 3 == 1 ? -INFINITY : rising[i];
    }
    for (const auto& row : {rising, falling, rising_masked}) {
      for (const double theta : {1.0, -0.5}) {
        const auto evaluation = metrics::evaluate_softmax(kernel, rows_of({row}), theta);
        EXPECT_TRUE(evaluation.comparison.passed())
            << "n=" << n << " theta=" << theta << ": " << evaluation.comparison.worst.describe();
      }
    }
  }
}

// The quantized kernels follow TFLite's arithmetic exactly: code = lround(table[max - q] * 256 /
// sum) + zero point, saturated, with table[d] = expf(-d * scale * beta). The tolerance table grants
// one code (for the tie TFLite's lround breaks away from zero), so it cannot see a kernel that
// floors instead; this test can. Outputs within 2^-10 of a half code may go either way (the
// kernel's float sum is kept per SIMD lane); every other output must be exact, on every target.
TEST(Quantized, FollowsTfLiteRoundingOnEveryTarget) {
  std::size_t exact = 0;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    DeterministicRandom random(41);
    for (const std::size_t n : {1u, 7u, 100u, 1000u}) {
      for (const float beta : {1.0F, 0.5F}) {
        std::vector<std::int8_t> codes(n);
        for (auto& code : codes)
          code = static_cast<std::int8_t>(static_cast<int>(random.next_u64() % 256) - 128);
        std::vector<std::int8_t> out8(n);
        std::vector<std::uint8_t> outu8(n);
        kernels::softmax_int8(codes.data(), out8.data(), n, beta);
        kernels::softmax_uint8(codes.data(), outu8.data(), n, beta);
        const std::int8_t largest = *std::max_element(codes.begin(), codes.end());
        const auto table = [&](std::size_t i) {
          return std::exp(-static_cast<float>(largest - codes[i]) * kernels::quantized_input_scale * beta);
        };
        double sum = 0;
        for (std::size_t i = 0; i < n; ++i) sum += table(i);
        for (std::size_t i = 0; i < n; ++i) {
          const double scaled = table(i) * 256.0 / sum;
          const double fraction = scaled - std::floor(scaled);
          const long nearest = std::lround(scaled);
          const std::string where = std::string(hwy::TargetName(target)) + " n=" + std::to_string(n) +
                                    " beta=" + std::to_string(beta) + " index " + std::to_string(i);
          if (std::fabs(fraction - 0.5) > 0x1p-10) {
            ASSERT_EQ(out8[i], std::clamp(nearest - 128, -128L, 127L)) << where << " scaled " << scaled;
            ASSERT_EQ(outu8[i], std::clamp(nearest, 0L, 255L)) << where << " scaled " << scaled;
            ++exact;
          } else {
            ASSERT_LE(std::abs(out8[i] + 128 - nearest), 1) << where;
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GT(exact, 5000u);
}

TEST(Dispatch, EverySimdTargetStaysWithinTheTable) {
  std::vector<std::string> targets;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    targets.emplace_back(hwy::TargetName(target));
    for (const SoftmaxKernel& kernel : kernels::softmax_kernels()) {
      if (!kernel.simd_dispatched || kernel.deliberately_broken) continue;
      const std::string_view name = kernel.name;
      for (const inputs::RowKind kind : inputs::all_row_kinds) {
        const Matrix logits = rows_of({inputs::make_row(kind, 1000, *kernel.input, 3)});
        const auto evaluation = metrics::evaluate_softmax(kernel, logits, 1.0);
        EXPECT_TRUE(evaluation.comparison.passed())
            << name << " on " << targets.back() << ", " << inputs::row_kind_name(kind) << ": "
            << evaluation.comparison.worst.describe();
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
  EXPECT_GE(targets.size(), 2u) << "expected a SIMD target and a scalar fallback";
  const auto dispatched = std::count_if(kernels::softmax_kernels().begin(), kernels::softmax_kernels().end(),
                                        [](const SoftmaxKernel& k) { return k.simd_dispatched; });
  EXPECT_GE(dispatched, 9) << "the registry marks the SIMD-dispatched kernels";
}

// The SIMD row conversions on every compiled target agree with the exact scalar ones on every
// bf16/fp16 midpoint and its neighbours (Highway 1.0's own demotions truncate on some targets).
TEST(Dispatch, RowConversionsRoundToNearestEvenOnEveryTarget) {
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    for (const FloatFormat* format : {&bf16, &fp16}) {
      const double value = decode(bits, *format);
      const double next = next_up(value, *format);
      if (!std::isfinite(value) || !std::isfinite(next)) continue;
      const auto midpoint = static_cast<float>(value + (next - value) / 2);
      values.insert(values.end(),
                    {midpoint, std::nextafter(midpoint, -INFINITY), std::nextafter(midpoint, INFINITY)});
    }
  }
  values.push_back(NAN);
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::vector<Bfloat16> as_bf16(values.size());
    std::vector<Float16> as_fp16(values.size());
    kernels::narrow(values.data(), as_bf16.data(), values.size());
    kernels::narrow(values.data(), as_fp16.data(), values.size());
    std::vector<float> back(values.size());
    kernels::widen(as_bf16.data(), back.data(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(as_bf16[i].bits, Bfloat16::from_float(values[i]).bits)
          << hwy::TargetName(target) << " " << values[i];
      ASSERT_EQ(as_fp16[i].bits, Float16::from_float(values[i]).bits)
          << hwy::TargetName(target) << " " << values[i];
      if (!std::isnan(values[i])) {
        ASSERT_EQ(back[i], as_bf16[i].to_float());
      }
    }
    kernels::widen(as_fp16.data(), back.data(), values.size());
    for (std::size_t i = 0; i + 1 < values.size(); ++i) ASSERT_EQ(back[i], as_fp16[i].to_float());
    // Widening every pattern, infinities and NaNs included, is exact (Highway 1.0's fp16
    // emulation is not: it maps inf and NaN to finite values).
    std::vector<Bfloat16> every_bf16(65536);
    std::vector<Float16> every_fp16(65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      every_bf16[bits].bits = static_cast<std::uint16_t>(bits);
      every_fp16[bits].bits = static_cast<std::uint16_t>(bits);
    }
    std::vector<float> wide_bf16(65536), wide_fp16(65536);
    kernels::widen(every_bf16.data(), wide_bf16.data(), 65536);
    kernels::widen(every_fp16.data(), wide_fp16.data(), 65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      for (const auto& [actual, expected] : {std::pair{wide_bf16[bits], every_bf16[bits].to_float()},
                                             std::pair{wide_fp16[bits], every_fp16[bits].to_float()}}) {
        if (std::isnan(expected)) {
          ASSERT_TRUE(std::isnan(actual)) << hwy::TargetName(target) << " pattern " << bits;
        } else {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(actual), std::bit_cast<std::uint32_t>(expected))
              << hwy::TargetName(target) << " pattern " << bits;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(AttentionKernels, StayWithinTheirTableEntries) {
  DeterministicRandom random(41);
  for (const auto& kernel : kernels::attention_kernels()) {
    if (kernel.deliberately_broken) continue;  // judged by its own tests (fp8_attention_test)
    for (const std::size_t n : {1u, 5u, 64u, 65u, 300u}) {
      for (const bool causal : {false, true}) {
        const std::size_t d = n == 300 ? 64 : 16;
        Matrix q(4, d), k(n, d), v(n, 8);
        for (auto* matrix : {&q, &k, &v}) {
          for (double& x : matrix->values) x = round_to_format(random.normal(0, 1), *kernel.input);
        }
        tensor::HeadScores scores;
        scores.causal = causal;
        const auto evaluation = metrics::evaluate_attention(kernel, q, k, v, scores);
        ASSERT_TRUE(evaluation.comparison.passed()) << kernel.name << " n=" << n << " causal=" << causal
                                                    << ": " << evaluation.comparison.worst.describe();
      }
    }
  }
}

// Every mask and modifier, on every attention kernel: within the table entry when the kernel is
// told the scores, and failing when it computes without one modifier (a kernel that ignores the
// window, misaligns causal, drops the cap, skips the sink or the bias) -- the mutation check.
TEST(AttentionKernels, HonourEveryMaskAndModifierAndFailWithoutIt) {
  DeterministicRandom random(43);
  const std::size_t m = 6;
  const std::size_t n = 150;
  const std::size_t d = 32;
  std::vector<double> bias(m * n);
  for (double& b : bias)
    b = random.below(7) == 0 ? -1e9 : (random.below(9) == 0 ? -INFINITY : 0.5 * random.normal(0, 1));
  struct Variant {
    const char* name;
    tensor::HeadScores scores;
  };
  std::vector<Variant> variants;
  const auto with = [&](const char* name, auto&& set) {
    tensor::HeadScores scores;
    set(scores);
    variants.push_back({name, scores});
  };
  with("causal bottom-right", [](auto& s) {
    s.causal = true;
    s.alignment = tensor::DiagonalAlignment::bottom_right;
  });
  with("window (16, 0)", [](auto& s) {
    s.window_left = 16;
    s.window_right = 0;
    s.alignment = tensor::DiagonalAlignment::bottom_right;
  });
  with("soft-cap 1", [](auto& s) { s.softcap = 1.0; });
  with("ALiBi 0.5", [](auto& s) { s.alibi_slope = 0.5; });
  with("sink 4", [](auto& s) { s.sink = 4.0; });
  with("bias, -1e9 and -inf", [&](auto& s) {
    s.bias = bias;
    s.row_stride = n;
  });
  with("scale 0.3, theta 0.5", [](auto& s) {
    s.scale = 0.3;
    s.theta = 0.5;
  });
  for (const auto& kernel : kernels::attention_kernels()) {
    Matrix q(m, d), k(n, d), v(n, 8);
    for (auto* matrix : {&q, &k, &v}) {
      for (double& x : matrix->values) x = round_to_format(random.normal(0, 1.5), *kernel.input);
    }
    if (kernel.deliberately_broken) continue;  // judged by its own tests (fp8_attention_test)
    const metrics::JudgeSpec spec{kernels::Operation::attention, kernel.output,
                                  &metrics::tolerance_for(kernel.name)};
    // A mutation can only be caught where leaving the modifier out moves the exact answer beyond the
    // tolerance (benchdnn's MISTRUSTED otherwise): a coarse kernel (FP8) cannot see a sink or a
    // bottom-right diagonal that changes the outputs less than its own rounding allows.
    // A kernel that quantises its own inputs (MXFP8) is judged on what its declared rule gives.
    Matrix judged_q = q, judged_k = k, judged_v = v;
    if (kernel.declared_inputs != nullptr) kernel.declared_inputs(judged_q, judged_k, judged_v, {});
    const Matrix exact_without = reference::attention(judged_q, judged_k, judged_v, *kernel.output).output;
    std::size_t discriminating = 0;
    for (const auto& variant : variants) {
      const auto honest = metrics::evaluate_attention(kernel, q, k, v, variant.scores);
      EXPECT_TRUE(honest.comparison.passed())
          << kernel.name << " " << variant.name << ": " << honest.comparison.worst.describe();
      if (metrics::judge_attention(spec, judged_q, judged_k, judged_v, variant.scores, exact_without)
              .comparison.passed())
        continue;
      ++discriminating;
      Matrix ignoring;
      kernel.run(q, k, v, tensor::HeadScores{}, ignoring, nullptr);
      const auto mutant =
          metrics::judge_attention(spec, judged_q, judged_k, judged_v, variant.scores, ignoring);
      EXPECT_FALSE(mutant.comparison.passed()) << kernel.name << " ignoring " << variant.name;
    }
    // Every variant discriminates for the fp32 and bf16 kernels; FP8's and MXFP8's tolerance (e4m3 P)
    // lets two through,
    // and so does a recipe that rounds the scores to bf16/fp16 (PyTorch's math path): a sink or a
    // temperature that moves the logits by less than the scores' own rounding cannot be told apart.
    const metrics::Tolerance& tolerance = metrics::tolerance_for(kernel.name);
    const bool coarse = tolerance.probability_format == &fp8_e4m3 || tolerance.scores_in_output > 0;
    EXPECT_GE(discriminating, coarse ? variants.size() - 2 : variants.size()) << kernel.name;
  }
}

TEST(Registry, EveryKernelHasATableEntryAndADescription) {
  for (const auto& kernel : kernels::softmax_kernels()) {
    EXPECT_NO_THROW((void)metrics::tolerance_for(kernel.name));
    EXPECT_FALSE(kernel.description.empty());
  }
  for (const auto& kernel : kernels::attention_kernels())
    EXPECT_NO_THROW((void)metrics::tolerance_for(kernel.name));
  EXPECT_THROW((void)metrics::tolerance_for("no_such_kernel"), InputError);
}

TEST(Registry, InputsTheKernelsFormatCannotHoldAreRejected) {
  const Matrix logits = rows_of({{1.0, 1.0 + 0x1p-20}});
  Matrix out;
  EXPECT_THROW(kernels::find_softmax_kernel("safe3_bf16")->run(logits, 1.0, out), InputError);
}

// The storage conversions kernels use, against the exact generic rounding, on every bf16 and fp16
// pattern, every midpoint and its float neighbours.
TEST(Storage, FastConversionsRoundExactlyAsTheFormatsDo) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const double bf16_value = decode(bits, bf16);
    const double fp16_value = decode(bits, fp16);
    if (!std::isnan(bf16_value)) {
      ASSERT_EQ(Bfloat16{static_cast<std::uint16_t>(bits)}.to_float(), bf16_value);
      const double next = next_up(bf16_value, bf16);
      if (std::isfinite(bf16_value) && std::isfinite(next)) {
        const auto midpoint = static_cast<float>(bf16_value + (next - bf16_value) / 2);
        for (const float x :
             {midpoint, std::nextafter(midpoint, -INFINITY), std::nextafter(midpoint, INFINITY)}) {
          ASSERT_EQ(Bfloat16::from_float(x).to_float(), round_to_format(x, bf16)) << hex_float(x);
        }
      }
    }
    if (!std::isnan(fp16_value)) {
      ASSERT_EQ(Float16{static_cast<std::uint16_t>(bits)}.to_float(), fp16_value);
      const double next = next_up(fp16_value, fp16);
      if (std::isfinite(fp16_value) && std::isfinite(next)) {
        const auto midpoint = static_cast<float>(fp16_value + (next - fp16_value) / 2);
        for (const float x :
             {midpoint, std::nextafter(midpoint, -INFINITY), std::nextafter(midpoint, INFINITY)}) {
          ASSERT_EQ(Float16::from_float(x).to_float(), round_to_format(x, fp16)) << hex_float(x);
        }
      }
    }
  }
  EXPECT_TRUE(std::isnan(Bfloat16::from_float(NAN).to_float()));
  EXPECT_EQ(Bfloat16::from_float(3.4e38F).to_float(), INFINITY);
  for (std::uint32_t bits = 0; bits < 256; ++bits) {
    const double value = decode(bits, fp8_e4m3);
    if (std::isnan(value)) continue;
    ASSERT_EQ(Float8E4M3::from_float(static_cast<float>(value)).bits, bits);
  }
}

}  // namespace
}  // namespace sharpcheck
