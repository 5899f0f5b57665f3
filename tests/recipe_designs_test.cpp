// Every built-in kernel written to a recipe's design (kernels/attention_designs.hpp, and the
// backward's flash2_* and math_* rows) on every problem of the gate's sweep: an honest kernel fits
// its own recipe and the default judgement (which tries every recipe the formats allow and passes
// on the first that fits); a broken twin, wherever its own recipe fails it, fits no recipe the
// default tries either, so a judgement that names no recipe cannot pass a bug the declared one
// catches. Each twin must be caught somewhere (a twin no case catches is a case that cannot
// discriminate, benchdnn's MISTRUSTED).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "gate/attention_scenarios.hpp"
#include "inputs/attention_backward_cases.hpp"
#include "kernels/attention_layer.hpp"
#include "kernels/registry.hpp"
#include "metrics/judge_backward.hpp"
#include "metrics/judge_tensors.hpp"
#include "metrics/recipes.hpp"

namespace sharpcheck {
namespace {

// The one known wrong verdict of the default (docs/verdicts.md): on a decode problem (one query per
// head, 8 heads), P rounded to e4m3 fits math_bf16's variant with q and k prescaled by sqrt(scale)
// rounded to bf16 (the SDPA math path of torch <= 2.4 on the CPU), whose centre differs from the
// others by a 0.3% temperature: with eight rows, one of the twelve variants absorbs the twin's row
// scales (ratio 0.91; the other variants 1.85 to 2.2). Naming flash_bf16 catches it (4.45 at worst
// over the gate). Listed so that a new miss fails.
// Two more, seen since the head-scale tests (metrics/inside_rounding.hpp's HeadScale) made
// flash_bf16 catch a row sum kept in bf16 (no LSE) on small problems where it passed before:
// math_bf16 absorbs those rows' scale errors on two of them. On the ALiBi problem the emulated
// scores keep a step or two of ambiguity each (ALiBi's terms may be held in fp32 or bf16 and
// rounded on the way: ScoreEmulator::add_bias), charged as roundings; on the 16 x 48 head of 32
// dimensions, whose padding mask hides a third of the keys, the scores are emulated exactly, and
// why math_bf16 still absorbs the twin there is not established. Naming flash_bf16 catches both.
bool known_default_miss(std::string_view kernel, std::string_view scenario, std::string_view recipe) {
  if (kernel == "flash2_bf16_row_sum_bf16_no_lse" && recipe == "math_bf16")
    return scenario == "alibi_causal_64x96_d128" || scenario == "additive_mask_16x48_d32";
  return kernel == "flash2_bf16_p_e4m3_no_lse" && scenario == "kv_cache_decode_1x1024_d128_gqa_8_2" &&
         recipe == "math_bf16";
}

bool fits(const kernels::AttentionKernel& kernel, const metrics::AttentionRecipe& recipe,
          const gate::ScenarioInputs& in, const kernels::LayerOutputs& got) {
  const metrics::JudgeSpec spec{kernels::Operation::attention, kernel.output,
                                &metrics::forward_tolerance(recipe)};
  return metrics::judge_attention_tensors(spec, in.problem, in.q, in.k, in.v, got.out, got.lse).passed();
}

TEST(RecipeDesigns, ForwardKernelsFitTheirRecipeAndTheDefaultAndNoTwinFitsAny) {
  std::uint64_t seed = 2026;
  for (const auto& kernel : kernels::attention_kernels()) {
    if (kernel.recipe.empty()) continue;
    const metrics::AttentionRecipe& own = *metrics::find_recipe(kernel.recipe);
    std::size_t caught = 0;
    for (const auto& scenario : gate::attention_scenarios()) {
      const gate::ScenarioInputs in = gate::make_scenario(scenario, ++seed, *kernel.input);
      const kernels::LayerOutputs got = kernels::run_attention_layer(kernel, in.problem, in.q, in.k, in.v);
      const bool own_fits = fits(kernel, own, in, got);
      if (!kernel.deliberately_broken) {
        EXPECT_TRUE(own_fits) << kernel.name << " on " << scenario.name;
      } else if (own_fits) {
        continue;  // this problem cannot show the bug
      }
      caught += own_fits ? 0 : 1;
      bool any = false;
      std::string fitted;
      for (const auto* recipe :
           metrics::default_forward_recipes(*kernel.input, *kernel.output, !got.lse.empty(),
                                            /*proven_only=*/false)) {
        if (fits(kernel, *recipe, in, got)) {
          any = true;
          fitted = recipe->name;
          break;
        }
      }
      if (any && kernel.deliberately_broken && known_default_miss(kernel.name, scenario.name, fitted))
        continue;
      EXPECT_EQ(any, !kernel.deliberately_broken)
          << kernel.name << " on " << scenario.name << (any ? " fits " + fitted : " fits no default recipe");
    }
    if (kernel.deliberately_broken) {
      EXPECT_GT(caught, 0U) << kernel.name << ": no problem of the sweep catches it";
    }
  }
}

// How far a backward judgement is from passing: its largest ratio of any tier or test.
double closeness(const metrics::BackwardJudgement& j) {
  double worst = 0;
  for (const metrics::Comparison* c : {&j.d_queries, &j.d_keys, &j.d_values})
    worst = std::max({worst, c->max_bound_ratio, c->max_statistical_ratio, c->max_row_scale_ratio});
  return worst;
}

// The honest built-in kernel of a recipe's design in `format` (math_backward_bf16 for
// backward_math_bf16, ...), or null.
const kernels::AttentionBackwardKernel* honest_kernel_of(const metrics::AttentionRecipe& recipe,
                                                         const FloatFormat& format) {
  for (const auto& kernel : kernels::attention_backward_kernels())
    if (kernel.recipe == recipe.name && !kernel.deliberately_broken && kernel.format == &format)
      return &kernel;
  return nullptr;
}

// Every honest backward kernel fits its recipe on every problem of the sweep, and no twin fits a
// default recipe where its own recipe catches it, unless that recipe's own design errs about as
// much. The default accepts every design the dtypes allow: PyTorch's math path rounds P, dP and
// dS where a FlashAttention kernel rounds P and dS, so on some problems a FlashAttention kernel
// with a precision defect (dQ accumulated in bf16) errs no more than an honest math-path kernel,
// and no judgement of the outputs alone can tell them apart. The test measures it: a twin may fit
// the math path's recipe only on a problem where the honest math-path kernel, judged by the twin's
// own recipe, errs at least half as much as the twin (one sample of an honest kernel's largest
// deviation over a few thousand elements is about 4 sigma where the statistical tier allows
// lambda sigma, lambda about 6.5: a twin within twice it is within the design's noise). Everywhere
// else the twin fails every default recipe; the bug classes' twins (a stale D, a wrong scale)
// fail them everywhere their own recipe does.
TEST(RecipeDesigns, BackwardKernelsFitTheirRecipeAndNoTwinFitsADefaultRecipe) {
  std::size_t excused = 0, judged_twins = 0;
  for (const auto& kernel : kernels::attention_backward_kernels()) {
    if (kernel.recipe.empty()) continue;
    const metrics::AttentionRecipe& own = *metrics::find_recipe(kernel.recipe);
    std::size_t caught = 0;
    for (const inputs::BackwardKind kind : inputs::all_backward_kinds) {
      const inputs::BackwardInputs in = inputs::make_backward_inputs(kind, *kernel.format, 77);
      const kernels::BackwardProblem problem{in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores};
      const kernels::KernelGradients got = kernel.run(problem);
      const reference::AttentionBackwardInputs exact{in.queries, in.keys,  in.values,
                                                     in.d_out,   in.d_lse, in.scores};
      const reference::AttentionGradients expected = reference::attention_backward(exact, *kernel.format);
      const auto judged = [&](const metrics::AttentionRecipe& recipe,
                              const kernels::KernelGradients& gradients) {
        return metrics::judge_attention_backward(metrics::backward_tolerance(recipe), *kernel.format, problem,
                                                 gradients, &expected);
      };
      const metrics::BackwardJudgement by_own = judged(own, got);
      const std::string case_name(inputs::backward_kind_name(kind));
      if (!kernel.deliberately_broken) {
        EXPECT_TRUE(by_own.passed()) << kernel.name << " on " << case_name;
        continue;
      }
      if (by_own.passed()) continue;
      ++caught;
      ++judged_twins;
      for (const auto* recipe : metrics::default_recipes(*kernel.format, *kernel.format, true)) {
        if (!judged(*recipe, got).passed()) continue;
        const kernels::AttentionBackwardKernel* design = honest_kernel_of(*recipe, *kernel.format);
        const double design_off = design != nullptr ? closeness(judged(own, design->run(problem))) : 0.0;
        EXPECT_GE(2 * design_off, closeness(by_own))
            << kernel.name << " on " << case_name << " fits " << recipe->name << ", whose design errs less ("
            << design_off << " against " << closeness(by_own) << " under " << own.name << ")";
        ++excused;
      }
    }
    if (kernel.deliberately_broken) {
      EXPECT_GT(caught, 0U) << kernel.name << ": no problem of the sweep catches it";
    }
  }
  std::printf("%zu of %zu twin problems fit a default recipe whose design errs about as much\n", excused,
              judged_twins);
}

// The mutation check of the test above: a kernel that returns the exact answer scaled by 1 + 2^-6
// (a mis-normalised row, the bf16-denominator class) must fail the loosest forward recipe's
// judgement and the default's; were the designs' recipes so loose that it fitted, the test above
// would prove nothing about the twins.
TEST(RecipeDesigns, AScaledOutputFitsNoDefaultRecipe) {
  const auto& scenario = gate::attention_scenarios()[0];
  const gate::ScenarioInputs in = gate::make_scenario(scenario, 5, bf16);
  const kernels::AttentionKernel& kernel = *kernels::find_attention_kernel("math_bf16");
  kernels::LayerOutputs got = kernels::run_attention_layer(kernel, in.problem, in.q, in.k, in.v);
  for (double& x : got.out) x = round_to_format(x * (1 + 0x1p-6), bf16);
  ASSERT_TRUE(got.lse.empty());
  for (const auto* recipe : metrics::default_forward_recipes(bf16, bf16, false, false))
    EXPECT_FALSE(fits(kernel, *recipe, in, got)) << recipe->name;
}

// The math path's recipe judges around its emulated scores (metrics/score_emulation.hpp): the
// honest math_bf16 kernel fits math_bf16 on the plain problem and on one with a sink (the problems
// where, charged as noise, the scores' roundings let a denominator summed in bf16 pass), and the
// same outputs scaled by 1.25% do not. The mutation check: the same recipe with the emulation
// switched off (its scores' roundings charged as noise, as before) sees the scaled rows less sharply
// (it let them through before the head-scale tests pooled a head's rows; now those catch them too).
TEST(RecipeDesigns, TheMathRecipeSeesARowScaledByOnePercentWhereNoiseDidNot) {
  const kernels::AttentionKernel& kernel = *kernels::find_attention_kernel("math_bf16");
  const kernels::Tolerance& emulated = metrics::forward_tolerance(*metrics::find_recipe("math_bf16"));
  ASSERT_TRUE(emulated.scores_emulated);
  kernels::Tolerance noise = emulated;
  noise.scores_emulated = false;
  const auto judged_by = [&](const kernels::Tolerance& t, const gate::ScenarioInputs& in,
                             const kernels::LayerOutputs& got) {
    const metrics::JudgeSpec spec{kernels::Operation::attention, kernel.output, &t};
    return metrics::judge_attention_tensors(spec, in.problem, in.q, in.k, in.v, got.out, got.lse);
  };
  const auto passes = [&](const kernels::Tolerance& t, const gate::ScenarioInputs& in,
                          const kernels::LayerOutputs& got) { return judged_by(t, in, got).passed(); };
  std::size_t judged = 0;
  for (const auto& scenario : gate::attention_scenarios()) {
    if (scenario.name != "sinks_33x129_d256" && scenario.name != gate::attention_scenarios()[0].name)
      continue;
    const gate::ScenarioInputs in = gate::make_scenario(scenario, 11, bf16);
    kernels::LayerOutputs got = kernels::run_attention_layer(kernel, in.problem, in.q, in.k, in.v);
    EXPECT_TRUE(passes(emulated, in, got)) << scenario.name;
    for (double& x : got.out) x = round_to_format(x * 1.0125, bf16);
    const double sharp = judged_by(emulated, in, got).output.max_row_scale_ratio;
    const double blunt = judged_by(noise, in, got).output.max_row_scale_ratio;
    EXPECT_GT(sharp, 1) << scenario.name;
    EXPECT_GT(sharp, blunt) << scenario.name << ": the mutation check shows nothing";
    ++judged;
  }
  EXPECT_EQ(judged, 2U);
}

// The backward's gradient-scale test: one gradient of an honest FlashAttention-style kernel scaled
// by 1% (dQ scaled at batch >= 2 in the trial of docs/verdicts.md), every element still well inside
// its own allowance, must fit no default recipe on a head of 192 queries and keys with N(0, 1)
// entries (the trial's shape); the honest gradients fit. (Where a low-rank head's D, formed from O
// in bf16, moves the gradients by more than 1%, the test cannot see 1%: that is honest noise.)
inputs::BackwardInputs normal_head(std::size_t rows, std::size_t dim, const FloatFormat& format,
                                   bool causal = false) {
  DeterministicRandom random(192);
  const auto normal = [&](std::size_t r) {
    Matrix m(r, dim);
    for (double& x : m.values) x = round_to_format(random.normal(0, 1), format);
    return m;
  };
  tensor::HeadScores scores;
  scores.causal = causal;
  if (dim > 64) scores.scale = 0.125;  // logits of standard deviation sqrt(dim) / 8, 2 at d = 256
  return {normal(rows), normal(rows), normal(rows), normal(rows), {}, scores};
}

// A kernel's gradients on one normal head of `rows` positions (d = 64 unless given), and the
// exact ones.
struct JudgedHead {
  JudgedHead(const kernels::AttentionBackwardKernel& kernel, std::size_t rows, std::size_t dim = 64,
             bool causal = false)
      : format(*kernel.format),
        in(normal_head(rows, dim, format, causal)),
        problem{in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores},
        got(kernel.run(problem)),
        expected(reference::attention_backward(
            {in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores}, format)) {}
  [[nodiscard]] metrics::BackwardJudgement judged(const metrics::AttentionRecipe& recipe,
                                                  const kernels::KernelGradients& gradients) const {
    return metrics::judge_attention_backward(metrics::backward_tolerance(recipe), format, problem, gradients,
                                             &expected);
  }
  // `got` with one gradient scaled by `factor` (rounded back to the format).
  [[nodiscard]] kernels::KernelGradients scaled(Matrix kernels::KernelGradients::*gradient,
                                                double factor) const {
    kernels::KernelGradients out = got;
    for (double& x : (out.*gradient).values) x = round_to_format(x * factor, format);
    return out;
  }
  const FloatFormat& format;
  const inputs::BackwardInputs in;
  const kernels::BackwardProblem problem;
  const kernels::KernelGradients got;
  const reference::AttentionGradients expected;
};

constexpr Matrix kernels::KernelGradients::*every_gradient[] = {&kernels::KernelGradients::d_queries,
                                                                &kernels::KernelGradients::d_keys,
                                                                &kernels::KernelGradients::d_values};

TEST(RecipeDesigns, AGradientScaledByOnePercentFitsNoDefaultRecipe) {
  for (const char* name : {"flash2_backward_bf16", "flash2_backward_fp16"}) {
    const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
    const JudgedHead head(kernel, 192);
    EXPECT_TRUE(head.judged(*metrics::find_recipe(kernel.recipe), head.got).passed()) << name;
    for (const auto gradient : every_gradient) {
      const kernels::KernelGradients scaled = head.scaled(gradient, 1.01);
      for (const auto* recipe : metrics::default_recipes(*kernel.format, *kernel.format, true))
        EXPECT_FALSE(head.judged(*recipe, scaled).passed())
            << name << ": a gradient scaled by 1.01 fits " << recipe->name;
    }
  }
}

// PyTorch's math path rounds the scores, so its recipe charges their roundings; charged in full in
// the gradient-scale test, their worst case let dQ or dK scaled by 0.5 pass backward_math_bf16 at
// 257 keys (issue 30's trial). By Hoeffding on exact coefficients, a 10% scale of any gradient
// fails while the honest kernel still fits.
TEST(RecipeDesigns, AGradientScaledByTenPercentFitsNotTheMathPathsRecipe) {
  for (const char* name : {"math_backward_bf16", "math_backward_fp16"}) {
    const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
    const metrics::AttentionRecipe& recipe = *metrics::find_recipe(kernel.recipe);
    const JudgedHead head(kernel, 257);
    EXPECT_TRUE(head.judged(recipe, head.got).passed()) << name;
    for (const auto gradient : every_gradient)
      EXPECT_FALSE(head.judged(recipe, head.scaled(gradient, 0.9)).passed())
          << name << ": a gradient scaled by 0.9 fits " << recipe.name;
  }
}

// The projected tests once charged each fp32 dot product (a score's d products, dP's) by its worst
// case, d u sum |q k|: at d = 256 that was twice the bf16 roundings' charge, and dQ scaled by 0.95
// passed backward_math_bf16 on a causal head of 200 (the trial's reproducer, ratio 0.86). Charged
// by their roundings' Hoeffding root (sqrt(2d) in place of d; none for the math path's emulated
// scores), a 5% scale of any gradient fits neither design's recipe at d = 256, and the honest
// kernels still fit theirs.
TEST(RecipeDesigns, AFivePercentScaleFitsNoBackwardRecipeAtAWideHead) {
  for (const char* name : {"math_backward_bf16", "flash2_backward_bf16"}) {
    const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
    const metrics::AttentionRecipe& recipe = *metrics::find_recipe(kernel.recipe);
    const JudgedHead head(kernel, 200, 256, true);
    const metrics::BackwardJudgement honest = head.judged(recipe, head.got);
    EXPECT_TRUE(honest.passed()) << name << ": " << honest.describe_worst();
    for (const auto gradient : every_gradient) {
      const metrics::BackwardJudgement scaled = head.judged(recipe, head.scaled(gradient, 0.95));
      EXPECT_FALSE(scaled.passed()) << name << ": a gradient scaled by 0.95 fits " << recipe.name;
    }
  }
}

// The math path's recipe charges three roundings per pair, enough that a D computed from half of
// dO fitted every element at 257 keys (metrics/recipes.cpp). The D-direction test projects each
// row of dQ on the direction a D error moves it (sum_j P_ij dz/dr k_j): the stale-D twin fails
// backward_math_bf16 by that test, and the honest kernel of either design still fits it.
TEST(RecipeDesigns, AStaleDFitsNotTheMathPathsRecipeByItsDirection) {
  const metrics::AttentionRecipe& math = *metrics::find_recipe("backward_math_bf16");
  for (const char* name : {"flash2_backward_bf16", "math_backward_bf16", "flash2_backward_bf16_stale_d"}) {
    const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
    const JudgedHead head(kernel, 257);
    const metrics::BackwardJudgement judgement = head.judged(math, head.got);
    EXPECT_EQ(judgement.passed(), !kernel.deliberately_broken) << name;
    if (!kernel.deliberately_broken) continue;
    const auto& findings = judgement.d_queries.statistical_violations;
    EXPECT_TRUE(
        std::any_of(findings.begin(), findings.end(),
                    [](const std::string& f) { return f.find("along D's direction") != std::string::npos; }))
        << name << ": " << judgement.describe_worst();
  }
}

// The math path's backward recipe judges its statistical tier around the gradients of the emulated
// scores (metrics/judge_backward.cpp): the honest math_bf16 kernel fits it, and the same kernel
// with dQ or dK scaled by 1% does not. The mutation check: the same recipe with the emulation
// switched off (the scores' roundings charged as noise, as before) lets both through.
TEST(RecipeDesigns, TheMathRecipesBackwardSeesWhatItsNoiseHid) {
  const kernels::AttentionBackwardKernel& kernel =
      *kernels::find_attention_backward_kernel("math_backward_bf16");
  const kernels::BackwardTolerance& emulated =
      metrics::backward_tolerance(*metrics::find_recipe(kernel.recipe));
  ASSERT_TRUE(emulated.scores_emulated);
  kernels::BackwardTolerance noise = emulated;
  noise.scores_emulated = false;
  const JudgedHead head(kernel, 257);
  const auto judged = [&](const kernels::BackwardTolerance& t, const kernels::KernelGradients& g) {
    return metrics::judge_attention_backward(t, head.format, head.problem, g, &head.expected);
  };
  const metrics::BackwardJudgement honest = judged(emulated, head.got);
  EXPECT_TRUE(honest.passed()) << honest.describe_worst();
  EXPECT_FALSE(honest.score_chain.empty());
  for (const auto gradient : {&kernels::KernelGradients::d_queries, &kernels::KernelGradients::d_keys}) {
    const kernels::KernelGradients scaled = head.scaled(gradient, 0.99);
    EXPECT_FALSE(judged(emulated, scaled).passed());
    EXPECT_TRUE(judged(noise, scaled).passed()) << "the mutation check shows nothing";
  }
}

// A mask stored with a row stride wider than the keys (a padded key range, as the gate slices a
// batch with key lengths) is the same mask: the math path's honest kernel fits its recipe either
// way. The emulated problem once read the head's mask with its own stride and centred the
// gradients on the wrong keys (ratios 40 to 104).
TEST(RecipeDesigns, TheMathRecipesBackwardReadsAMaskWithItsOwnStride) {
  DeterministicRandom random(7);
  const std::size_t m = 64, n = 48, d = 64, stride = 80;
  const auto draw = [&](std::size_t rows, double sigma) {
    Matrix x(rows, d);
    for (double& value : x.values) value = round_to_format(random.normal(0, sigma), bf16);
    return x;
  };
  const Matrix q = draw(m, 1.5), k = draw(n, 1.5), v = draw(n, 1), d_out = draw(m, 1);
  std::vector<std::uint8_t> compact(m * n), padded(m * stride, 0);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j)
      compact[i * n + j] = padded[i * stride + j] = random.uniform() < 0.6 || j == 0;
  }
  tensor::HeadScores narrow, wide;
  narrow.keep = compact;
  narrow.row_stride = n;
  wide.keep = padded;
  wide.row_stride = stride;
  const kernels::BackwardProblem by_narrow(q, k, v, d_out, {}, narrow), by_wide(q, k, v, d_out, {}, wide);
  const kernels::KernelGradients got = kernels::attention_backward_math_lowp(by_narrow, bf16);
  const kernels::BackwardTolerance& math =
      metrics::backward_tolerance(*metrics::find_recipe("backward_math_bf16"));
  for (const kernels::BackwardProblem* problem : {&by_narrow, &by_wide}) {
    const metrics::BackwardJudgement judged = metrics::judge_attention_backward(math, bf16, *problem, got);
    EXPECT_TRUE(judged.passed()) << judged.describe_worst();
    EXPECT_FALSE(judged.score_chain.empty());
  }
}

