// The double stage's SIMD loops (reference/double_stage_simd.hpp) against the scalar formulas that
// double_stage.cpp proves, bit for bit, on every SIMD target this build compiled (the scalar or
// emulated fallback included), and the whole softmax on each target against the MPFR loop alone.
#include "reference/double_stage_simd.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "reference/certified_exp_constants.hpp"
#include "reference/double_stage.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck {
namespace {

// Runs body(target name) once per compiled target, then restores the dispatcher's own choice.
template <class Body>
void on_every_target(Body&& body) {
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    body(std::string(hwy::TargetName(target)));
  }
  hwy::SetSupportedTargetsForTest(0);
}

std::vector<double> exp_arguments() {
  std::vector<double> inputs;
  DeterministicRandom random(71);
  for (int i = 0; i < 200001; ++i) inputs.push_back(-708 * random.uniform());  // odd: a partial vector
  // Where k = round(x / ln 2) flips (ties of the rounding) and where r cancels, every k.
  for (int k = 0; k <= 1021; ++k) {
    for (const double centre : {-k * 0x1.62e42fefa39efp-1, -(k + 0.5) * 0x1.62e42fefa39efp-1}) {
      double x = centre;
      for (int step = 0; step < 4; ++step) x = std::nextafter(x, 0.0);
      for (int step = 0; step < 9; ++step, x = std::nextafter(x, -INFINITY)) {
        if (x <= 0 && x >= -708) inputs.push_back(x);
      }
    }
  }
  for (const double x : {0.0, -0.0, -0x1p-1074, -0x1p-60, -0.5 * 0x1.62e42fefa39efp-1, -708.0}) {
    inputs.push_back(x);
  }
  return inputs;
}

// How many lanes differ from `scalar` in their bits.
template <class Scalar>
std::size_t differing_bits(const std::vector<double>& x, const std::vector<double>& lanes, Scalar scalar) {
  std::size_t differing = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(lanes[i]) != std::bit_cast<std::uint64_t>(scalar(x[i]))) ++differing;
  }
  return differing;
}

// certified_exp with Horner's rule fused (what -ffp-contract=fast would make of it on an FMA target).
double fused_certified_exp(double x) {
  namespace constants = reference::certified_exp_constants;
  const double k = std::nearbyint(x * constants::inverse_ln2);
  const double r = std::fma(-k, constants::ln2_low, std::fma(-k, constants::ln2_high, x));
  double p = constants::taylor[constants::degree];
  for (int i = constants::degree - 1; i >= 0; --i) p = std::fma(p, r, constants::taylor[i]);
  return std::ldexp(p, static_cast<int>(k));
}

TEST(DoubleStageSimd, CertifiedExpLanesEqualTheScalarFormulaBitForBitOnEveryTarget) {
  const std::vector<double> x = exp_arguments();
  std::vector<double> lanes(x.size());
  on_every_target([&](const std::string& target) {
    std::fill(lanes.begin(), lanes.end(), 0.0);
    reference::certified_exp_many(x, lanes);
    EXPECT_EQ(differing_bits(x, lanes, reference::certified_exp), 0u) << target;
  });
  // Mutation check: a fused evaluation (within the same proven bound) differs in its bits often
  // enough for this comparison to see it.
  reference::certified_exp_many(x, lanes);
  EXPECT_GT(differing_bits(x, lanes, fused_certified_exp), x.size() / 100);
}

// The scalar loop of decide_softmax_in_double before it was vectorised, as the proof states it.
struct ScalarPass {
  std::vector<double> weights, magnitudes;
  double largest = 0;
  std::size_t tiny = 0;
  bool finite = true;
};
ScalarPass scalar_pass(const std::vector<double>& logits, double shift, double theta) {
  ScalarPass pass;
  for (const double e : logits) {
    double z = e - shift;
    if (!std::isfinite(z)) pass.finite = false;
    if (theta != 1.0) z /= theta;
    pass.magnitudes.push_back(std::fabs(z));
    if (z < -700) {
      pass.weights.push_back(0);
      ++pass.tiny;
      continue;
    }
    pass.largest = std::max(pass.largest, std::fabs(z));
    pass.weights.push_back(reference::certified_exp(std::min(z, 0.0)));
  }
  return pass;
}

// Logits with a spread wide enough that some z fall below -700 (weight 0) and many near 0.
std::vector<double> spread_row(std::size_t n, std::uint64_t seed) {
  DeterministicRandom random(seed);
  std::vector<double> row(n);
  for (double& e : row) e = static_cast<float>(random.normal(0, 300));
  return row;
}

