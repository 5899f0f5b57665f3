// The kernels' exp (kernels/nonpositive_exp-inl.h) against its contract on every float in
// [-104, 0], on the dispatched SIMD target and on the scalar fallback (which has no FMA), with
// reference::certified_exp (relative error < 2^-47, proved in reference/double_stage.cpp) as the
// independent reference. A wrong polynomial must break the contract.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kernels/exp_polynomial.hpp"
#include "reference/double_stage.hpp"

namespace sharpcheck {
namespace {

constexpr std::uint32_t negative_zero_bits = 0x80000000U;
const std::uint32_t lowest_argument_bits = std::bit_cast<std::uint32_t>(-104.0F);
constexpr double contract_relative = 0x1p-23;  // 2u for fp32
constexpr double smallest_normal = 0x1p-126;
constexpr double smallest_subnormal = 0x1p-149;

struct SweepResult {
  double worst_relative = 0;  // normal results, in units of 2^-24
  double worst_absolute = 0;  // subnormal results, in units of 2^-149
  std::uint64_t violations = 0;
  float first_violation = 0;
  std::uint64_t checked = 0;
};

// Checks every `stride`-th float from -0 down to -104 (stride 1: every one), on `threads` threads.
// The reference errs by < 2^-47 relative, so the measured error must stay below the contract by
// that much for the true error to be within it.
SweepResult sweep(std::uint32_t stride, const kernels::ExpPolynomial& polynomial, unsigned threads) {
  const std::uint64_t count = (lowest_argument_bits - negative_zero_bits) / stride + 1;
  std::vector<SweepResult> partial(threads);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      SweepResult& result = partial[t];
      constexpr std::uint64_t block = 1 << 16;
      std::vector<float> in(block), out(block);
      for (std::uint64_t first = t * block; first < count; first += threads * block) {
        const std::uint64_t length = std::min(block, count - first);
        for (std::uint64_t i = 0; i < length; ++i) {
          in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(negative_zero_bits + (first + i) * stride));
        }
        kernels::exp_of_nonpositive(in.data(), out.data(), length, polynomial);
        for (std::uint64_t i = 0; i < length; ++i) {
          const double expected = reference::certified_exp(in[i]);
          const double error = std::fabs(static_cast<double>(out[i]) - expected);
          bool within;
          if (expected >= smallest_normal) {
            result.worst_relative = std::max(result.worst_relative, error / expected / 0x1p-24);
            within = error <= (contract_relative - 0x1p-46) * expected;
          } else {
            result.worst_absolute = std::max(result.worst_absolute, error / smallest_subnormal);
            within = error <= smallest_subnormal - 0x1p-46 * expected;
          }
          if (!within && result.violations++ == 0) result.first_violation = in[i];
        }
        result.checked += length;
      }
    });
  }
  for (auto& worker : workers) worker.join();
  SweepResult all;
  for (const auto& result : partial) {
    all.worst_relative = std::max(all.worst_relative, result.worst_relative);
    all.worst_absolute = std::max(all.worst_absolute, result.worst_absolute);
    if (all.violations == 0 && result.violations != 0) all.first_violation = result.first_violation;
    all.violations += result.violations;
    all.checked += result.checked;
  }
  return all;
}

unsigned worker_count() { return std::max(1U, std::min(4U, std::thread::hardware_concurrency())); }

// The dispatched target and the last compiled one (the scalar or emulated fallback).
std::vector<std::int64_t> targets_to_sweep() {
  const std::vector<std::int64_t> all = hwy::SupportedAndGeneratedTargets();
  std::vector<std::int64_t> chosen{all.front()};
  if (all.back() != all.front()) chosen.push_back(all.back());
  return chosen;
}

TEST(NonpositiveExp, MeetsItsContractOnEveryFloatFromMinus104ToZero) {
  for (const std::int64_t target : targets_to_sweep()) {
    hwy::SetSupportedTargetsForTest(target);
    const SweepResult result = sweep(1, kernels::softmax_exp_polynomial, worker_count());
    EXPECT_EQ(result.checked, std::uint64_t{lowest_argument_bits - negative_zero_bits} + 1);
    EXPECT_EQ(result.violations, 0u) << hwy::TargetName(target) << ": first at x = " << std::hexfloat
                                     << result.first_violation;
    // The measured figures, for docs/kernels.md.
    std::printf("%s: worst relative error %.4f u (contract 2 u), worst subnormal error %.4f of 2^-149\n",
                hwy::TargetName(target), result.worst_relative, result.worst_absolute);
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(NonpositiveExp, SpecialValuesOnEveryTarget) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> in{-0.0F,
                              0.0F,
                              -infinity,
                              nan,
                              -104.0F,
                              -1e30F,
                              -std::numeric_limits<float>::max(),
                              -std::numeric_limits<float>::denorm_min(),
                              std::bit_cast<float>(0xFFC00001U)};
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::vector<float> out(in.size());
    kernels::exp_of_nonpositive(in.data(), out.data(), in.size());
    const std::string name = hwy::TargetName(target);
    EXPECT_EQ(out[0], 1.0F) << name;
    EXPECT_EQ(out[1], 1.0F) << name;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(out[2]), 0u) << name << ": exp(-inf) must be +0";
    EXPECT_TRUE(std::isnan(out[3])) << name;
    EXPECT_EQ(out[4], 0.0F) << name << ": exp(-104) < 2^-150 rounds to 0";
    EXPECT_EQ(out[5], 0.0F) << name;
    EXPECT_EQ(out[6], 0.0F) << name;
    EXPECT_EQ(out[7], 1.0F) << name;
    EXPECT_TRUE(std::isnan(out[8])) << name << ": a negative NaN must stay NaN";
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Every float from -104 down to -inf gives +0 (sampled every 4,099th pattern and the ends).
TEST(NonpositiveExp, GivesZeroBelowMinus104) {
  std::vector<float> in;
  for (std::uint64_t bits = lowest_argument_bits + 1; bits <= 0xFF800000U; bits += 4099) {
    in.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  in.push_back(std::bit_cast<float>(0xFF7FFFFFU));
  std::vector<float> out(in.size());
  kernels::exp_of_nonpositive(in.data(), out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], 0.0F) << std::hexfloat << in[i];
}

// Mutation: the degree-5 Taylor polynomial (c6 = 0), a natural mistake, errs by about 40u at the
// ends of the reduced range; the same sweep must catch it.
TEST(NonpositiveExp, TheSweepCatchesATruncatedPolynomial) {
  const kernels::ExpPolynomial taylor_degree_5{0.5F, 1.0F / 6, 1.0F / 24, 1.0F / 120, 0.0F};
  const SweepResult result = sweep(1021, taylor_degree_5, worker_count());
  EXPECT_GT(result.violations, 1000u);
  EXPECT_GT(result.worst_relative, 10.0);
}

}  // namespace
}  // namespace sharpcheck