// Heads with an additive bias in bf16, and with ALiBi on top (causal, bottom-right): the math
// path's scores are emulated with the bias added as the kernel adds it (ScoreEmulator::add_bias),
// and the emulated problem must not add ALiBi a second time. The honest math-path kernel fits
// backward_math_bf16 around the emulated scores; dQ or dK scaled by 0.98 does not where the bias
// is bf16's own values, nor by 0.9 with ALiBi on top (terms a kernel may hold in fp32 or in bf16,
// and round on the way, leave each score a step or two of ambiguity, charged as roundings).
TEST(RecipeDesigns, TheMathRecipesBackwardEmulatesABiasAndALiBi) {
  DeterministicRandom random(9);
  const std::size_t m = 96, n = 128, d = 64;
  const auto draw = [&](std::size_t rows, double sigma) {
    Matrix x(rows, d);
    for (double& value : x.values) value = round_to_format(random.normal(0, sigma), bf16);
    return x;
  };
  const Matrix q = draw(m, 1), k = draw(n, 1), v = draw(n, 1), d_out = draw(m, 1);
  std::vector<double> bias(m * n);
  for (double& b : bias) b = round_to_format(random.normal(0, 1), bf16);
  const kernels::BackwardTolerance& math =
      metrics::backward_tolerance(*metrics::find_recipe("backward_math_bf16"));
  for (const double slope : {0.0, 0.0625}) {
    tensor::HeadScores scores;
    scores.causal = true;
    scores.alignment = tensor::DiagonalAlignment::bottom_right;
    scores.alibi_slope = slope;
    scores.bias = bias;
    scores.row_stride = n;
    const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
    const kernels::KernelGradients got = kernels::attention_backward_math_lowp(problem, bf16);
    const metrics::BackwardJudgement honest = metrics::judge_attention_backward(math, bf16, problem, got);
    EXPECT_TRUE(honest.passed()) << "slope " << slope << ": " << honest.describe_worst();
    EXPECT_FALSE(honest.score_chain.empty()) << "slope " << slope << ": the scores were not emulated";
    for (const auto gradient : {&kernels::KernelGradients::d_queries, &kernels::KernelGradients::d_keys}) {
      kernels::KernelGradients scaled = got;
      for (double& x : (scaled.*gradient).values) x = round_to_format(x * (slope == 0.0 ? 0.98 : 0.9), bf16);
      EXPECT_FALSE(metrics::judge_attention_backward(math, bf16, problem, scaled).passed())
          << "slope " << slope;
    }
  }
}

