#include "gate/judge_backward_arrays.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/parallel.hpp"
#include "gate/array_checks.hpp"
#include "kernels/attention_backward.hpp"
#include "metrics/judge_backward.hpp"
#include "metrics/recipes.hpp"
#include "reference/attention_backward.hpp"
#include "tensor/head_view.hpp"

namespace sharpcheck::gate {
namespace {

// The problem the arrays and options describe (every layout, padding, mask, bias and modifier of
// the forward), with dO's size checked.
tensor::AttentionProblem backward_problem(const JudgeOptions& options, const BackwardArrays& arrays) {
  if (!arrays.q || !arrays.k || !arrays.v || !arrays.d_out)
    refuse(InputProblem::out_of_range, "the attention backward needs q, k, v and dout");
  for (const Array* array : {arrays.q, arrays.k, arrays.v, arrays.d_out}) {
    if (array->size() == 0) refuse(InputProblem::empty_input, array->name() + " holds no element");
  }
  AttentionArrays shapes = arrays.scores;
  shapes.q = arrays.q;
  shapes.k = arrays.k;
  shapes.v = arrays.v;
  tensor::AttentionProblem problem = attention_problem_of(options, shapes);
  problem.validate();
  if (arrays.d_out->size() != problem.output_elements())
    refuse(InputProblem::shape_mismatch, arrays.d_out->name() + " holds " +
                                             std::to_string(arrays.d_out->size()) +
                                             " elements, the output of " + problem.describe() + " has " +
                                             std::to_string(problem.output_elements()));
  return problem;
}

// The group's query heads (stacked) or its KV head of one of the whole tensors.
Matrix group_rows(const tensor::AttentionProblem& p, tensor::HeadTensor which, const std::vector<double>& all,
                  std::size_t b, std::size_t kv) {
  const tensor::SpanSource source(all);
  if (which == tensor::HeadTensor::key || which == tensor::HeadTensor::value)
    return tensor::gather_head(p, which, source, b, kv);
  return tensor::gather_heads(p, which, source, b, kv * p.group_size(), p.group_size());
}

struct Tensors {
  std::vector<double> q, k, v, d_out, d_lse;
};

// The query heads that share KV head `kv` of batch element b (GQA: heads kv G .. kv G + G - 1):
// their valid queries, dO and dLSE stacked head after head, with that KV head's valid keys and
// values and each head's scores (its lengths, mask, bias, ALiBi slope and sink).
struct Group {
  std::size_t first_head = 0, heads = 1, positions = 0, keys = 0;
  Matrix q, k, v, d_out;
  std::vector<double> d_lse;
  std::vector<tensor::HeadScores> scores;
  [[nodiscard]] tensor::AttentionBackwardProblem problem() const {
    return {q, k, v, d_out, d_lse, scores.front(), heads, {}, scores};
  }
};

// Offsets of a group's stacked rows and its keys in the whole tensors.
struct GroupOffsets {
  const tensor::AttentionProblem& p;
  std::size_t b, kv, heads, positions;
  [[nodiscard]] std::size_t head(std::size_t row) const { return kv * heads + row / positions; }
  [[nodiscard]] std::size_t query(std::size_t row, std::size_t c) const {
    return p.query_offset(b, head(row), row % positions, c);
  }
  [[nodiscard]] std::size_t output(std::size_t row, std::size_t c) const {
    return p.output_offset(b, head(row), row % positions, c);
  }
  [[nodiscard]] std::size_t key(std::size_t row, std::size_t c) const { return p.key_offset(b, kv, row, c); }
  [[nodiscard]] std::size_t value(std::size_t row, std::size_t c) const {
    return p.value_offset(b, kv, row, c);
  }
  [[nodiscard]] std::size_t lse(std::size_t row) const { return p.lse_offset(b, head(row), row % positions); }
};

GroupOffsets offsets_of(const tensor::AttentionProblem& p, std::size_t b, std::size_t kv) {
  return {p, b, kv, p.group_size(), p.query_length(b)};
}

Group group_of(const tensor::AttentionProblem& p, const Tensors& t, std::size_t b, std::size_t kv) {
  const GroupOffsets at = offsets_of(p, b, kv);
  const std::size_t rows = at.heads * at.positions, keys = p.key_length(b);
  Group g{kv * at.heads,
          at.heads,
          at.positions,
          keys,
          group_rows(p, tensor::HeadTensor::query, t.q, b, kv),
          group_rows(p, tensor::HeadTensor::key, t.k, b, kv),
          group_rows(p, tensor::HeadTensor::value, t.v, b, kv),
          group_rows(p, tensor::HeadTensor::output, t.d_out, b, kv),
          {},
          {}};
  for (std::size_t r = 0; r < rows && !t.d_lse.empty(); ++r) g.d_lse.push_back(t.d_lse[at.lse(r)]);
  for (std::size_t h = 0; h < at.heads; ++h) g.scores.push_back(p.head(b, g.first_head + h));
  return g;
}

Tensors read_tensors(const BackwardArrays& arrays, const tensor::AttentionProblem& problem) {
  Tensors t{
      all_values(*arrays.q), all_values(*arrays.k), all_values(*arrays.v), all_values(*arrays.d_out), {}};
  if (arrays.d_lse != nullptr) {
    t.d_lse = all_values(*arrays.d_lse);
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
  std::vector<double> values = all_values(*array);
  if (values.size() != elements)
    refuse(InputProblem::shape_mismatch, array->name() + " holds " + std::to_string(values.size()) +
                                             " elements, " + what + " has " + std::to_string(elements));
  for (std::size_t e = 0; e < values.size(); ++e) {
    if (!std::isnan(values[e]))
      require_value_of(values[e], format, array->name(), e);  // NaN is judged, not refused
  }
  return values;
}

// The whole tensors' gradients, zero (padded positions stay so). A sink's gradient sums over the
// batch, and each batch element's part would be rounded, not the sum: only for a batch of 1.
BackwardGradients zero_gradients(const tensor::AttentionProblem& p) {
  const bool sink_gradients = !p.sinks.empty() && p.shape.batch == 1;
  return {std::vector<double>(p.query_elements()), std::vector<double>(p.key_elements()),
          std::vector<double>(p.value_elements()), std::vector<double>(sink_gradients ? p.sinks.size() : 0)};
}

// One group's correctly rounded gradients written into the whole tensors' layout.
void scatter_group(const tensor::AttentionProblem& p, const Group& group, const GroupOffsets& at,
                   const reference::AttentionGradients& exact, BackwardGradients& g) {
  for (std::size_t r = 0; r < group.q.rows; ++r) {
    for (std::size_t c = 0; c < p.shape.head_dim; ++c) g.dq[at.query(r, c)] = exact.d_queries(r, c);
  }
  for (std::size_t r = 0; r < group.keys; ++r) {
    for (std::size_t c = 0; c < p.shape.head_dim; ++c) g.dk[at.key(r, c)] = exact.d_keys(r, c);
    for (std::size_t c = 0; c < p.shape.value_dim; ++c) g.dv[at.value(r, c)] = exact.d_values(r, c);
  }
  for (std::size_t h = 0; h < exact.d_sinks.size() && !g.d_sinks.empty(); ++h)
    g.d_sinks[group.first_head + h] = exact.d_sinks[h];
}

}  // namespace

BackwardGradients attention_backward_of_arrays(const JudgeOptions& options, const BackwardArrays& arrays) {
  const tensor::AttentionProblem p = backward_problem(options, arrays);
  const FloatFormat& target = *stored_format(options.format).format;
  const Tensors t = read_tensors(arrays, p);
  const auto& s = p.shape;
  BackwardGradients g = zero_gradients(p);
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t kv = 0; kv < s.kv_heads && p.query_length(b) > 0; ++kv) {
      const Group group = group_of(p, t, b, kv);
      const GroupOffsets at = offsets_of(p, b, kv);
      // The gradients only: a D the reference cannot decide must not refuse them.
      scatter_group(
          p, group, at,
          reference::attention_backward(group.problem(), target, nullptr, reference::RowsOfD::not_needed), g);
    }
  }
  return g;
}