TEST(DoubleStageSimd, ExponentiationPassEqualsTheScalarLoopOnEveryTarget) {
  on_every_target([&](const std::string& target) {
    for (const std::size_t n : {1u, 3u, 8u, 13u, 1000u, 4099u}) {
      const std::vector<double> row = spread_row(n, n);
      const double largest = *std::max_element(row.begin(), row.end());
      for (const double theta : {1.0, 0.7, 3.0}) {
        const ScalarPass expected = scalar_pass(row, largest, theta);
        std::vector<double> weights(n), magnitudes(n);
        const auto found = reference::exponentiate_shifted(row, largest, theta, weights, magnitudes);
        const auto where = target + " n=" + std::to_string(n) + " theta=" + std::to_string(theta);
        EXPECT_TRUE(found.finite) << where;
        EXPECT_EQ(found.tiny, expected.tiny) << where;
        EXPECT_EQ(found.largest_magnitude, expected.largest) << where;
        EXPECT_EQ(differing_bits(weights, expected.weights, [](double w) { return w; }), 0u) << where;
        EXPECT_EQ(magnitudes, expected.magnitudes) << where;
      }
    }
    // A difference that overflows double is reported, in a full vector and in a partial one.
    for (const std::size_t n : {8u, 16u, 5u}) {
      std::vector<double> row(n, 1.0);
      row[n - 1] = -0x1.fffffffffffffp1023;
      std::vector<double> weights(n), magnitudes(n);
      EXPECT_FALSE(
          reference::exponentiate_shifted(row, 0x1.fffffffffffffp1023, 1.0, weights, magnitudes).finite)
          << target << " n=" << n;
    }
  });
}

TEST(DoubleStageSimd, Fp32DecisionsEqualTheBracketsRoundedOneByOneOnEveryTarget) {
  on_every_target([&](const std::string& target) {
    const std::size_t n = 5003;
    const std::vector<double> row = spread_row(n, 5);
    const double largest = *std::max_element(row.begin(), row.end());
    std::vector<double> weights(n), magnitudes(n), low(n), high(n), values(n);
    const auto found = reference::exponentiate_shifted(row, largest, 1.0, weights, magnitudes);
    double sum = 0;
    for (const double w : weights) sum += w;
    // A shared error large enough that some coefficients straddle an fp32 rounding boundary.
    for (const double shared : {0x1p-40, 0x1p-26}) {
      reference::bracket_coefficients(weights, magnitudes, sum, shared, low, high);
      const std::size_t decided =
          reference::decide_coefficients_in_fp32(weights, magnitudes, sum, shared, values);
      std::size_t expected_decided = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const float a = static_cast<float>(low[j]);
        const float b = static_cast<float>(high[j]);
        if (a == b) {
          ++expected_decided;
          EXPECT_EQ(values[j], a) << target << " j=" << j;
        } else {
          EXPECT_TRUE(std::isnan(values[j])) << target << " j=" << j;
        }
        EXPECT_LE(low[j], weights[j] / sum) << target << " j=" << j;
        EXPECT_GE(high[j], weights[j] / sum) << target << " j=" << j;
      }
      EXPECT_EQ(decided, expected_decided) << target;
      if (shared == 0x1p-26) {
        EXPECT_LT(decided, n) << target << ": the case must leave some undecided";
      }
    }
    EXPECT_GT(found.tiny, 0u);
  });
}

// The staged reference, every stage's SIMD on each target, against the MPFR loop alone: masked rows
// (the gathered path), every length up to 40 (partial vectors), fp32 and bf16 (the per-element
// rounding path), temperatures of both signs.
TEST(DoubleStageSimd, StagedSoftmaxEqualsTheMpfrLoopOnEveryTarget) {
  on_every_target([&](const std::string& target) {
    DeterministicRandom random(3);
    for (std::size_t n = 1; n <= 40; ++n) {
      std::vector<double> row(n);
      for (double& e : row) e = static_cast<float>(random.normal(0, 4));
      std::vector<std::uint8_t> keep(n, 1);
      for (std::size_t j = 0; j < n; j += 3) keep[j] = n > 1 && j > 0 ? 0 : 1;
      for (const FloatFormat* format : {&fp32, &bf16}) {
        for (const double theta : {1.0, 0.37, -2.0}) {
          for (const bool masked : {false, true}) {
            reference::RowOptions staged;
            staged.theta = theta;
            if (masked) staged.keep = keep;
            reference::RowOptions alone = staged;
            alone.mpfr_only = true;
            EXPECT_EQ(reference::softmax(row, *format, staged), reference::softmax(row, *format, alone))
                << target << " " << format->name << " n=" << n << " theta=" << theta << " masked=" << masked;
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace sharpcheck