// rows x d values drawn normal with deviation sigma, rounded to bf16.
Matrix bf16_normal(DeterministicRandom& random, std::size_t rows, std::size_t d, double sigma) {
  Matrix x(rows, d);
  for (double& value : x.values) value = round_to_format(random.normal(0, sigma), bf16);
  return x;
}

// D's honest error under the fp32 recipe (`attention_backward_flash`: bf16 in and out, fp32 inside)
// is O's rounding to bf16: by Hoeffding over O's elements, as the bf16 recipes charge it; charged
// by its worst case, sum_c |dO_ic O_ic|, a D 10% off passed that recipe, and so the default, on a
// 200 x 200 head of d = 256 with inputs at 3 sigma (the trial's reproducer, ratio 0.97). The twin
// here is the exact gradients with D x 0.93 applied: dS_ij gains 0.07 P_ij D_i, so dQ_i gains
// 0.07 D_i s sum_j P_ij k_j and dK_j gains 0.07 s sum_i P_ij D_i q_i. It fails by D's direction
// at 1.15 (the honest kernel: 0.008); with the worst-case charge it passed at 0.78 (seen).
TEST(RecipeDesigns, ADSevenPercentOffFitsNotTheFp32RecipeAtAWideSharpHead) {
  DeterministicRandom random(600);
  const std::size_t n = 200, d = 256;
  const double scale = 0.125;
  const Matrix q = bf16_normal(random, n, d, 3), k = bf16_normal(random, n, d, 3);
  const Matrix v = bf16_normal(random, n, d, 1), d_out = bf16_normal(random, n, d, 1);
  tensor::HeadScores scores;
  scores.scale = scale;
  const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
  const kernels::AttentionBackwardKernel& kernel =
      *kernels::find_attention_backward_kernel("flash2_backward_bf16");
  const kernels::KernelGradients got = kernel.run(problem);
  const reference::AttentionGradients exact = reference::attention_backward(problem, bf16);
  kernels::KernelGradients twin = got;
  Matrix dq(n, d), dk(n, d);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> z(n);
    double top = -INFINITY, sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t t = 0; t < d; ++t) z[j] += q(i, t) * k(j, t) * scale;
      top = std::max(top, z[j]);
    }
    for (double& x : z) sum += (x = std::exp(x - top));
    for (std::size_t j = 0; j < n; ++j) {
      const double shift = 0.07 * z[j] / sum * exact.d_rows[i] * scale;  // 0.07 P_ij D_i s
      for (std::size_t t = 0; t < d; ++t) dq(i, t) += shift * k(j, t), dk(j, t) += shift * q(i, t);
    }
  }
  for (std::size_t e = 0; e < dq.values.size(); ++e) {
    twin.d_queries.values[e] = round_to_format(exact.d_queries.values[e] + dq.values[e], bf16);
    twin.d_keys.values[e] = round_to_format(exact.d_keys.values[e] + dk.values[e], bf16);
  }
  const kernels::BackwardTolerance& fp32_recipe =
      metrics::backward_tolerance(*metrics::find_recipe("attention_backward_flash"));
  const auto honest = metrics::judge_attention_backward(fp32_recipe, bf16, problem, got, &exact);
  EXPECT_TRUE(honest.passed()) << honest.describe_worst();
  const auto judged = metrics::judge_attention_backward(fp32_recipe, bf16, problem, twin, &exact);
  EXPECT_FALSE(judged.passed()) << "D x 0.93 fits the fp32 recipe: " << judged.describe_worst();
}

