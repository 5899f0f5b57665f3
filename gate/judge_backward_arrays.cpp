#include "gate/judge_backward_arrays.hpp"

#include <string>

#include "gate/array_checks.hpp"
#include "kernels/attention_backward.hpp"
#include "metrics/judge_backward.hpp"

namespace sharpcheck::gate {
namespace {

std::vector<double> read_all(const Array& array) {
  std::vector<double> values(array.size());
  array.read(0, values);
  return values;
}

// The problem, refusing what the backward reference does not support yet.
tensor::AttentionProblem backward_problem(const JudgeOptions& options, const BackwardArrays& arrays) {
  if (!arrays.q || !arrays.k || !arrays.v || !arrays.d_out)
    refuse(InputProblem::out_of_range, "the attention backward needs q, k, v and dout");
  for (const Array* array : {arrays.q, arrays.k, arrays.v, arrays.d_out}) {
    if (array->size() == 0) refuse(InputProblem::empty_input, array->name() + " holds no element");
  }
  AttentionArrays shapes;
  shapes.q = arrays.q;
  shapes.k = arrays.k;
  shapes.v = arrays.v;
  shapes.sinks = arrays.sinks;
  const tensor::AttentionProblem problem = attention_problem_of(options, shapes);
  if (problem.layout == tensor::Layout::packed || !problem.query_lengths.empty() ||
      !problem.key_lengths.empty())
    refuse(InputProblem::out_of_range,
           "the attention backward supports the bhsd and bshd layouts without padding");
  if (problem.shape.kv_heads != problem.shape.heads)
    refuse(InputProblem::out_of_range, "the attention backward does not support GQA or MQA yet (" +
                                           std::to_string(problem.shape.heads) + " heads, " +
                                           std::to_string(problem.shape.kv_heads) + " KV heads)");
  if (options.scores.has_bias())
    refuse(InputProblem::out_of_range, "the attention backward does not support a bias yet");
  if (arrays.d_out->size() != problem.output_elements())
    refuse(InputProblem::shape_mismatch, arrays.d_out->name() + " holds " +
                                             std::to_string(arrays.d_out->size()) +
                                             " elements, the output of " + problem.describe() + " has " +
                                             std::to_string(problem.output_elements()));
  if (!arrays.sinks.empty() && arrays.sinks.size() != problem.shape.heads)
    refuse(InputProblem::shape_mismatch,
           "one sink per head is needed, got " + std::to_string(arrays.sinks.size()));
  return problem;
}

// One head's matrices, gathered from whole tensors by the problem's offsets.
struct HeadMatrices {
  Matrix q, k, v, d_out;
  std::vector<double> d_lse;
};

template <typename Offset>
Matrix gather(const std::vector<double>& all, std::size_t rows, std::size_t cols, Offset offset) {
  Matrix m(rows, cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) m(r, c) = all[offset(r, c)];
  }
  return m;
}

struct Tensors {
  std::vector<double> q, k, v, d_out, d_lse;
};

HeadMatrices head_of(const tensor::AttentionProblem& p, const Tensors& t, std::size_t b, std::size_t h) {
  const auto& s = p.shape;
  HeadMatrices head{
      gather(t.q, s.queries, s.head_dim, [&](auto r, auto c) { return p.query_offset(b, h, r, c); }),
      gather(t.k, s.keys, s.head_dim, [&](auto r, auto c) { return p.key_offset(b, h, r, c); }),
      gather(t.v, s.keys, s.value_dim, [&](auto r, auto c) { return p.value_offset(b, h, r, c); }),
      gather(t.d_out, s.queries, s.value_dim, [&](auto r, auto c) { return p.output_offset(b, h, r, c); }),
      {}};
  for (std::size_t r = 0; r < s.queries && !t.d_lse.empty(); ++r)
    head.d_lse.push_back(t.d_lse[p.lse_offset(b, h, r)]);
  return head;
}

tensor::HeadScores scores_of(const JudgeOptions& options, const BackwardArrays& arrays, std::size_t h) {
  tensor::HeadScores scores = options.scores;
  scores.theta = options.theta;
  if (!arrays.sinks.empty()) scores.sink = arrays.sinks[h];
  return scores;
}

Tensors read_tensors(const BackwardArrays& arrays, const tensor::AttentionProblem& problem) {
  Tensors t{read_all(*arrays.q), read_all(*arrays.k), read_all(*arrays.v), read_all(*arrays.d_out), {}};
  if (arrays.d_lse != nullptr) {
    t.d_lse = read_all(*arrays.d_lse);
    if (t.d_lse.size() != problem.lse_elements())
      refuse(InputProblem::shape_mismatch, arrays.d_lse->name() + " holds " + std::to_string(t.d_lse.size()) +
                                               " elements, the log-sum-exp " +
                                               std::to_string(problem.lse_elements()));
  }
  return t;
}

// Reads a gradient tensor, each element a value of the format, with its expected shape.
std::vector<double> read_gradient(const Array* array, const char* what, std::size_t elements,
                                  const StoredFormat& format) {
  if (array == nullptr) refuse(InputProblem::out_of_range, std::string("the judge needs ") + what);
  std::vector<double> values = read_all(*array);
  if (values.size() != elements)
    refuse(InputProblem::shape_mismatch, array->name() + " holds " + std::to_string(values.size()) +
                                             " elements, " + what + " has " + std::to_string(elements));
  for (std::size_t e = 0; e < values.size(); ++e) {
    if (!std::isnan(values[e]))
      require_value_of(values[e], format, array->name(), e);  // NaN is judged, not refused
  }
  return values;
}

}  // namespace

