// The math path's scores, emulated: what PyTorch's math path on bf16/fp16 tensors gives each
// score, bit for bit, so that a math-path recipe's statistical tier is centred on the attention of
// those very scores instead of charging their roundings as noise (metrics/recipes.cpp). Charged as
// noise, the scores' two roundings (about 2 u |s| each) allowed as much as a softmax denominator
// summed in bf16 or a P rounded to e4m3 does to an output (docs/verdicts.md, the audit); emulated,
// only what an honest kernel may really do differently is left: where its fp32 accumulation order
// could round a score the other way (a tie within the accumulation's error), the score is marked
// with how far it may move, and that is charged as the statistical tier charges a rounding (its
// first order by Hoeffding, its second order in full).
//
// Contract: for every chain below and every honest kernel that forms its scores that way (any
// fp32 summation order of q.k, multiplying by the scale or dividing by 1/scale, with the factor
// held as FactorRounding says), the kernel's score for key j lies within `ambiguity[j]` of `z[j]`.
// The proof is interval arithmetic: each step maps the interval of values the kernel may hold to
// the interval of its results (fp32 rounding widens a value by at most 2^-24 relative, a format's
// rounding is monotone), and the centre is that step computed in IEEE float exactly as the kernel
// computes it.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::metrics {

// How a math-path kernel forms a score from q, k and the scale, F the recipe's format (the
// inputs are F's values: q and k are rounded to F first) and every product or sum in fp32:
enum class ScoreChain {
  product_then_scale,  // F(F(q . k) * scale): `(q @ k^T) * scale`, or `/ math.sqrt(d)`
  both_prescaled,      // F(F(q * sqrt(scale)) . F(k * sqrt(scale))): PyTorch's SDPA math before 2.5
  query_prescaled,     // F(F(q * scale) . k): `q = q * scale` first (Hugging Face's eager attention)
  scaled_accumulator,  // F(fp32(q . k) * scale): baddbmm(alpha=scale), a fused epilogue
};

// How the kernel holds the factor it multiplies by (the scale, or sqrt(scale) for both_prescaled):
// in fp32 (multiplied, or 1/factor divided; one interval covers both), or rounded to F first, as
// torch 1.13 on the CPU rounds a Python scalar to the tensor's dtype: `s * scale` multiplies by
// F(scale), `s / math.sqrt(d)` divides by F(sqrt(d)), i.e. multiplies by 1 / F(1 / factor).
enum class FactorRounding { fp32, format_product, format_quotient };

// How a math-path kernel applies a soft-cap c tanh(s / c) to its score s (none where the head has
// none), c held in fp32 or in F, divided by or multiplied by fp32(1 / c), tanh in fp32 within 2^-20
// relative. Not covered (a kernel written so is judged off the centre): other splits of the steps,
// such as F(c tanh(F(s / c))) with the quotient rounded and the rest fused, and approximate tanh.
enum class CapChain {
  none,
  each_step_in_format,  // F(F(tanh(F(s / c))) * c): `/ c`, `torch.tanh`, `* c` on F tensors (Gemma 2's eager)
  fp32_on_rounded,      // F(c tanh(s / c)) in fp32 on the rounded score: the cap upcast, or one fused op
  fused,                // F(c tanh(x / c)), x the score before its last rounding: one fp32 epilogue
};

// One way a head's scores may be formed: what one variant of a judgement emulates.
struct ScoreVariant {
  ScoreChain chain = ScoreChain::product_then_scale;
  CapChain cap = CapChain::none;
  FactorRounding rounding = FactorRounding::fp32;
};

// Every variant for `scores` (chain x cap x factor rounding, the most common first, the order a
// judgement tries them in): the three caps only where the head has a soft-cap.
[[nodiscard]] std::vector<ScoreVariant> score_variants(const tensor::HeadScores& scores);

// Every chain, the most common first (the order a judgement tries them in).
[[nodiscard]] std::span<const ScoreChain> score_chains();
// Every way of holding the factor, fp32 first.
[[nodiscard]] std::span<const FactorRounding> factor_roundings();
// "scores = F(F(q k^T) * scale)", for reports.
[[nodiscard]] std::string_view describe(ScoreChain chain);
[[nodiscard]] std::string_view describe(FactorRounding rounding);
[[nodiscard]] std::string_view describe(CapChain cap);
// The variant in words: "scores = F(F(q k^T) * scale), the scale in fp32" and its soft-cap's steps.
[[nodiscard]] std::string describe(const ScoreVariant& variant);

