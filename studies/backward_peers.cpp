#include "studies/backward_peers.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/parallel.hpp"
#include "inputs/attention_backward_cases.hpp"
#include "kernels/attention_backward.hpp"
#include "metrics/judge_backward.hpp"
#include "metrics/recipes.hpp"

namespace sharpcheck::studies {
namespace {

double max_difference(const Matrix& a, const Matrix& b) {
  double largest = 0;
  for (std::size_t e = 0; e < a.values.size(); ++e) {
    const double difference = std::fabs(a.values[e] - b.values[e]);
    if (std::isnan(difference)) return INFINITY;
    largest = std::max(largest, difference);
  }
  return largest;
}

struct PeerGold {
  reference::AttentionGradients gold;  // correctly rounded to fp64
  kernels::KernelGradients lowp;       // the math path in the format
};

// PyTorch's and FlashAttention's rules on one kernel's gradients.
void judge_by_peers(const PeerGold& peer, const kernels::KernelGradients& test, PeerVerdicts& verdicts) {
  const Matrix* gold[] = {&peer.gold.d_queries, &peer.gold.d_keys, &peer.gold.d_values};
  const Matrix* lowp[] = {&peer.lowp.d_queries, &peer.lowp.d_keys, &peer.lowp.d_values};
  const Matrix* got[] = {&test.d_queries, &test.d_keys, &test.d_values};
  const double fudge[] = {180, 16, 4};
  for (int g = 0; g < 3; ++g) {
    const double lowp_error = max_difference(*lowp[g], *gold[g]);
    const double test_error = max_difference(*got[g], *gold[g]);
    if (!(test_error <= std::max(1e-5, fudge[g] * lowp_error))) verdicts.pytorch_fails = true;
    if (!(test_error <= 3 * lowp_error)) verdicts.flash_fails = true;
  }
}

}  // namespace

BackwardPeerStudy run_backward_peer_study(std::uint64_t seed, unsigned threads) {
  const auto kernels = kernels::attention_backward_kernels();
  const auto kinds = std::span(inputs::all_backward_kinds);
  BackwardPeerStudy study;
  study.rows.resize(kernels.size() * kinds.size());
  // One work item per case and format: the references once, then every kernel of that format.
  const FloatFormat* formats[] = {&fp32, &bf16, &fp16};
  constexpr std::size_t format_count = std::size(formats);
  parallel_for(kinds.size() * format_count, threads, [&](std::size_t item) {
    const std::size_t case_index = item / format_count;
    const inputs::BackwardKind kind = kinds[case_index];
    const FloatFormat& format = *formats[item % format_count];
    const inputs::BackwardInputs in = inputs::make_backward_inputs(kind, format, seed + case_index);
    const kernels::BackwardProblem problem{in.queries, in.keys, in.values, in.d_out, in.d_lse, in.scores};
    const reference::AttentionBackwardInputs exact{in.queries, in.keys,  in.values,
                                                   in.d_out,   in.d_lse, in.scores};
    const reference::AttentionGradients expected = reference::attention_backward(exact, format);
    const PeerGold peer{reference::attention_backward(exact, fp64),
                        kernels::attention_backward_math_lowp(problem, format)};
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      if (kernels[k].format != &format) continue;
      PeerVerdicts& row = study.rows[k * kinds.size() + case_index];
      row = PeerVerdicts{};
      row.kernel = kernels[k].name;
      row.case_name = inputs::backward_kind_name(kind);
      row.deliberately_broken = kernels[k].deliberately_broken;
      const kernels::KernelGradients got = kernels[k].run(problem);
      const auto judgement = metrics::judge_attention_backward(metrics::backward_tolerance_of(kernels[k]),
                                                               format, problem, got, &expected);
      row.sharpcheck_fails = !judgement.passed();
      row.worst = judgement.describe_worst();
      row.bound_ratio = std::max({judgement.d_queries.max_bound_ratio, judgement.d_keys.max_bound_ratio,
                                  judgement.d_values.max_bound_ratio,
                                  judgement.d_sink ? judgement.d_sink->max_bound_ratio : 0.0,
                                  judgement.d_rows ? judgement.d_rows->max_bound_ratio : 0.0});
      judge_by_peers(peer, got, row);
    }
  });
  return study;
}

}  // namespace sharpcheck::studies