BackwardGradients attention_backward_of_arrays(const JudgeOptions& options, const BackwardArrays& arrays) {
  const tensor::AttentionProblem p = backward_problem(options, arrays);
  const FloatFormat& target = *stored_format(options.format).format;
  const Tensors t = read_tensors(arrays, p);
  BackwardGradients g{std::vector<double>(p.query_elements()),
                      std::vector<double>(p.key_elements()),
                      std::vector<double>(p.value_elements()),
                      {}};
  const auto& s = p.shape;
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const HeadMatrices head = head_of(p, t, b, h);
      const tensor::HeadScores scores = scores_of(options, arrays, h);
      const auto exact =
          reference::attention_backward({head.q, head.k, head.v, head.d_out, head.d_lse, scores}, target);
      for (std::size_t r = 0; r < s.queries; ++r) {
        for (std::size_t c = 0; c < s.head_dim; ++c) g.dq[p.query_offset(b, h, r, c)] = exact.d_queries(r, c);
      }
      for (std::size_t r = 0; r < s.keys; ++r) {
        for (std::size_t c = 0; c < s.head_dim; ++c) g.dk[p.key_offset(b, h, r, c)] = exact.d_keys(r, c);
        for (std::size_t c = 0; c < s.value_dim; ++c) g.dv[p.value_offset(b, h, r, c)] = exact.d_values(r, c);
      }
      // A sink is shared by the batch: its gradient sums over it; rounded once per (b, h) here,
      // so only a batch of 1 gives the correctly rounded total.
      if (exact.d_sink) {
        g.d_sinks.resize(s.heads, 0.0);
        g.d_sinks[h] += *exact.d_sink;
      }
    }
  }
  if (!g.d_sinks.empty() && s.batch > 1)
    refuse(InputProblem::out_of_range, "the sinks' gradients are correctly rounded for a batch of 1 only");
  return g;
}

