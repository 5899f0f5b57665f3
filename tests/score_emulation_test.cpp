// The math path's scores, emulated (metrics/score_emulation.hpp), against kernels written
// independently here in IEEE float the way PyTorch's math path and its variants form them, in
// several summation orders: every kernel score must lie within the emulation's ambiguity of its
// centre, the ambiguity must be rare (else the emulation would not discriminate), and a kernel of
// another chain must fall outside it (the test can fail).
#include "metrics/score_emulation.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/random.hpp"

namespace sharpcheck::metrics {
namespace {

using Order = std::function<float(const std::vector<float>&)>;

float in_order(const std::vector<float>& terms) {
  float sum = 0;
  for (const float t : terms) sum += t;
  return sum;
}
float reversed(const std::vector<float>& terms) {
  float sum = 0;
  for (auto t = terms.rbegin(); t != terms.rend(); ++t) sum += *t;
  return sum;
}
float eight_lanes(const std::vector<float>& terms) {  // a SIMD GEMM's lanes, then their sum
  float lanes[8] = {};
  for (std::size_t t = 0; t < terms.size(); ++t) lanes[t % 8] += terms[t];
  return std::accumulate(std::begin(lanes), std::end(lanes), 0.0F);
}
float pairwise(const std::vector<float>& terms) {
  std::vector<float> level = terms;
  while (level.size() > 1) {
    std::vector<float> next;
    for (std::size_t t = 0; t < level.size(); t += 2)
      next.push_back(t + 1 < level.size() ? level[t] + level[t + 1] : level[t]);
    level = next;
  }
  return level.empty() ? 0.0F : level[0];
}

float to(const FloatFormat& format, float x) {
  return static_cast<float>(round_to_format(static_cast<double>(x), format));
}

// A kernel's score, chain by chain, as PyTorch code forms it (q, k already in the format).
float kernel_score(ScoreChain chain, const FloatFormat& f, std::span<const float> q, std::span<const float> k,
                   double scale, const Order& order, bool divide) {
  const auto root = static_cast<float>(std::sqrt(scale));
  std::vector<float> terms(q.size());
  for (std::size_t t = 0; t < q.size(); ++t) {
    float a = q[t], b = k[t];
    if (chain == ScoreChain::both_prescaled) a = to(f, a * root), b = to(f, b * root);
    if (chain == ScoreChain::query_prescaled) a = to(f, a * static_cast<float>(scale));
    terms[t] = a * b;
  }
  const float accumulator = order(terms);
  switch (chain) {
    case ScoreChain::product_then_scale:
      return divide ? to(f, to(f, accumulator) / static_cast<float>(1 / scale))
                    : to(f, to(f, accumulator) * static_cast<float>(scale));
    case ScoreChain::scaled_accumulator:
      return to(f, accumulator * static_cast<float>(scale));
    default:
      return to(f, accumulator);
  }
}

struct Head {
  Matrix q, k;
  std::vector<float> qf, kf;
};

Head random_head(std::size_t m, std::size_t n, std::size_t d, const FloatFormat& f, double sigma,
                 std::uint64_t seed) {
  DeterministicRandom random(seed);
  Head h{Matrix(m, d), Matrix(n, d), {}, {}};
  for (double& x : h.q.values) x = round_to_format(random.normal(0, sigma), f);
  for (double& x : h.k.values) x = round_to_format(random.normal(0, sigma), f);
  for (const double x : h.q.values) h.qf.push_back(static_cast<float>(x));
  for (const double x : h.k.values) h.kf.push_back(static_cast<float>(x));
  return h;
}

struct Tally {
  std::size_t scores = 0, ambiguous = 0, outside = 0;
};

// Every score of `kernel_chain`'s kernel (each order, multiplying and dividing) against the
// emulation of `emulated`.
Tally tally(ScoreChain emulated, ScoreChain kernel_chain, const FloatFormat& f, std::size_t d, double sigma,
            std::uint64_t seed) {
  const Head h = random_head(16, 64, d, f, sigma, seed);
  tensor::HeadScores scores;
  scores.queries = 16;
  scores.keys = scores.row_stride = 64;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  const ScoreEmulator emulator(emulated, h.q, h.k, scores, f);
  std::vector<std::size_t> visible(64);
  std::iota(visible.begin(), visible.end(), 0);
  Tally result;
  EmulatedRow row;
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(emulator.row(i, visible, row));
    for (std::size_t j = 0; j < 64; ++j) {
      ++result.scores;
      result.ambiguous += row.ambiguity[j] > 0 ? 1 : 0;
      for (const Order& order : {Order(in_order), Order(reversed), Order(eight_lanes), Order(pairwise)}) {
        for (const bool divide : {false, true}) {
          const float got =
              kernel_score(kernel_chain, f, {&h.qf[i * d], d}, {&h.kf[j * d], d}, scale, order, divide);
          if (std::fabs(static_cast<double>(got) - row.z[j]) > row.ambiguity[j]) ++result.outside;
        }
      }
    }
  }
  return result;
}

TEST(ScoreEmulation, EveryHonestKernelScoreLiesWithinTheAmbiguityWhichIsRare) {
  std::uint64_t seed = 1;
  for (const FloatFormat* f : {&bf16, &fp16}) {
    for (const ScoreChain chain : score_chains()) {
      for (const std::size_t d : {64UL, 80UL, 128UL}) {  // 1/8 is exact; 1/sqrt(80), 1/sqrt(128) are not
        for (const double sigma : {1.0, 3.0}) {
          const Tally t = tally(chain, chain, *f, d, sigma, ++seed);
          EXPECT_EQ(t.outside, 0U) << f->name << " " << describe(chain) << " d=" << d << " sigma=" << sigma;
          // A score is ambiguous only near a rounding tie (the fp32 sum's worst case, d 2^-24 sum |q k|,
          // against the format's step): under half of them even for fp16 at d = 128.
          EXPECT_LT(t.ambiguous * 2, t.scores) << f->name << " " << describe(chain) << " d=" << d;
        }
      }
    }
  }
}

// The mutation check: a kernel of another chain (the scale applied before the one rounding, or
// the product not rounded before the scale) is not the emulated one: at d = 128 (a scale that is
// not a power of two) at least a tenth of its scores fall outside the ambiguity.
TEST(ScoreEmulation, AKernelOfAnotherChainFallsOutside) {
  const Tally single =
      tally(ScoreChain::product_then_scale, ScoreChain::scaled_accumulator, bf16, 128, 1.0, 7);
  EXPECT_GT(single.outside * 10, single.scores * 8) << single.outside << " of " << single.scores * 8;
  const Tally prescaled =
      tally(ScoreChain::product_then_scale, ScoreChain::both_prescaled, bf16, 128, 1.0, 8);
  EXPECT_GT(prescaled.outside * 10, prescaled.scores * 8)
      << prescaled.outside << " of " << prescaled.scores * 8;
}

// torch 1.13 on the CPU rounds a Python scalar to the tensor's dtype: `s * scale` multiplies by
// F(scale), `s / math.sqrt(d)` divides by F(sqrt(d)). Such kernels lie within the ambiguity of the
// emulation that holds the factor so, and (the mutation check) many fall outside the fp32 one at
// d = 80 and 128, whose scales are not powers of two.
TEST(ScoreEmulation, AScaleRoundedToTheFormatIsEmulatedToo) {
  for (const FloatFormat* f : {&bf16, &fp16}) {
    for (const std::size_t d : {80UL, 128UL}) {
      const Head h = random_head(16, 64, d, *f, 2.0, d);
      tensor::HeadScores scores;
      scores.queries = 16;
      scores.keys = scores.row_stride = 64;
      const double scale = 1 / std::sqrt(static_cast<double>(d));
      std::vector<std::size_t> visible(64);
      std::iota(visible.begin(), visible.end(), 0);
      for (const FactorRounding rounding :
           {FactorRounding::format_product, FactorRounding::format_quotient}) {
        const ScoreEmulator held(ScoreChain::product_then_scale, h.q, h.k, scores, *f, rounding);
        const ScoreEmulator fp32(ScoreChain::product_then_scale, h.q, h.k, scores, *f);
        ASSERT_TRUE(held.distinct());
        std::size_t outside_held = 0, outside_fp32 = 0;
        EmulatedRow a, b;
        for (std::size_t i = 0; i < 16; ++i) {
          ASSERT_TRUE(held.row(i, visible, a) && fp32.row(i, visible, b));
          for (std::size_t j = 0; j < 64; ++j) {
            std::vector<float> terms(d);
            for (std::size_t t = 0; t < d; ++t) terms[t] = h.qf[i * d + t] * h.kf[j * d + t];
            const float s1 = to(*f, in_order(terms));
            const float got = rounding == FactorRounding::format_product
                                  ? to(*f, s1 * to(*f, static_cast<float>(scale)))
                                  : to(*f, s1 / to(*f, static_cast<float>(1 / scale)));
            outside_held += std::fabs(static_cast<double>(got) - a.z[j]) > a.ambiguity[j] ? 1 : 0;
            outside_fp32 += std::fabs(static_cast<double>(got) - b.z[j]) > b.ambiguity[j] ? 1 : 0;
          }
        }
        EXPECT_EQ(outside_held, 0U) << f->name << " d=" << d << " " << describe(rounding);
        EXPECT_GT(outside_fp32, 0U) << f->name << " d=" << d << " " << describe(rounding);
      }
    }
  }
}

TEST(ScoreEmulation, EveryHeadButATemperedOneIsEmulable) {
  tensor::HeadScores plain;
  EXPECT_TRUE(scores_emulable(plain));
  tensor::HeadScores capped = plain;
  capped.softcap = 30;
  EXPECT_TRUE(scores_emulable(capped));
  EXPECT_EQ(score_variants(plain).size(), score_chains().size() * factor_roundings().size());
  EXPECT_EQ(score_variants(capped).size(), 3 * score_chains().size() * factor_roundings().size());
  tensor::HeadScores warm = plain;
  warm.theta = 2;
  EXPECT_FALSE(scores_emulable(warm));
  tensor::HeadScores alibi = plain;
  alibi.alibi_slope = 0.5;
  EXPECT_TRUE(scores_emulable(alibi));
  const std::vector<double> bias = {0.0, -0.5, -INFINITY, -1e9};
  tensor::HeadScores biased = plain;
  biased.bias = bias;
  EXPECT_TRUE(scores_emulable(biased));
}

// A bias (an additive tensor, ALiBi) as kernels add it: the math path's `scores + bias` with the
// bias tensor in F (built in fp32 from the slope and cast, or handed in F), added in fp32 and
// rounded to F, or rounded once, or added before the score's own last rounding (a fused epilogue:
// torch.compile's pointwise fusion, baddbmm with beta = 1); ALiBi's slope held in fp32 or in F.
// Every such score lies within the emulation's ambiguity, which stays under 40% of the scores for a
// bias in F (the fused epilogue's double rounding makes about a fifth of bf16's ambiguous; with
// ALiBi added too, every score keeps a step or two); a kernel that adds the bias twice, or the
// slope with the wrong sign, falls outside.
struct BiasedKernel {
  bool slope_in_format;  // the slopes tensor in F (ALiBi)
  bool round_once;       // F(z + b) in one rounding, not F(fp32(z + b))
  bool fused = false;    // z not rounded before the bias: F(F(q k^T) * scale + b) in one fp32 epilogue
};

float biased_score(float z, double additive, double slope, double distance, const FloatFormat& f,
                   const BiasedKernel& kernel) {
  const float held_slope =
      kernel.slope_in_format ? to(f, static_cast<float>(slope)) : static_cast<float>(slope);
  const float bias = to(f, static_cast<float>(additive) - held_slope * static_cast<float>(distance));
  return kernel.round_once ? static_cast<float>(round_to_format(static_cast<double>(z) + bias, f))
                           : to(f, z + bias);
}

TEST(ScoreEmulation, ABiasIsAddedAsEveryKernelAddsItAndAWrongOneFallsOutside) {
  for (const FloatFormat* f : {&bf16, &fp16}) {
    const std::size_t m = 16, n = 64, d = 80;  // a scale 1/sqrt(80) that is not a power of two
    const Head h = random_head(m, n, d, *f, 1.0, 11);
    DeterministicRandom random(12);
    std::vector<double> additive(m * n), off_grid(m * n);
    for (double& b : additive) b = round_to_format(random.normal(0, 2), *f);  // a bias tensor in F
    for (double& b : off_grid) b = random.normal(0, 8);                       // one in fp64
    for (const auto& [slope, bias] : {std::pair{0.0, &additive}, std::pair{0.0625, &additive},
                                      std::pair{0.50195, &additive},  // bf16 holds this slope as 0.5
                                      std::pair{0.0, &off_grid}, std::pair{0.0625, &off_grid}}) {
      tensor::HeadScores scores;
      scores.queries = m;
      scores.keys = scores.row_stride = n;
      scores.bias = *bias;
      scores.alibi_slope = slope;
      const ScoreEmulator emulator(ScoreChain::product_then_scale, h.q, h.k, scores, *f);
      const double scale = 1 / std::sqrt(static_cast<double>(d));
      std::vector<std::size_t> visible(n);
      std::iota(visible.begin(), visible.end(), 0);
      EmulatedRow row;
      tensor::HeadScores unbiased = scores;
      unbiased.bias = {};
      unbiased.alibi_slope = 0;
      const ScoreEmulator plain(ScoreChain::product_then_scale, h.q, h.k, unbiased, *f);
      std::size_t outside = 0, ambiguous = 0, ambiguous_unbiased = 0, wrong_inside = 0;
      for (std::size_t i = 0; i < m; ++i) {
        ASSERT_TRUE(plain.row(i, visible, row));
        for (const double a : row.ambiguity) ambiguous_unbiased += a > 0 ? 1 : 0;
        ASSERT_TRUE(emulator.row(i, visible, row));
        for (std::size_t j = 0; j < n; ++j) {
          const float z = kernel_score(ScoreChain::product_then_scale, *f, {&h.qf[i * d], d},
                                       {&h.kf[j * d], d}, scale, Order(in_order), false);
          std::vector<float> products(d);
          for (std::size_t t = 0; t < d; ++t) products[t] = h.qf[i * d + t] * h.kf[j * d + t];
          const float unrounded = to(*f, in_order(products)) * static_cast<float>(scale);
          const auto terms = scores.bias_terms(i, j);
          const double distance = static_cast<double>(terms.distance);
          ambiguous += row.ambiguity[j] > 0 ? 1 : 0;
          for (const BiasedKernel kernel :
               {BiasedKernel{false, false}, BiasedKernel{true, false}, BiasedKernel{false, true},
                BiasedKernel{true, true}, BiasedKernel{false, false, true},
                BiasedKernel{true, false, true}}) {
            const float got =
                biased_score(kernel.fused ? unrounded : z, terms.additive, terms.slope, distance, *f, kernel);
            outside += std::fabs(static_cast<double>(got) - row.z[j]) > row.ambiguity[j] ? 1 : 0;
          }
          {  // the terms added one at a time, each in F: F(F(z + F(a)) + F(-slope d)), and ALiBi first
            const float alibi = to(*f, -static_cast<float>(terms.slope) * static_cast<float>(distance));
            const float mask = to(*f, static_cast<float>(terms.additive));
            for (const float got : {to(*f, to(*f, z + mask) + alibi), to(*f, to(*f, z + alibi) + mask)})
              outside += std::fabs(static_cast<double>(got) - row.z[j]) > row.ambiguity[j] ? 1 : 0;
          }
          const float twice = biased_score(biased_score(z, terms.additive, terms.slope, distance, *f, {}),
                                           terms.additive, terms.slope, distance, *f, {});
          const float flipped = biased_score(z, terms.additive, -terms.slope, distance, *f, {});
          const float wrong = slope == 0.0 ? twice : flipped;
          wrong_inside += std::fabs(static_cast<double>(wrong) - row.z[j]) <= row.ambiguity[j] ? 1 : 0;
        }
      }
      EXPECT_EQ(outside, 0U) << f->name << " slope " << slope;
      if (slope == 0.0 && bias == &additive) {  // else every score keeps a step or two (the terms')
        EXPECT_LT(ambiguous * 10, m * n * 4)
            << f->name << ": " << ambiguous_unbiased << " ambiguous without the bias";
      }
      EXPECT_LT(wrong_inside, m * n / 4) << f->name << " slope " << slope;
    }
  }
}

// A review's reproducer: an additive bias off bf16's grid with ALiBi, the kernel adding ALiBi's
// tensor first and then the bias cast to bf16, F(F(s + F(alibi)) + F(a)), rounds three times on the
// way; the emulation charged two (the kernel fell 0.156 from the centre, the ambiguity 0.141).
TEST(ScoreEmulation, ThreeRoundingsOfABiasAndALiBiAreCovered) {
  const std::size_t n = 272;
  Matrix q(1, 1), k(n, 1);
  q(0, 0) = 1;
  k(271, 0) = -0.6875;
  std::vector<double> bias(n, 0.0);
  bias[271] = 14.8425233;
  tensor::HeadScores scores;
  scores.queries = 1;
  scores.keys = scores.row_stride = n;
  scores.bias = bias;
  scores.alibi_slope = 0.0625;
  scores.scale = 1.0;
  const ScoreEmulator emulator(ScoreChain::product_then_scale, q, k, scores, bf16);
  const std::vector<std::size_t> visible = {271};
  EmulatedRow row;
  ASSERT_TRUE(emulator.row(0, visible, row));
  const float alibi = to(bf16, -0.0625F * 271.0F);
  const float kernel = to(bf16, to(bf16, -0.6875F + alibi) + to(bf16, static_cast<float>(bias[271])));
  EXPECT_LE(std::fabs(static_cast<double>(kernel) - row.z[0]), row.ambiguity[0])
      << "centre " << row.z[0] << " ambiguity " << row.ambiguity[0] << " kernel " << kernel;
}

// A row whose every key carries a padding bias of -1e4 (a padded query row of BERT-style masks):
// its maximum is near -1e4 itself, where bf16's step is 64, so the bias is added as any other
// (it was added exactly with no ambiguity, and the kernel's scores fell outside); in a row with an
// open key the same bias only hides its key.
TEST(ScoreEmulation, ARowWhoseEveryKeyIsPaddedIsStillCovered) {
  const Head h = random_head(2, 16, 64, bf16, 1.0, 5);
  std::vector<double> bias(2 * 16, -1e4);
  bias[16] = 0;  // row 1 keeps key 0 open
  tensor::HeadScores scores;
  scores.queries = 2;
  scores.keys = scores.row_stride = 16;
  scores.bias = bias;
  const ScoreEmulator emulator(ScoreChain::product_then_scale, h.q, h.k, scores, bf16);
  std::vector<std::size_t> visible(16);
  std::iota(visible.begin(), visible.end(), 0);
  EmulatedRow row;
  ASSERT_TRUE(emulator.row(0, visible, row));
  const double scale = 1 / std::sqrt(64.0);
  for (std::size_t j = 0; j < 16; ++j) {
    const float z = kernel_score(ScoreChain::product_then_scale, bf16, {&h.qf[0], 64}, {&h.kf[j * 64], 64},
                                 scale, Order(in_order), false);
    const float got = to(bf16, z + to(bf16, -1e4F));
    EXPECT_LE(std::fabs(static_cast<double>(got) - row.z[j]), row.ambiguity[j]) << "key " << j;
  }
  ASSERT_TRUE(emulator.row(1, visible, row));
  EXPECT_LT(row.ambiguity[1], 1.0) << "a hidden key beside an open one is added exactly";
}

}  // namespace
}  // namespace sharpcheck::metrics