// A sharp head whose first query sees one key (a causal head's first row, a decode's first token):
// P = 1 there, so dS = P (dP - D) is exactly 0, and a D 10% off puts 0.1 D s k into dQ where the
// exact value is 0. The D-direction test charged every pair's fp32 error (the logits' dot product,
// large at |q k| of 8 sigma) relative to P (|dP| + A) and D's error from the forward's scores
// relative to A: at 1 x 1, d = 64, 8 sigma, the twin passed the fp32 recipe and flash_bf16 at 0.32
// (seen). Split by what each error scales (P's errors scale dS, which cancels; the forward's score
// errors move a D formed from O by sum_j P_ij |dP_ij - D_i|, 0 here), it fails both; the honest
// kernel passes both, on this head and on a causal 24 x 24 one.
TEST(RecipeDesigns, ADTenPercentOffFitsNoFlashRecipeWhereOneKeyMakesDSZero) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{24}}) {
    DeterministicRandom random(700 + n);
    const std::size_t d = 64;
    const double scale = 0.1;
    const Matrix q = bf16_normal(random, n, d, 8), k = bf16_normal(random, n, d, 8);
    const Matrix v = bf16_normal(random, n, d, 1), d_out = bf16_normal(random, n, d, 1);
    tensor::HeadScores scores;
    scores.scale = scale;
    scores.causal = n > 1;
    const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
    const kernels::KernelGradients got =
        kernels::find_attention_backward_kernel("attention_backward_flash")->run(problem);
    const reference::AttentionGradients exact = reference::attention_backward(problem, bf16);
    kernels::KernelGradients twin = got;  // row 0 (one key) with D x 0.9: dQ_0 = 0.1 D_0 s k_0
    for (std::size_t t = 0; t < d; ++t) {
      const double shift = 0.1 * exact.d_rows[0] * scale;
      twin.d_queries(0, t) = round_to_format(exact.d_queries(0, t) + shift * k(0, t), bf16);
      twin.d_keys(0, t) = round_to_format(exact.d_keys(0, t) + shift * q(0, t), bf16);
    }
    for (const char* name : {"attention_backward_flash", "backward_flash_bf16"}) {
      const kernels::BackwardTolerance& recipe = metrics::backward_tolerance(*metrics::find_recipe(name));
      const auto honest = metrics::judge_attention_backward(recipe, bf16, problem, got, &exact);
      EXPECT_TRUE(honest.passed()) << name << " n=" << n << ": " << honest.describe_worst();
      const auto judged = metrics::judge_attention_backward(recipe, bf16, problem, twin, &exact);
      EXPECT_FALSE(judged.passed()) << name << " n=" << n << ": D x 0.9 fits: " << judged.describe_worst();
    }
  }
}

