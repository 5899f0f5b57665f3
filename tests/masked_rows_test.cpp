// Verdicts on rows with additive masks (issue 15, items 1 and 2): the mask value must neither
// loosen the judgement of the unmasked entries nor let garbage on masked entries pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/random.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck {
namespace {

constexpr std::size_t real_entries = 16;
constexpr std::size_t padded_entries = 708;  // rows of 724, as in the report

// 16 normal logits then the mask value on the padding (values of fp32).
Matrix masked_rows(double mask, std::size_t rows, std::uint64_t seed) {
  DeterministicRandom random(seed);
  Matrix logits(rows, real_entries + padded_entries);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < logits.cols; ++j) {
      logits(r, j) = j < real_entries ? round_to_format(random.normal(0, 2), fp32) : mask;
    }
  }
  return logits;
}

metrics::Evaluation judge(const Matrix& logits, Matrix actual) {
  return metrics::judge_softmax(
      {kernels::Operation::softmax, &fp32, &metrics::tolerance_for("plugin_softmax")}, logits, 1.0,
      std::move(actual));
}

Matrix exact_outputs(const Matrix& logits) {
  Matrix exact(logits.rows, logits.cols);
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const auto row = reference::softmax(logits.row(r), fp32);
    std::copy(row.begin(), row.end(), exact.row(r).begin());
  }
  return exact;
}

const double finfo_min = -0x1.fffffep+127;  // torch.finfo(torch.float32).min

TEST(MaskedRows, TheExactOutputPassesWithTheSameUnmaskedAllowanceForEveryMaskValue) {
  const Matrix reference_logits = masked_rows(-INFINITY, 4, 7);
  const auto baseline = judge(reference_logits, exact_outputs(reference_logits));
  ASSERT_TRUE(baseline.comparison.passed()) << baseline.comparison.worst.describe();
  for (const double mask : {-1e4, -1e8, -1e9, finfo_min}) {
    const Matrix logits = masked_rows(mask, 4, 7);
    const auto evaluation = judge(logits, exact_outputs(logits));
    EXPECT_TRUE(evaluation.comparison.passed())
        << "mask " << mask << ": " << evaluation.comparison.worst.describe();
    EXPECT_EQ(evaluation.comparison.max_ulps, 0u);
    for (std::size_t r = 0; r < logits.rows; ++r) {
      for (std::size_t j = 0; j < real_entries; ++j) {
        const double ratio = evaluation.allowed(r, j) / baseline.allowed(r, j);
        EXPECT_NEAR(ratio, 1.0, 0.01) << "mask " << mask << " row " << r << " entry " << j;
      }
    }
  }
}

TEST(MaskedRows, GarbageOnPaddedRowsFails) {
  // Eight rows, the uniform 1/724 on every element, masked entries included.
  const Matrix logits = masked_rows(-1e8, 8, 11);
  Matrix uniform(logits.rows, logits.cols);
  for (double& p : uniform.values) p = round_to_format(1.0 / 724, fp32);
  const auto evaluation = judge(logits, uniform);
  EXPECT_FALSE(evaluation.comparison.passed());
  EXPECT_GT(evaluation.comparison.violation_count, 8 * padded_entries);  // every masked entry, at least
}

TEST(MaskedRows, MassOnMaskedEntriesFailsAtEveryMaskValue) {
  for (const double mask : {-1e4, -1e9, finfo_min}) {
    const Matrix logits = masked_rows(mask, 2, 13);
    Matrix actual = exact_outputs(logits);
    actual(0, real_entries + 5) = 0x1p-20;  // a masked entry given a visible weight
    const auto evaluation = judge(logits, actual);
    EXPECT_FALSE(evaluation.comparison.passed()) << "mask " << mask;
    EXPECT_EQ(evaluation.comparison.worst.index, real_entries + 5) << "mask " << mask;
  }
}

TEST(MaskedRows, SoundKernelsPassWithHuggingFaceAndBertMasks) {
  for (const char* name : {"safe3", "online2", "blocked", "safe3_bf16", "online2_bf16"}) {
    const auto* kernel = kernels::find_softmax_kernel(name);
    ASSERT_NE(kernel, nullptr) << name;
    for (const double mask : {-1e4, finfo_min}) {
      Matrix logits = masked_rows(mask, 4, 17);
      for (double& e : logits.values) e = round_to_format(e, *kernel->input);
      const auto evaluation = metrics::evaluate_softmax(*kernel, logits, 1.0);
      EXPECT_TRUE(evaluation.comparison.passed())
          << name << " mask " << mask << ": " << evaluation.comparison.worst.describe();
    }
  }
}

}  // namespace
}  // namespace sharpcheck