// Whether a head's scores are the math path's, which the chains describe: theta 1. An additive bias
// or ALiBi is added to the emulated score as the kernel may add it (ScoreEmulator::add_bias: the
// bias held in F or fp32, the slope in fp32 or F, the sum rounded to F), the ways kernels differ
// charged as the score's ambiguity; a soft-cap is applied before it, as CapChain says (kernels do
// not agree on where its tanh rounds: each way is its own variant).
[[nodiscard]] bool scores_emulable(const tensor::HeadScores& scores);

// One query row's emulated scores: per visible key (in the order given), then the sink if any.
struct EmulatedRow {
  std::vector<double> z;
  std::vector<double> ambiguity;  // 0 unless the kernel's fp32 order could round the score otherwise
  // With a soft-cap (empty without), per visible key: the slope 1 - t^2 autograd's tanh backward
  // multiplies by, t the tanh as the centre holds it (F's value for each_step_in_format, fp32's
  // otherwise), and how far an honest kernel's may be from it (t anywhere in the interval of tanh
  // values the ambiguity allows; the slope's own fp32 rounding, 2^-24 relative, is not in it).
  std::vector<double> slope;
  std::vector<double> slope_deviation;
};

class ScoreEmulator {
 public:
  // queries and keys as the judge holds them (double); the head's scores; F.
  ScoreEmulator(ScoreChain chain, const Matrix& queries, const Matrix& keys, const tensor::HeadScores& scores,
                const FloatFormat& format, FactorRounding rounding = FactorRounding::fp32,
                CapChain cap = CapChain::none);
  // False when `rounding` gives the same factors as fp32 (a power-of-two scale): nothing new to try.
  [[nodiscard]] bool distinct() const { return distinct_; }
  // The factor the kernel multiplies the product by (product_then_scale, scaled_accumulator), as it
  // holds it: the scale, F(scale) or 1 / F(1 / scale) (in fp32 as well, within 2^-24 relative).
  [[nodiscard]] double factor() const { return scale_; }
  // The operands as the kernel multiplies them (q and k rounded to F, then prescaled where the
  // chain prescales them), how far an honest kernel's may be from them, and the factor each was
  // prescaled by (1: none).
  [[nodiscard]] const Matrix& query_operand() const { return q_.centre; }
  [[nodiscard]] const Matrix& query_deviation() const { return q_.deviation; }
  [[nodiscard]] const Matrix& key_operand() const { return k_.centre; }
  [[nodiscard]] const Matrix& key_deviation() const { return k_.deviation; }
  [[nodiscard]] double query_factor() const { return query_factor_; }
  [[nodiscard]] double key_factor() const { return key_factor_; }
  // Where each step rounds to F (CapChain::each_step_in_format), which tanh the backward's slope is
  // formed from: F's (autograd through torch.tanh on F tensors; the default) or the fp32 value
  // before its rounding (`torch.tanh(x.float()).half()`, as fp16 must be written on the CPU: the
  // cast's backward passes the gradient to an fp32 tanh backward).
  void take_slope_from_fp32_tanh(bool fp32) { slope_from_fp32_ = fp32; }
  // Row `query`'s scores for the keys in `visible`; false if one is not finite (a score beyond F's
  // range), when the row cannot be emulated.
  bool row(std::size_t query, std::span<const std::size_t> visible, EmulatedRow& out) const;

 private:
  // An operand after its prescaling: the values the kernel holds (centre) and how far an honest
  // kernel's may be from them.
  struct Operand {
    Matrix centre;
    Matrix deviation;
  };
  [[nodiscard]] Operand prepare(const Matrix& x, double factor) const;
  // One score: the centre, how far an honest kernel's may be from it, and the interval of reals
  // the kernel may hold just before its last rounding to F.
  struct Score {
    double z = 0, ambiguity = 0;
    double before = 0, before_low = 0, before_high = 0;  // `before`: the centre's value there
    double slope = 1, slope_deviation = 0;               // the soft-cap's (EmulatedRow::slope)
  };
  // The score from the interval [lo, hi] the fp32 accumulator may hold and the centre it holds.
  void finish(double accumulator, double lo, double hi, Score& out) const;
  // The head's soft-cap applied to a score as cap_ says.
  void apply_cap(Score& score) const;
  // The head's bias added to a score as kernels add it.
  void add_bias(const tensor::HeadScores::BiasTerms& terms, bool hides, Score& score) const;

  ScoreChain chain_;
  CapChain cap_;
  const tensor::HeadScores& scores_;
  const FloatFormat& format_;
  double scale_ = 1;  // the factor applied after the product (product_then_scale, scaled_accumulator)
  double query_factor_ = 1, key_factor_ = 1;
  bool distinct_ = true;
  bool slope_from_fp32_ = false;
  Operand q_, k_;
};

}  // namespace sharpcheck::metrics