// A soft-capped head whose scores saturate the cap (q and k at 8 sigma, cap 2): tanh rounds to 1 in
// fp32, so the kernel's slope 1 - t^2 is 0 where the exact one is about 1e-12, an absolute error no
// charge relative to the slope covers (a review's reproducer: the honest fp32 and bf16 flash
// backwards failed both flash recipes at 31.5; at 6 sigma, cap 1, at 45.7). With the slope's
// absolute error charged (Magnitudes::dq_slope) both pass, and the twin that leaves 1 - t^2 out
// still fails.
TEST(RecipeDesigns, ASaturatedSoftCapsSlopeErrsAbsolutelyAndTheMissingSlopeStillFails) {
  DeterministicRandom random(5);
  const std::size_t n = 16, d = 64;
  const Matrix q = bf16_normal(random, n, d, 8), k = bf16_normal(random, n, d, 8);
  const Matrix v = bf16_normal(random, n, d, 1), d_out = bf16_normal(random, n, d, 1);
  tensor::HeadScores scores;
  scores.softcap = 2;
  const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
  const reference::AttentionGradients exact = reference::attention_backward(problem, bf16);
  for (const char* recipe_name : {"attention_backward_flash", "backward_flash_bf16"}) {
    const kernels::BackwardTolerance& recipe =
        metrics::backward_tolerance(*metrics::find_recipe(recipe_name));
    for (const char* name : {"attention_backward_flash", "attention_backward_flash_bf16",
                             "attention_backward_flash_bf16_no_softcap_grad"}) {
      const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
      const auto judged =
          metrics::judge_attention_backward(recipe, bf16, problem, kernel.run(problem), &exact);
      EXPECT_EQ(judged.passed(), !kernel.deliberately_broken)
          << name << " under " << recipe_name << ": " << judged.describe_worst();
    }
  }
}

