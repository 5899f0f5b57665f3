#include "metrics/judge_tensors.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "metrics/score_emulation.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::metrics {
namespace {

struct HeadJudgement {
  Comparison output;
  Comparison lse;
  reference::ZivStatistics statistics;
  std::vector<Comparison> emulated_variants;  // Evaluation::emulated_variants
};

// The head's log-sum-exp against the reference's (allowance derived in the header): the recipe's
// units at magnitude 1 (1 / ln 2 for a base-2 LSE), and the roundings of ln and of the addition,
// and the reference's own, as an absolute (2 u_lse + u_acc) (|L| + ln n + 1), plus a smoothing
// kernel's fp32 correction (u_acc RowScale::smoothing_shift). P's rounding counts only where the
// recipe sums the rounded P.
Comparison judge_lse(const JudgeSpec& spec, const Evaluation& evaluation, std::vector<double> actual) {
  const std::size_t rows = actual.size();
  Matrix expected(rows, 1), given(rows, 1), magnitudes(rows, 1), z_magnitudes(rows, 1), own(rows, 1);
  ComparisonInput input{&expected, &given, &magnitudes, &z_magnitudes, evaluation.row_scales,
                        false,     0,      nullptr,     &own};
  // The logits' errors e_j move L = ln sum exp(z_j) by ln sum_j p_j exp(e_j), between -sum_j p_j
  // |e_j| (Jensen) and sum_j p_j (exp(|e_j|) - 1) (ln(1 + y) <= y): their P-weighted bound, grown by
  // exp(max |e_j|), in place of the largest where smaller. The largest let an
  // LSE off by 1e-3 pass where one key of small weight had a logit of large |q| |k| (8 sigma).
  for (RowScale& row : input.scales) {
    const double growth = std::exp(std::max(spec.tolerance->dot_product, 1.0) * row.logit_rounding *
                                   spec.tolerance->accumulation->unit_roundoff());
    if (row.weighted_logit_rounding >= 0 && std::isfinite(growth))
      row.logit_rounding = std::min(row.logit_rounding, row.weighted_logit_rounding * growth * (1 + 1e-9));
  }
  Tolerance recipe = *spec.tolerance;
  if (recipe.probability_format == nullptr)
    recipe.probability_format = spec.output;  // the output's, not the LSE's
  if (recipe.score_format == nullptr) recipe.score_format = spec.output;
  if (!recipe.row_sum_of_rounded_probabilities) recipe.probabilities_in_output = 0;
  const double unit = spec.lse_base2 ? 1.0 / std::log(2.0) * (1 + 1e-9) : 1.0;
  const double roundings =
      2 * spec.lse_format->unit_roundoff() + spec.tolerance->accumulation->unit_roundoff();
  for (std::size_t i = 0; i < rows; ++i) {
    const double exact = evaluation.expected_lse[i];
    // A fully masked row: ln 0 = -inf, or +inf as FlashAttention 2/3 write it (so that their
    // backward's exp(s - L) is 0); anything else there is wrong.
    const bool empty = exact == -INFINITY;
    expected(i, 0) = empty ? 0.0 : exact;
    given(i, 0) = empty ? (std::isinf(actual[i]) ? 0.0 : NAN) : actual[i];
    const auto n = static_cast<double>(std::max<std::size_t>(evaluation.row_scales[i].n, 1));
    magnitudes(i, 0) = empty ? 0.0 : unit;
    own(i, 0) =
        empty ? 0.0
              : (roundings * (std::fabs(exact) + std::log(n) + 1) +
                 spec.tolerance->accumulation->unit_roundoff() * evaluation.row_scales[i].smoothing_shift) *
                    (1 + 0x1p-20);
    z_magnitudes(i, 0) = evaluation.row_scales[i].largest_magnitude;
  }
  // The inside roundings' statistical charges (evaluate.cpp's RowRounding), in the LSE's unit.
  InsideSpreads inside{.p = Matrix(rows, recipe.probabilities_in_output > 0 ? 1 : 0),
                       .s = Matrix(rows, 1),
                       .s_second = Matrix(rows, 1),
                       .centre = {},
                       .centre_magnitude = {}};
  for (std::size_t i = 0; i < rows && i < evaluation.lse_spreads.size(); ++i) {
    const auto& spreads = evaluation.lse_spreads[i];
    if (inside.p.cols > 0) inside.p(i, 0) = spreads.p * unit;
    inside.s(i, 0) = spreads.s * unit;
    inside.s_second(i, 0) = spreads.s_second * unit;
  }
  input.inside = &inside;
  return compare(input, recipe, *spec.lse_format);
}

// The layer's tensors, read a head at a time (lse may be null).
struct LayerSources {
  const tensor::TensorSource& q;
  const tensor::TensorSource& k;
  const tensor::TensorSource& v;
  const tensor::TensorSource& out;
  const tensor::TensorSource* lse;
};

HeadJudgement judge_head(const JudgeSpec& spec, const tensor::AttentionProblem& problem, std::size_t b,
                         std::size_t h, const LayerSources& sources) {
  const auto& [q, k, v, out, lse] = sources;
  const std::size_t rows = problem.query_length(b);
  const std::size_t kv = problem.kv_head_of(h);
  const Matrix queries = tensor::gather_head(problem, tensor::HeadTensor::query, q, b, h);
  const Matrix key_rows = tensor::gather_head(problem, tensor::HeadTensor::key, k, b, kv);
  const Matrix value_rows = tensor::gather_head(problem, tensor::HeadTensor::value, v, b, kv);
  Matrix actual = tensor::gather_head(problem, tensor::HeadTensor::output, out, b, h);
  JudgeSpec head_spec = spec;
  head_spec.lse = lse != nullptr;
  if (spec.known_heads != nullptr) head_spec.known = &(*spec.known_heads)[b * problem.shape.heads + h];
  const Evaluation evaluation =
      judge_attention(head_spec, queries, key_rows, value_rows, problem.head(b, h), std::move(actual));
  HeadJudgement judgement{
      evaluation.comparison, {}, evaluation.reference_statistics, evaluation.emulated_variants};
  if (lse != nullptr) {
    std::vector<double> given(rows);
    for (std::size_t s = 0; s < rows; ++s) lse->read(problem.lse_offset(b, h, s), {&given[s], 1});
    judgement.lse = judge_lse(head_spec, evaluation, std::move(given));
  }
  return judgement;
}

// Folds a head's comparison in, keeping the full index of the worst element seen.
void fold(Comparison& total, tensor::ElementIndex& worst, const Comparison& head, std::size_t b,
          std::size_t h) {
  const bool worse =
      head.elements > 0 && (total.elements == 0 || head.max_bound_ratio > total.max_bound_ratio);
  total.merge(head);
  if (worse) worst = {b, h, head.worst.row, head.worst.index};
}

double closeness(const Comparison& c) {
  return c.non_finite > 0 ? INFINITY
                          : std::max({c.max_bound_ratio, c.max_statistical_ratio, c.max_row_scale_ratio});
}

// A recipe with emulated scores (metrics/score_emulation.hpp): each head kept its best variant, but
// a kernel forms every head's scores one way, so the output's verdict is the single variant that
// fits all heads best (heads that could not be emulated keep their one comparison in each).
void one_emulated_variant(const tensor::AttentionProblem& problem, const std::vector<HeadJudgement>& judged,
                          TensorJudgement& judgement) {
  std::size_t variants = 0;
  for (const HeadJudgement& head : judged) variants = std::max(variants, head.emulated_variants.size());
  if (variants == 0) return;
  std::optional<Comparison> best;
  tensor::ElementIndex best_worst;
  std::size_t chosen = 0;
  for (std::size_t v = 0; v < variants; ++v) {
    Comparison total;
    tensor::ElementIndex worst;
    for (std::size_t item = 0; item < judged.size(); ++item) {
      const HeadJudgement& head = judged[item];
      fold(total, worst, head.emulated_variants.empty() ? head.output : head.emulated_variants[v],
           item / problem.shape.heads, item % problem.shape.heads);
    }
    if (!best || closeness(total) < closeness(*best)) {
      best = std::move(total);
      best_worst = worst;
      chosen = v;
    }
  }
  judgement.output = std::move(*best);
  judgement.worst_output = best_worst;
  // Every head with variants tried the same list (score_variants: the cap's three only with a
  // soft-cap, which every head of a problem shares).
  for (std::size_t item = 0; item < judged.size(); ++item) {
    if (judged[item].emulated_variants.size() != variants) continue;
    const std::vector<ScoreVariant> tried =
        score_variants(problem.head(item / problem.shape.heads, item % problem.shape.heads));
    if (chosen < tried.size()) judgement.score_variant = describe(tried[chosen]);
    break;
  }
}

}  // namespace

