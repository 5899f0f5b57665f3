// attention's max_logit judgement (ops/attention/max_logit_check.hpp).
#include "ops/attention/max_logit_check.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "reference/max_logit.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::ops {
namespace {

constexpr double minus_infinity = -std::numeric_limits<double>::infinity();

// Where an honest kernel's maximum can lie: every score it forms is within b_ij (the header's
// bound) of s_ij, so its maximum lies in [max (s_ij - b_ij), max (s_ij + b_ij)] over the pairs the
// head sees. The scores are estimated in double; the estimate's own error (gamma_{d+3} in double's
// u, far below b_ij) widens the interval outward, and so does 2^-40 of each bound.
struct Interval {
  double low = minus_infinity, high = minus_infinity;
};
Interval interval_of(const Matrix& q, const Matrix& k, const tensor::HeadScores& head) {
  const double scale = reference::scale_in_double(head, q.cols);
  const double nu = static_cast<double>(q.cols + 3) * 0x1p-24,
               nu64 = static_cast<double>(q.cols + 3) * 0x1p-53;
  const double gamma = (nu / (1 - nu) + nu64 / (1 - nu64)) * (1 + 0x1p-40);
  Interval range;
  reference::for_each_visible_score(
      q, k, head, [&](std::size_t, std::size_t, double score, double magnitude) {
        const double bound = gamma * magnitude * (1 + 0x1p-40) * std::abs(scale) + 0x1p-1000;
        range.low = std::max(range.low, score - bound);
        range.high = std::max(range.high, score + bound);
      });
  return range;
}

struct Element {
  double expected = minus_infinity;
  Interval honest;  // where an honest kernel's maximum lies
};

void compare(const std::vector<Element>& expected, const std::vector<double>& actual,
             const std::vector<std::string>& names, metrics::Comparison& c) {
  for (std::size_t e = 0; e < expected.size(); ++e) {
    const double want = expected[e].expected, got = actual[e];
    // Above the reference, up to the interval's top; below it, down to its bottom; and half an
    // fp32 ulp of the reference either way (its own rounding).
    const Interval& honest = expected[e].honest;
    double allowed = got > want ? std::max(0.0, honest.high - want) : std::max(0.0, want - honest.low);
    if (std::isfinite(want)) allowed += 0.5 * (next_up(std::abs(want), fp32) - std::abs(want));
    const bool equal = want == got;  // both -inf for a head that sees nothing
    const double error = equal ? 0.0 : std::abs(got - want);
    const double ratio =
        equal ? 0.0 : (std::isnan(error) ? std::numeric_limits<double>::infinity() : error / allowed);
    ++c.elements;
    if (std::isfinite(want) && want != 0) ++c.informative;
    if (!std::isfinite(got) && std::isfinite(want)) ++c.non_finite;
    if (std::isfinite(error)) {
      c.max_absolute_error = std::max(c.max_absolute_error, error);
      if (std::isfinite(want))
        c.max_relative_error = std::max(c.max_relative_error, error / std::max(std::abs(want), 0x1p-126));
    }
    c.max_ulps = std::max(c.max_ulps, ulp_distance(want, got, fp32).value_or(std::uint64_t{1} << 32));
    if (!(ratio <= c.max_bound_ratio)) {
      c.max_bound_ratio = ratio;
      c.worst.index = e;
      c.worst.expected = want;
      c.worst.actual = got;
      c.worst.allowed = allowed;
      c.worst.bound_ratio = ratio;
      c.worst.ulps = ulp_distance(want, got, fp32);
    }
    if (ratio <= 1) continue;
    ++c.violation_count;
    ++c.element_violation_count;
    if (c.violations.size() < 5)
      c.violations.push_back("max_logit of " + names[e] + ": expected " + hex_float(want) + " got " +
                             hex_float(got) + " (|error| " + std::to_string(error) + " vs allowed " +
                             std::to_string(allowed) + ")");
  }
}

}  // namespace

void judge_max_logit(const gate::JudgeOptions& options, const gate::AttentionArrays& arrays,
                     const gate::Array& given, gate::CaseOutcome& outcome) {
  const tensor::AttentionProblem problem = gate::attention_problem_of(options, arrays);
  const std::size_t batch = problem.shape.batch, heads = problem.shape.heads;
  const bool per_batch = given.shape() == std::vector<std::size_t>{batch, heads};
  if (!per_batch && given.shape() != std::vector<std::size_t>{heads})
    throw InputError(InputProblem::shape_mismatch, "max_logit must be [H] = [" + std::to_string(heads) +
                                                       "] (each head over the batch) or [B, H] = [" +
                                                       std::to_string(batch) + ", " + std::to_string(heads) +
                                                       "]");
  std::vector<Element> expected(given.size());
  std::vector<std::string> names(given.size());
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      const tensor::HeadScores head = problem.head(b, h);
      const Matrix q = tensor::gather_head(problem, tensor::HeadTensor::query, *arrays.q, b, h);
      const Matrix k =
          tensor::gather_head(problem, tensor::HeadTensor::key, *arrays.k, b, h / problem.group_size());
      Element& e = expected[per_batch ? b * heads + h : h];
      names[per_batch ? b * heads + h : h] = per_batch
                                                 ? "batch " + std::to_string(b) + " head " + std::to_string(h)
                                                 : "head " + std::to_string(h);
      e.expected = std::max(e.expected, reference::max_logit(q, k, head, fp32));
      const Interval honest = interval_of(q, k, head);  // over the batch: the maxima's interval
      e.honest.low = std::max(e.honest.low, honest.low);
      e.honest.high = std::max(e.honest.high, honest.high);
    }
  }
  const std::vector<double> actual = gate::all_values(given);
  metrics::Comparison c;
  compare(expected, actual, names, c);
  double ulps = 0;
  for (std::size_t e = 0; e < actual.size(); ++e)
    ulps += static_cast<double>(
        ulp_distance(expected[e].expected, actual[e], fp32).value_or(std::uint64_t{1} << 32));
  c.mean_ulps = ulps / static_cast<double>(actual.size());
  if (c.max_bound_ratio > outcome.comparison.max_bound_ratio) {  // the worst element is max_logit's now
    outcome.worst_array = given.name();
    outcome.worst_index = per_batch ? std::vector<std::size_t>{c.worst.index / heads, c.worst.index % heads}
                                    : std::vector<std::size_t>{c.worst.index};
  }
  outcome.tensors.push_back({.name = "max_logit",
                             .proven_ratio = c.max_bound_ratio,
                             .statistical_ratio = 0,
                             .violations = c.violation_count,
                             .non_finite = c.non_finite,
                             .proven_violations = c.violation_count});
  if (c.violation_count > 0) outcome.failures.push_back(c.violations.front());
  outcome.comparison.merge(c);
}

}  // namespace sharpcheck::ops