// The exact gradients of a one-query head with D_0 replaced by `d_used`: dS_j gains
// P_j (D_0 - d_used), so dQ gains (D_0 - d_used) s sum_j P_j k_j and dK_j gains (D_0 - d_used) s P_j q,
// each rounded to bf16 as a kernel's would be.
kernels::KernelGradients with_d(const kernels::BackwardProblem& problem,
                                const reference::AttentionGradients& exact, double scale, double d_used) {
  const Matrix &q = problem.queries, &k = problem.keys;
  const std::size_t n = k.rows, d = q.cols;
  std::vector<double> z(n), p(n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t t = 0; t < d; ++t) z[j] += scale * q(0, t) * k(j, t);
  const double largest = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (std::size_t j = 0; j < n; ++j) sum += p[j] = std::exp(z[j] - largest);
  const double shift = (exact.d_rows[0] - d_used) * scale;
  kernels::KernelGradients twin;
  twin.d_queries = exact.d_queries;
  twin.d_keys = exact.d_keys;
  twin.d_values = exact.d_values;
  for (std::size_t t = 0; t < d; ++t) {
    double along = 0;
    for (std::size_t j = 0; j < n; ++j) along += p[j] / sum * k(j, t);
    twin.d_queries(0, t) = round_to_format(exact.d_queries(0, t) + shift * along, bf16);
    for (std::size_t j = 0; j < n; ++j)
      twin.d_keys(j, t) = round_to_format(exact.d_keys(j, t) + shift * p[j] / sum * q(0, t), bf16);
  }
  for (double& x : twin.d_values.values) x = round_to_format(x, bf16);
  return twin;
}

