// Judging a whole attention layer's outputs (and its log-sum-exp) computed elsewhere: batched
// multi-head tensors in any layout of tensor/attention_problem.hpp, each head judged against the
// correctly rounded reference under one tolerance entry, heads in parallel, the worst element
// named by its full index. `compare` and (next) the Python module call this.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <utility>

#include "core/errors.hpp"
#include "metrics/evaluate.hpp"
#include "tensor/attention_problem.hpp"
#include "tensor/tensor_source.hpp"

namespace sharpcheck::metrics {

struct TensorJudgement {
  Comparison output;
  std::optional<Comparison> lse;  // when a log-sum-exp was given
  tensor::ElementIndex worst_output;
  tensor::ElementIndex worst_lse;
  reference::ZivStatistics statistics;
  // Heads with queries judged, of those the problem has: fewer only in the judgement an
  // InterruptedTensorJudgement carries, whose comparisons cover the heads judged alone.
  std::size_t heads_judged = 0, heads = 0;
  // A recipe with emulated scores: the one variant the output was judged around (every head formed
  // its scores so), described; empty where none was emulated.
  std::string score_variant;
  [[nodiscard]] bool passed() const { return output.passed() && (!lse || lse->passed()); }
  // "output worst at [batch 1, head 3, row 17, column 5]: ..." and the same for the LSE.
  [[nodiscard]] std::string describe_worst() const;
};

// A signal stopped the judgement (core/interrupt.hpp): thrown with what the heads finished by
// then give, for a caller that reports it (compare); any other caller sees an Interrupted.
class InterruptedTensorJudgement : public Interrupted {
 public:
  InterruptedTensorJudgement(int signal_number, TensorJudgement partial)
      : Interrupted(signal_number), partial_(std::move(partial)) {}
  [[nodiscard]] const TensorJudgement& partial() const { return partial_; }

 private:
  TensorJudgement partial_;
};

// q, k, v, out as problem's layout says (out: problem.output_elements()); lse empty or
// problem.lse_elements() values (natural log, or base 2 with spec.lse_base2), judged in
// spec.lse_format. Padding query rows are not judged. threads 0: every core.
//
// The log-sum-exp's allowance: a kernel forms L = m + ln S with S = S_exact (1 + eps), |eps|
// bounded by the same units u as the softmax's denominator (its tolerance entry's formula at the
// row's spread), and logits off by at most dot_product * logit_rounding * u, which moves L by as
// much; ln and the addition round twice in the LSE's format: 2 u_lse (|L| + ln n + 1). The
// entry's allowance relative to a magnitude of 1 + |L| + ln n covers all three.
[[nodiscard]] TensorJudgement judge_attention_tensors(const JudgeSpec& spec,
                                                      const tensor::AttentionProblem& problem,
                                                      std::span<const double> q, std::span<const double> k,
                                                      std::span<const double> v, std::span<const double> out,
                                                      std::span<const double> lse, unsigned threads = 0);

// The same, reading each head's rows from the sources as it judges it (lse may be null): memory is
// a head's worth per thread.
[[nodiscard]] TensorJudgement judge_attention_tensors(
    const JudgeSpec& spec, const tensor::AttentionProblem& problem, const tensor::TensorSource& q,
    const tensor::TensorSource& k, const tensor::TensorSource& v, const tensor::TensorSource& out,
    const tensor::TensorSource* lse, unsigned threads = 0);

}  // namespace sharpcheck::metrics