std::string TensorJudgement::describe_worst() const {
  std::string text = "output worst at " + worst_output.to_string() + ": " + output.worst.describe();
  if (lse) text += "; log-sum-exp worst at " + worst_lse.to_string(false) + ": " + lse->worst.describe();
  return text;
}

TensorJudgement judge_attention_tensors(const JudgeSpec& spec, const tensor::AttentionProblem& problem,
                                        std::span<const double> q, std::span<const double> k,
                                        std::span<const double> v, std::span<const double> out,
                                        std::span<const double> lse, unsigned threads) {
  const tensor::SpanSource lse_source(lse);
  return judge_attention_tensors(spec, problem, tensor::SpanSource(q), tensor::SpanSource(k),
                                 tensor::SpanSource(v), tensor::SpanSource(out),
                                 lse.empty() ? nullptr : &lse_source, threads);
}

TensorJudgement judge_attention_tensors(const JudgeSpec& spec, const tensor::AttentionProblem& problem,
                                        const tensor::TensorSource& q, const tensor::TensorSource& k,
                                        const tensor::TensorSource& v, const tensor::TensorSource& out,
                                        const tensor::TensorSource* lse, unsigned threads) {
  problem.validate();
  const auto check = [](std::size_t got, std::size_t expected, const char* name) {
    if (got != expected) {
      throw InputError(InputProblem::shape_mismatch,
                       std::string("judge: ") + name + " has " + std::to_string(got) +
                           " elements, the problem needs " + std::to_string(expected));
    }
  };
  check(q.size(), problem.query_elements(), "Q");
  check(k.size(), problem.key_elements(), "K");
  check(v.size(), problem.value_elements(), "V");
  check(out.size(), problem.output_elements(), "the output");
  if (lse != nullptr) check(lse->size(), problem.lse_elements(), "the log-sum-exp");
  const std::size_t heads = problem.shape.batch * problem.shape.heads;
  if (spec.known_heads != nullptr && spec.known_heads->size() != heads) spec.known_heads->assign(heads, {});
  std::vector<HeadJudgement> judged(heads);
  std::vector<char> done(heads, 0);
  TensorJudgement judgement;
  int interrupted_by = 0;
  try {
    parallel_for(heads, threads, [&](std::size_t item) {
      const std::size_t b = item / problem.shape.heads;
      if (problem.query_length(b) > 0) {
        try {
          judged[item] = judge_head(spec, problem, b, item % problem.shape.heads, {q, k, v, out, lse});
        } catch (const InputError& error) {  // say which head: the reference names the row and column
          throw InputError(error.problem(), "batch " + std::to_string(b) + ", head " +
                                                std::to_string(item % problem.shape.heads) + ": " +
                                                error.what());
        }
      }
      done[item] = 1;
    });
  } catch (const Interrupted& interrupted) {  // keep the heads judged, for a caller that reports them
    interrupted_by = interrupted.signal_number();
  }
  if (lse != nullptr) judgement.lse = Comparison{};
  for (std::size_t item = 0; item < heads; ++item) {  // in order: reports do not depend on threads
    const std::size_t with_queries = problem.query_length(item / problem.shape.heads) > 0 ? 1 : 0;
    judgement.heads += with_queries;
    if (done[item] == 0) continue;
    judgement.heads_judged += with_queries;
    const std::size_t b = item / problem.shape.heads;
    const std::size_t h = item % problem.shape.heads;
    fold(judgement.output, judgement.worst_output, judged[item].output, b, h);
    if (judgement.lse) fold(*judgement.lse, judgement.worst_lse, judged[item].lse, b, h);
    judgement.statistics.merge(judged[item].statistics);
  }
  // Heads not judged have no variants and an empty output: folding them changes nothing.
  one_emulated_variant(problem, judged, judgement);
  if (interrupted_by != 0) throw InterruptedTensorJudgement(interrupted_by, std::move(judgement));
  return judgement;
}

}  // namespace sharpcheck::metrics