// Charges the math path's backward recipe made that let a D off by 10% pass it (reproducers from
// a trial with torch 1.13 on the CPU):
// - An emulated score whose rounding is ambiguous (its fp32 dot product's worst case straddles a
//   bf16 midpoint: about 4% of scores at 3 sigma, d = 64) was charged as noise by Hoeffding's root
//   times lambda = 8, about eight times what the one ambiguous score can move a gradient in the
//   worst case, and its second order at the row's largest slack for every key; on a head of one
//   query and seven keys whose dominant key was the ambiguous one, that variant absorbed a D x 0.9
//   twin (ratio 0.02) that every other variant failed at 2. Both are now the smaller of that and
//   the perturbation's worst case key by key (metrics/backward_score_terms.cpp).
// - Around the emulated scores, the fp32 entry still charged the scores' dot products' worst case,
//   which the emulation's slack covers (a sharp head's rest of the allowance fell tenfold).
// - O's rounding was charged to D, as FlashAttention forms D from O; autograd's D is sum_j P_j dP_j
//   from the saved P (DSource::probabilities), and on one key, where dS is exactly 0, that charge
//   was a few times |D|: a D from half of dO passed at 0.17.
// The honest math-path kernel passes every head, and no twin fits but four listed below; with the
// first order, the second order or D's charge as before, 6, 6 and 9 twins fit.
// Known misses (seven keys): 4 of 24 twins still fit, each through a variant whose slack is a step
// of a score: use_exact_spreads charges the exact coefficients' change under the slack as (growth - 1)
// times the bounds' spread, growth from the row's largest slack and the spread without the
// cancellation of a sharp head's dS (one head's dQ was 1e-5 of its magnitude, the twin's error
// 5000 times the honest kernel's). A per-key bound of that change is the next step.
TEST(RecipeDesigns, TheMathRecipesBackwardChargesAmbiguousScoresAndDAsItsDesignDoes) {
  const std::uint64_t known_misses[] = {4, 6, 17, 18};
  const kernels::BackwardTolerance& recipe =
      metrics::backward_tolerance(*metrics::find_recipe("backward_math_bf16"));
  const kernels::AttentionBackwardKernel& math =
      *kernels::find_attention_backward_kernel("math_backward_bf16");
  const double scale = 0.125;
  for (const std::size_t keys : {std::size_t{1}, std::size_t{7}}) {
    for (std::uint64_t seed = 0; seed < 24; ++seed) {
      DeterministicRandom random(9100 + seed + 100 * keys);
      const std::size_t d = keys == 1 ? 16 : 64;
      const double sigma = seed % 2 == 0 ? 3.0 : 1.0;
      const Matrix q = bf16_normal(random, 1, d, sigma), k = bf16_normal(random, keys, d, sigma);
      const Matrix v = bf16_normal(random, keys, d, 1), d_out = bf16_normal(random, 1, d, 1);
      tensor::HeadScores scores;
      scores.scale = scale;
      const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
      const reference::AttentionGradients exact = reference::attention_backward(problem, bf16);
      const auto honest = metrics::judge_attention_backward(recipe, bf16, problem, math.run(problem), &exact);
      EXPECT_TRUE(honest.passed()) << keys << " keys, seed " << seed << ": " << honest.describe_worst();
      double half = 0;  // one key: O = v, and D from the first half of dO
      for (std::size_t t = 0; t < d / 2; ++t) half += d_out(0, t) * v(0, t);
      const double d_used = keys == 1 ? half : 0.9 * exact.d_rows[0];
      if (std::fabs(exact.d_rows[0] - d_used) < 0.05 * std::fabs(exact.d_rows[0])) continue;
      const auto twin = metrics::judge_attention_backward(recipe, bf16, problem,
                                                          with_d(problem, exact, scale, d_used), &exact);
      if (keys == 7 &&
          std::find(std::begin(known_misses), std::end(known_misses), seed) != std::end(known_misses))
        continue;
      EXPECT_FALSE(twin.passed()) << keys << " keys, seed " << seed
                                  << ": a wrong D fits: " << twin.describe_worst();
    }
  }
}

// Repeated tokens (a trial's reproducer: 64 identical query rows, keys of two tokens, bf16): the
// pairs of a repeated row and key carry identical values through every step, so P's rounding is one
// error per token pair, shared by every copy, and it scales dV coherently (0.19%, one bf16 rounding
// of P). The gradient-scale test charged those roundings as independent (allowed 0.13%) and failed
// the honest FlashAttention-style and math-path backwards; it now weighs each pair by its copies
// (PairBlock::copies), which fails them again if left out. A dV scaled by 1% still fails: with two
// independent roundings lambda times their root is several u, and the roundings' worst case, sum
// of |projection| u, is charged in its place where smaller (project_errors).
// The tokens of the draw (of 64 seeds) whose two weights P round farthest in bf16, relative: there
// the shared roundings are largest (at least 0.6 u, checked), so the case discriminates.
struct Tokens {
  Matrix q, d_out, k, v;
};
Tokens repeated_tokens(std::size_t d, double scale) {
  Tokens best;
  double best_error = -1;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    DeterministicRandom random(3100 + seed);
    Tokens t{bf16_normal(random, 1, d, 1), bf16_normal(random, 1, d, 1), bf16_normal(random, 2, d, 1),
             bf16_normal(random, 2, d, 1)};
    double s[2] = {0, 0};
    for (std::size_t x = 0; x < 2; ++x)
      for (std::size_t c = 0; c < d; ++c) s[x] += scale * t.q(0, c) * t.k(x, c);
    const double sum = 39 * std::exp(s[0]) + 38 * std::exp(s[1]);  // 77 keys: tokens 0 and 1 alternate
    double error = 1;
    for (const double score : s) {
      const double p = std::exp(score) / sum;
      error = std::min(error, std::fabs(round_to_format(p, bf16) - p) / p / bf16.unit_roundoff());
    }
    if (error > best_error) best_error = error, best = t;
  }
  EXPECT_GT(best_error, 0.6) << "no draw rounds P far enough to discriminate";
  return best;
}

TEST(RecipeDesigns, RepeatedTokensRoundAlikeAndAScaledDVStillFails) {
  const std::size_t queries = 64, keys = 77, d = 64;
  const Tokens tokens = repeated_tokens(d, 0.125);
  Matrix q(queries, d), d_out(queries, d), k(keys, d), v(keys, d);
  for (std::size_t i = 0; i < queries; ++i)
    for (std::size_t t = 0; t < d; ++t) q(i, t) = tokens.q(0, t), d_out(i, t) = tokens.d_out(0, t);
  for (std::size_t j = 0; j < keys; ++j)
    for (std::size_t t = 0; t < d; ++t) k(j, t) = tokens.k(j % 2, t), v(j, t) = tokens.v(j % 2, t);
  tensor::HeadScores scores;
  scores.scale = 0.125;
  const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
  const reference::AttentionGradients exact = reference::attention_backward(problem, bf16);
  for (const char* name : {"flash2_backward_bf16", "math_backward_bf16"}) {
    const kernels::AttentionBackwardKernel& kernel = *kernels::find_attention_backward_kernel(name);
    const kernels::BackwardTolerance& recipe = metrics::backward_tolerance_of(kernel);
    kernels::KernelGradients got = kernel.run(problem);
    const auto honest = metrics::judge_attention_backward(recipe, bf16, problem, got, &exact);
    EXPECT_TRUE(honest.passed()) << name << ": " << honest.describe_worst();
    for (double& x : got.d_values.values) x = round_to_format(x * 1.01, bf16);
    const auto twin = metrics::judge_attention_backward(recipe, bf16, problem, got, &exact);
    EXPECT_FALSE(twin.passed()) << name << " with dV x 1.01: " << twin.describe_worst();
  }
}