namespace sharpcheck::metrics {
namespace {

// A soft-cap c tanh(s / c) as kernels apply it to a score (metrics/score_emulation.hpp's CapChain):
// Gemma 2's eager attention on F tensors (`s / c`, `torch.tanh`, `* c`, each rounded to F), the cap
// computed upcast in fp32 on the rounded score, or one fp32 epilogue on the unrounded product
// (torch.compile); c held in fp32 or in F, divided by or multiplied by fp32(1 / c).
struct CappingKernel {
  CapChain cap;
  bool cap_in_format;
  bool multiply_by_reciprocal;
};

float capped_score(float s, double c, const FloatFormat& f, const CappingKernel& kernel) {
  const float held = kernel.cap_in_format ? to(f, static_cast<float>(c)) : static_cast<float>(c);
  const auto over_cap = [&](float x) { return kernel.multiply_by_reciprocal ? x * (1.0F / held) : x / held; };
  if (kernel.cap == CapChain::each_step_in_format) return to(f, to(f, std::tanh(to(f, over_cap(s)))) * held);
  return to(f, held * std::tanh(over_cap(s)));
}

// Every score of every such kernel (four summation orders) lies within the emulation's ambiguity
// of its variant's centre, which stays under 40% of the scores for a cap on F's grid (fp16's finer
// grid leaves about a quarter within a tie of one of its roundings); a kernel that caps the unscaled
// product (c tanh(q.k / c) * scale), or with a cap of 5, no cap at all, falls outside. Caps of 50
// (Gemma 2), 30 (Grok), 5 and 20.3 (off bf16's grid), scores of sd 3 so that a small cap bends them.
TEST(ScoreEmulation, ASoftCapIsAppliedAsEveryKernelAppliesItAndAWrongOneFallsOutside) {
  for (const FloatFormat* f : {&bf16, &fp16}) {
    const std::size_t m = 12, n = 48, d = 80;
    const Head h = random_head(m, n, d, *f, 1.8, 21);
    const double scale = 1 / std::sqrt(static_cast<double>(d));
    std::vector<std::size_t> visible(n);
    std::iota(visible.begin(), visible.end(), 0);
    for (const double c : {50.0, 30.0, 5.0, 20.3}) {
      tensor::HeadScores scores;
      scores.queries = m;
      scores.keys = scores.row_stride = n;
      scores.softcap = c;
      for (const CapChain cap : {CapChain::each_step_in_format, CapChain::fp32_on_rounded, CapChain::fused}) {
        const ScoreEmulator emulator(ScoreChain::product_then_scale, h.q, h.k, scores, *f,
                                     FactorRounding::fp32, cap);
        std::size_t outside = 0, ambiguous = 0, wrong_inside = 0;
        EmulatedRow row;
        for (std::size_t i = 0; i < m; ++i) {
          ASSERT_TRUE(emulator.row(i, visible, row));
          for (std::size_t j = 0; j < n; ++j) {
            ambiguous += row.ambiguity[j] > 0 ? 1 : 0;
            const auto off = [&](float got) { return std::fabs(static_cast<double>(got) - row.z[j]); };
            std::vector<float> products(d);
            for (std::size_t t = 0; t < d; ++t) products[t] = h.qf[i * d + t] * h.kf[j * d + t];
            for (const Order& order :
                 {Order(in_order), Order(reversed), Order(eight_lanes), Order(pairwise)}) {
              const float product = to(*f, order(products));
              const float s = cap == CapChain::fused ? product * static_cast<float>(scale)
                                                     : to(*f, product * static_cast<float>(scale));
              for (const bool in_format : {false, true})
                for (const bool reciprocal : {false, true})
                  outside +=
                      off(capped_score(s, c, *f, {cap, in_format, reciprocal})) > row.ambiguity[j] ? 1 : 0;
            }
            const float product = to(*f, in_order(products));
            const float s = to(*f, product * static_cast<float>(scale));
            const float unscaled_cap =
                to(*f, static_cast<float>(c) * std::tanh(product / static_cast<float>(c)) *
                           static_cast<float>(scale));
            const float uncapped = s;
            wrong_inside += off(c == 5.0 ? uncapped : unscaled_cap) <= row.ambiguity[j] ? 1 : 0;
          }
        }
        const std::string what = std::string(f->name) + " cap " + std::to_string(c) + " chain " +
                                 std::to_string(static_cast<int>(cap));
        EXPECT_EQ(outside, 0U) << what;
        // A cap off F's grid is held as c or F(c) (kernels do not agree): most scores keep a step.
        if (c != 20.3) {
          EXPECT_LT(ambiguous * 10, m * n * 4) << what;
        }
        EXPECT_LT(wrong_inside * 5, m * n) << what;
      }
    }
  }
}

}  // namespace
}  // namespace sharpcheck::metrics