namespace {

// The kernel's gradients and the verdict's running worst, folded group by group.
struct GradientTensors {
  std::vector<double> dq, dk, dv, d_rows;
};

struct Worst {
  double ratio = -1;
  std::string text;
};

// What every group's judgement reads: the options, the arrays and their problem, the tensors read from
// them, the kernel's gradients, and the entry (as a kernel row).
struct GroupJudging {
  const JudgeOptions& options;
  const BackwardArrays& arrays;
  const tensor::AttentionProblem& p;
  const Tensors& t;
  const GradientTensors& given;
  const kernels::AttentionBackwardKernel& kernel;
};

// Folds one group's comparison of a tensor into that tensor's verdict (the worst over groups).
void note_tensor_verdict(const std::string& name, const metrics::Comparison& comparison,
                         CaseOutcome& outcome) {
  auto found = std::find_if(outcome.tensors.begin(), outcome.tensors.end(),
                            [&](const CaseOutcome::TensorVerdict& t) { return t.name == name; });
  if (found == outcome.tensors.end()) {
    outcome.tensors.push_back({.name = name});
    found = outcome.tensors.end() - 1;
  }
  found->proven_ratio = std::max(found->proven_ratio, comparison.max_bound_ratio);
  found->statistical_ratio = std::max(found->statistical_ratio, comparison.max_statistical_ratio);
  found->violations += comparison.violation_count + comparison.statistical_violation_count;
  found->proven_violations += comparison.violation_count;
  found->non_finite += comparison.non_finite;
}

// Every (batch, KV head) group that has queries, gathered once, with its correctly rounded
// gradients: a recipe changes the allowance, not the reference, so the recipes tried share them.
struct JudgedGroups {
  std::vector<std::pair<std::size_t, std::size_t>> at;  // (batch, KV head)
  std::vector<Group> groups;
  std::vector<reference::AttentionGradients> references;
};

// The reference of each group; D only where the kernel hands its D over to be judged (a D no
// precision decides must not refuse the gradients' judgement).
JudgedGroups judged_groups(const JudgeOptions& options, const tensor::AttentionProblem& p, const Tensors& t,
                           reference::RowsOfD rows_of_d) {
  JudgedGroups judged;
  for (std::size_t b = 0; b < p.shape.batch; ++b) {
    for (std::size_t kv = 0; kv < p.shape.kv_heads && p.query_length(b) > 0; ++kv) {
      judged.at.emplace_back(b, kv);
      judged.groups.push_back(group_of(p, t, b, kv));
    }
  }
  // One group at a time: each reference call uses every core itself.
  for (const Group& group : judged.groups)
    judged.references.push_back(reference::attention_backward(
        group.problem(), *stored_format(options.format).format, nullptr, rows_of_d));
  return judged;
}

// One group's judgement against its reference (independent of the other groups: run in parallel).
metrics::BackwardJudgement judge_one_group(const GroupJudging& judging, const JudgedGroups& judged,
                                           std::size_t g) {
  const auto& [options, arrays, p, t, given, kernel] = judging;
  const std::size_t b = judged.at[g].first, kv = judged.at[g].second;
  const Group& group = judged.groups[g];
  const GroupOffsets at = offsets_of(p, b, kv);
  kernels::KernelGradients got{group_rows(p, tensor::HeadTensor::query, given.dq, b, kv),
                               group_rows(p, tensor::HeadTensor::key, given.dk, b, kv),
                               group_rows(p, tensor::HeadTensor::value, given.dv, b, kv),
                               {},
                               {}};
  for (std::size_t h = 0; h < group.heads && !arrays.d_sinks.empty(); ++h)
    got.d_sinks.push_back(arrays.d_sinks[group.first_head + h]);
  for (std::size_t r = 0; r < group.q.rows && !given.d_rows.empty(); ++r)
    got.d_rows.push_back(given.d_rows[at.lse(r)]);
  return metrics::judge_attention_backward(kernel.tolerance, *stored_format(options.format).format,
                                           group.problem(), got, &judged.references[g]);
}

// Folds group g's judgement into the outcome and the running worst (in the groups' order).
void fold_group(const GroupJudging& judging, const JudgedGroups& judged, std::size_t g,
                const metrics::BackwardJudgement& judgement, CaseOutcome& outcome, Worst& worst) {
  const auto& arrays = judging.arrays;
  const std::size_t b = judged.at[g].first, kv = judged.at[g].second;
  const Group& group = judged.groups[g];
  const GroupOffsets at = offsets_of(judging.p, b, kv);
  const auto where = [&] { return "batch " + std::to_string(b) + " KV head " + std::to_string(kv) + ": "; };
  const std::tuple<const metrics::Comparison*, const Array*, int> parts[] = {
      {&judgement.d_queries, arrays.dq, 0},
      {&judgement.d_keys, arrays.dk, 1},
      {&judgement.d_values, arrays.dv, 2},
      {judgement.d_rows ? &*judgement.d_rows : nullptr, arrays.d, 3},
      {judgement.d_sink ? &*judgement.d_sink : nullptr, nullptr, 4}};
  for (const auto& [comparison, array, kind] : parts) {
    if (comparison == nullptr) continue;
    outcome.comparison.merge(*comparison);
    note_tensor_verdict(array == nullptr ? std::string("d_sinks") : array->name(), *comparison, outcome);
    if (comparison->max_bound_ratio <= worst.ratio) continue;
    worst.ratio = comparison->max_bound_ratio;
    const auto& w = comparison->worst;
    worst.text = where() + judgement.describe_worst();
    if (array == nullptr) {  // the sinks' gradients: one per query head, named by the head
      outcome.worst_array = "d_sinks";
      outcome.worst_index = {group.first_head + w.row};
      continue;
    }
    const std::size_t flat = kind == 0   ? at.query(w.row, w.index)
                             : kind == 1 ? at.key(w.row, w.index)
                             : kind == 2 ? at.value(w.row, w.index)
                                         : at.lse(w.row);
    outcome.worst_array = array->name();
    outcome.worst_index = unravel(flat, array->shape());
  }
}

}  // namespace