// A soft-capped head on the math path (scores F(F(tanh(F(s / c))) * c), autograd back through each
// step: dS times c, times the slope 1 - t^2 at the t the kernel holds, over c, each rounded). The
// backward used to fall back to charging the scores' roundings as noise (at c = 30 up to 2^-8 * 30
// per logit), and a trial's gradients scaled by 5% passed under every cap; the centre now carries
// the kernel's own capped scores and slopes (metrics/backward_emulation.cpp's apply_cap_slopes).
// The honest math-path kernel passes in bf16 and fp16 at every cap (statistical ratios 0.06 to
// 0.15); gradients 2% off (10% on a sharper bf16 head: see below), and a D 10% off, fail at each.
kernels::KernelGradients scaled_twin(const kernels::KernelGradients& honest, const FloatFormat& format,
                                     double dq_factor, double dk_factor) {
  kernels::KernelGradients twin = honest;
  for (double& x : twin.d_queries.values) x = round_to_format(x * dq_factor, format);
  for (double& x : twin.d_keys.values) x = round_to_format(x * dk_factor, format);
  return twin;
}

// The exact gradients with every row's D times `factor`: dS_ij gains (1 - factor) D_i P_ij, which
// the cap's exact slope and the scale carry to dQ and dK; rounded to the format.
kernels::KernelGradients with_d_scaled(const kernels::BackwardProblem& p,
                                       const reference::AttentionGradients& exact, const FloatFormat& format,
                                       double factor) {
  const tensor::HeadScores head = p.head(0);
  const Matrix &q = p.queries, &k = p.keys;
  const double scale = *head.scale, cap = head.softcap;
  kernels::KernelGradients twin{exact.d_queries, exact.d_keys, exact.d_values, {}, {}};
  for (std::size_t i = 0; i < q.rows; ++i) {
    std::vector<double> z(k.rows), slope(k.rows, 1.0);
    for (std::size_t j = 0; j < k.rows; ++j) {
      for (std::size_t t = 0; t < q.cols; ++t) z[j] += scale * q(i, t) * k(j, t);
      const double u = std::tanh(z[j] / cap);
      z[j] = cap * u, slope[j] = 1 - u * u;
    }
    const double largest = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double& x : z) sum += x = std::exp(x - largest);
    for (std::size_t j = 0; j < k.rows; ++j) {
      const double moved = (1 - factor) * exact.d_rows[i] * z[j] / sum * slope[j] * scale;
      for (std::size_t t = 0; t < q.cols; ++t) {
        twin.d_queries(i, t) += moved * k(j, t);
        twin.d_keys(j, t) += moved * q(i, t);
      }
    }
  }
  for (Matrix* m : {&twin.d_queries, &twin.d_keys, &twin.d_values})
    for (double& x : m->values) x = round_to_format(x, format);
  return twin;
}

TEST(RecipeDesigns, TheMathRecipesBackwardFollowsASoftCapAsAutogradRoundsIt) {
  for (const bool half : {false, true}) {
    const FloatFormat& format = half ? fp16 : bf16;
    const kernels::BackwardTolerance& recipe = metrics::backward_tolerance(
        *metrics::find_recipe(half ? "backward_math_fp16" : "backward_math_bf16"));
    const kernels::AttentionBackwardKernel& math =
        *kernels::find_attention_backward_kernel(half ? "math_backward_fp16" : "math_backward_bf16");
    for (const double cap : {1.5, 5.0, 30.0}) {
      for (std::uint64_t seed = 0; seed < (cap == 30.0 ? 3U : 2U); ++seed) {
        DeterministicRandom random(7300 + seed + static_cast<std::uint64_t>(cap * 10));
        const double sigma = cap == 30.0 && seed == 2 ? 2.0 : 1.0;
        const Matrix q = bf16_normal(random, 48, 64, sigma), k = bf16_normal(random, 48, 64, sigma);
        const Matrix v = bf16_normal(random, 48, 64, 1), d_out = bf16_normal(random, 48, 64, 1);
        tensor::HeadScores scores;
        scores.scale = 0.125;
        scores.softcap = cap;
        const kernels::BackwardProblem problem(q, k, v, d_out, {}, scores);
        const reference::AttentionGradients exact = reference::attention_backward(problem, format);
        const kernels::KernelGradients honest = math.run(problem);
        const auto judge = [&](const kernels::KernelGradients& got) {
          return metrics::judge_attention_backward(recipe, format, problem, got, &exact);
        };
        const std::string where = std::string(format.name) + ", cap " + std::to_string(cap) + ", seed " +
                                  std::to_string(seed) + ": ";
        const auto fair = judge(honest);
        EXPECT_TRUE(fair.passed()) << where << fair.describe_worst();
        // Known limit: on the sharper bf16 head (sigma 2, scores of about 4), dQ cancels to a small
        // part of what its roundings move (dS rounded four times, and the emulation's ambiguous
        // scores a step of 2^-5 each), and gradients 5% off pass at about 0.65 of the gradient-scale
        // test (the honest kernel 0.03); FlashAttention's 3x rule passes 5% there too. 10% fails.
        const double off = sigma == 2.0 && !half ? 1.1 : 1.02;
        EXPECT_FALSE(judge(scaled_twin(honest, format, off, 1)).passed())
            << where << "dQ x " << off << " fits";
        EXPECT_FALSE(judge(scaled_twin(honest, format, 1, off)).passed())
            << where << "dK x " << off << " fits";
        EXPECT_FALSE(judge(with_d_scaled(problem, exact, format, 0.9)).passed()) << where << "D x 0.9 fits";
      }
    }
  }
}

}  // namespace
}  // namespace sharpcheck