CaseOutcome judge_attention_backward_arrays(const JudgeOptions& options, const BackwardArrays& arrays) {
  const tensor::AttentionProblem p = backward_problem(options, arrays);
  const StoredFormat output = stored_format(options.format);
  const std::string entry =
      options.tolerance_entry.empty() ? "attention_backward_flash" : options.tolerance_entry;
  const auto* kernel = kernels::find_attention_backward_kernel(entry);
  if (kernel == nullptr)
    refuse(InputProblem::out_of_range, "no backward tolerance entry named '" + entry +
                                           "' (attention_backward_plain, attention_backward_flash, ...)");
  if (!arrays.d_sinks.empty() && (arrays.sinks.empty() || p.shape.batch != 1))
    refuse(InputProblem::out_of_range, "sink gradients are judged with sinks and a batch of 1");
  const Tensors t = read_tensors(arrays, p);
  std::vector<double> d_rows;  // D as the kernel kept it, laid out as the log-sum-exp, in fp32
  if (arrays.d != nullptr) d_rows = read_gradient(arrays.d, "D", p.lse_elements(), stored_format("fp32"));
  const std::vector<double> dq = read_gradient(arrays.dq, "dq", p.query_elements(), output),
                            dk = read_gradient(arrays.dk, "dk", p.key_elements(), output),
                            dv = read_gradient(arrays.dv, "dv", p.value_elements(), output);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = kernel_name(options, *arrays.dq);
  outcome.gate_case.n = p.shape.keys;
  double worst_ratio = -1;
  std::string worst_text;
  const auto& s = p.shape;
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const HeadMatrices head = head_of(p, t, b, h);
      const tensor::HeadScores scores = scores_of(options, arrays, h);
      kernels::KernelGradients got{
          gather(dq, s.queries, s.head_dim, [&](auto r, auto c) { return p.query_offset(b, h, r, c); }),
          gather(dk, s.keys, s.head_dim, [&](auto r, auto c) { return p.key_offset(b, h, r, c); }),
          gather(dv, s.keys, s.value_dim, [&](auto r, auto c) { return p.value_offset(b, h, r, c); }),
          arrays.d_sinks.empty() ? 0.0 : arrays.d_sinks[h],
          {}};
      for (std::size_t r = 0; r < s.queries && !d_rows.empty(); ++r)
        got.d_rows.push_back(d_rows[p.lse_offset(b, h, r)]);
      const kernels::BackwardProblem problem{head.q, head.k, head.v, head.d_out, head.d_lse, scores};
      auto judgement = metrics::judge_attention_backward(kernel->tolerance, *output.format, problem, got);
      if (arrays.d_sinks.empty()) judgement.d_sink.reset();  // not given: not judged
      const std::pair<const metrics::Comparison*, const Array*> parts[] = {{&judgement.d_queries, arrays.dq},
                                                                           {&judgement.d_keys, arrays.dk},
                                                                           {&judgement.d_values, arrays.dv}};
      for (const auto& [comparison, array] : parts) {
        outcome.comparison.merge(*comparison);
        if (comparison->max_bound_ratio <= worst_ratio) continue;
        worst_ratio = comparison->max_bound_ratio;
        const auto& w = comparison->worst;
        const std::size_t flat = array == arrays.dq   ? p.query_offset(b, h, w.row, w.index)
                                 : array == arrays.dk ? p.key_offset(b, h, w.row, w.index)
                                                      : p.value_offset(b, h, w.row, w.index);
        outcome.worst_array = array->name();
        outcome.worst_index = unravel(flat, array->shape());
        worst_text =
            "batch " + std::to_string(b) + " head " + std::to_string(h) + ": " + judgement.describe_worst();
      }
      if (judgement.d_sink) outcome.comparison.merge(*judgement.d_sink);
      if (judgement.d_rows) {
        outcome.comparison.merge(*judgement.d_rows);
        if (judgement.d_rows->max_bound_ratio > worst_ratio) {
          worst_ratio = judgement.d_rows->max_bound_ratio;
          outcome.worst_array = arrays.d->name();
          outcome.worst_index = unravel(p.lse_offset(b, h, judgement.d_rows->worst.row), arrays.d->shape());
          worst_text =
              "batch " + std::to_string(b) + " head " + std::to_string(h) + ": " + judgement.describe_worst();
        }
      }
    }
  }
  if (!outcome.comparison.passed(options.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(options.strictest) + " in " + p.describe() +
                               " (tolerance entry " + entry + "); worst: " + worst_text);
  }
  return outcome;
}

}  // namespace sharpcheck::gate