namespace {

// The backward tolerance a name stands for: a recipe (metrics/recipes.hpp) or a built-in backward
// kernel's entry; InputError naming the choices for any other.
const kernels::BackwardTolerance& backward_entry(const std::string& name) {
  if (const auto* recipe = metrics::find_recipe(name); recipe != nullptr && recipe->backward)
    return metrics::backward_tolerance(*recipe);
  if (const auto* kernel = kernels::find_attention_backward_kernel(name))
    return metrics::backward_tolerance_of(*kernel);
  refuse(InputProblem::out_of_range, "no backward recipe or tolerance entry named '" + name +
                                         "' (the recipes: " + metrics::recipe_names(true) +
                                         "; or a backward kernel's name)");
}

// The largest ratio of a judged outcome (both tiers unless the proven one alone is asked for).
double closeness_of(const CaseOutcome& outcome, metrics::Tier strictest) {
  const auto& c = outcome.comparison;
  if (c.non_finite > 0) return INFINITY;
  return strictest == metrics::Tier::proven ? c.max_bound_ratio
                                            : std::max({c.max_bound_ratio, c.max_statistical_ratio,
                                                        c.max_row_scale_ratio, c.max_bias_ratio});
}

CaseOutcome judge_backward_under(const JudgeOptions& options, const BackwardArrays& arrays,
                                 const tensor::AttentionProblem& p, const Tensors& t,
                                 const GradientTensors& given, const JudgedGroups& judged,
                                 const std::string& entry) {
  kernels::AttentionBackwardKernel kernel{};
  kernel.tolerance = backward_entry(entry);
  CaseOutcome outcome;
  outcome.format = stored_format(options.format).name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = kernel_name(options, *arrays.dq);
  outcome.gate_case.n = p.shape.keys;
  Worst worst;
  const GroupJudging judging{options, arrays, p, t, given, kernel};
  std::vector<std::optional<metrics::BackwardJudgement>> judgements(judged.groups.size());
  parallel_for(judged.groups.size(), options.threads,
               [&](std::size_t g) { judgements[g] = judge_one_group(judging, judged, g); });
  for (std::size_t g = 0; g < judged.groups.size(); ++g)
    fold_group(judging, judged, g, *judgements[g], outcome, worst);
  outcome.recipe = entry;
  if (!outcome.comparison.passed(options.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(options.strictest) + " in " + p.describe() +
                               " (recipe " + entry + "); worst: " + worst.text);
  }
  return outcome;
}

}  // namespace

CaseOutcome judge_attention_backward_arrays(const JudgeOptions& options, const BackwardArrays& arrays,
                                            BackwardGradients* reference) {
  const tensor::AttentionProblem p = backward_problem(options, arrays);
  const StoredFormat output = stored_format(options.format);
  const StoredFormat input = options.input_format.empty() ? output : stored_format(options.input_format);
  std::vector<std::string> entries;
  if (!options.tolerance_entry.empty()) {
    entries.push_back(options.tolerance_entry);
    // An unknown name, or one for another design's formats, is refused before any work.
    const std::string why = metrics::intermediate_format_mismatch(
        options.tolerance_entry, backward_entry(options.tolerance_entry).intermediate_format, *input.format,
        *output.format, true);
    if (!why.empty()) refuse(InputProblem::out_of_range, why);
  } else {
    for (const auto* recipe : metrics::default_recipes(*input.format, *output.format, true))
      entries.emplace_back(recipe->name);
  }
  if (!arrays.d_sinks.empty() && (p.sinks.size() != arrays.d_sinks.size() || p.shape.batch != 1))
    refuse(InputProblem::out_of_range, "sink gradients are judged with one per head's sink and a batch of 1");
  const Tensors t = read_tensors(arrays, p);
  GradientTensors given{read_gradient(arrays.dq, "dq", p.query_elements(), output),
                        read_gradient(arrays.dk, "dk", p.key_elements(), output),
                        read_gradient(arrays.dv, "dv", p.value_elements(), output),
                        {}};
  if (arrays.d != nullptr)
    // D in the format the reference rounds it to (reference::d_format): fp32 for a narrower target,
    // else the target itself (an fp64 D was refused as "not a fp32 value").
    given.d_rows = read_gradient(arrays.d, "D", p.lse_elements(),
                                 stored_format(std::string(reference::d_format(*output.format).name)));
  const JudgedGroups judged = judged_groups(
      options, p, t, given.d_rows.empty() ? reference::RowsOfD::not_needed : reference::RowsOfD::decided);
  if (reference != nullptr) {  // the reference the verdict used, for a caller that wants both
    *reference = zero_gradients(p);
    for (std::size_t g = 0; g < judged.groups.size(); ++g) {
      const std::size_t b = judged.at[g].first, kv = judged.at[g].second;
      scatter_group(p, judged.groups[g], offsets_of(p, b, kv), judged.references[g], *reference);
    }
  }
  std::optional<CaseOutcome> closest;
  double closest_ratio = INFINITY;
  std::string tried;
  for (const std::string& entry : entries) {
    CaseOutcome outcome = judge_backward_under(options, arrays, p, t, given, judged, entry);
    const double ratio = closeness_of(outcome, options.strictest);
    tried += (tried.empty() ? "" : ", ") + entry;
    const bool fits = outcome.passed();
    if (!closest || ratio < closest_ratio || fits) {
      closest = std::move(outcome);
      closest_ratio = ratio;
    }
    if (fits) break;
  }
  const auto* recipe = metrics::find_recipe(closest->recipe);
  const std::string summary = recipe != nullptr ? std::string(recipe->summary) : "a backward kernel's entry";
  const bool named = !options.tolerance_entry.empty();
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3g", closest_ratio);
  if (closest->passed()) {
    closest->recipe_note = (named ? "pass under " : "pass as ") + closest->recipe + ": " + summary;
  } else {
    const std::string named_only = metrics::recipe_names(true, true);  // empty: every one is tried
    closest->recipe_note =
        (named ? "fails the named recipe " + closest->recipe
               : "fits no recipe the formats allow (tried " + tried +
                     (named_only.empty() ? "" : "; name one of " + named_only + " to judge by it") +
                     "); closest: " + closest->recipe) +
        " (" + summary + ") at ratio " + ratio;
    closest->failures.push_back(closest->recipe_note);
  }
  return *closest;
}

}  // namespace sharpcheck::gate
