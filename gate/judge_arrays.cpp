#include "gate/judge_arrays.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "gate/array_checks.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/judge_tensors.hpp"
#include "metrics/recipes.hpp"

namespace sharpcheck::gate {
namespace {

struct RowBlock {
  std::size_t first = 0, count = 0;
  metrics::Comparison comparison;
  reference::ZivStatistics statistics;
};

// One block of lanes judged: outputs checked to be values of the format, the reference computed.
void judge_block(const JudgeOptions& options, const metrics::JudgeSpec& spec, const StoredFormat& output,
                 const Array& logits, const Array& outputs, const io::NpyLanes& lanes, RowBlock& block) {
  Matrix actual = outputs.read_lanes(lanes, block.first, block.count);
  for (std::size_t r = 0; r < block.count; ++r) {
    for (std::size_t a = 0; a < actual.cols; ++a) {
      require_value_of(actual(r, a), output, outputs.name(), lanes.c_index(block.first + r, a),
                       options.log_softmax);
    }
  }
  const Matrix logit_rows = logits.read_lanes(lanes, block.first, block.count);
  // A NaN or +inf logit is refused here, named by its full index (the reference would name only
  // its position in the lane); -inf is a masked entry.
  for (std::size_t r = 0; r < block.count; ++r) {
    for (std::size_t a = 0; a < logit_rows.cols; ++a) {
      const double x = logit_rows(r, a);
      if (!std::isnan(x) && x != INFINITY) continue;
      refuse(std::isnan(x) ? InputProblem::nan_value : InputProblem::positive_infinity,
             logits.name() + shape_text(unravel(lanes.c_index(block.first + r, a), logits.shape())) + " is " +
                 (std::isnan(x) ? "NaN" : "+inf") + " (a logit must be finite, or -inf for a masked entry)");
    }
  }
  const auto evaluation =
      options.log_softmax
          ? metrics::judge_log_softmax(spec, logit_rows, options.theta, std::move(actual), block.first)
          : metrics::judge_softmax(spec, logit_rows, options.theta, std::move(actual), block.first);
  block.comparison = evaluation.comparison;
  block.statistics = evaluation.reference_statistics;
}

// Blocks of about 4 M elements at most (memory stays at the blocks' size whatever the arrays'
// size), and at least four per thread where the rows allow, so every core has work.
std::vector<RowBlock> plan_blocks(const io::NpyLanes& lanes, unsigned threads) {
  const std::size_t by_memory = std::max<std::size_t>(1, (std::size_t{1} << 22) / lanes.extent);
  const std::size_t by_threads =
      std::max<std::size_t>(1, lanes.count / (4 * std::size_t{thread_count(threads)}));
  const std::size_t size = std::min(by_memory, by_threads);
  std::vector<RowBlock> blocks;
  for (std::size_t first = 0; first < lanes.count; first += size)
    blocks.push_back({first, std::min(size, lanes.count - first), {}, {}});
  return blocks;
}

// Folds tensor judgement (output and LSE) into the case and names the worst element on failure.
void record_attention(const JudgeOptions& options, const AttentionArrays& arrays,
                      const tensor::AttentionProblem& problem, const metrics::TensorJudgement& judgement,
                      CaseOutcome& outcome) {
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  if (judgement.lse && judgement.lse->max_bound_ratio > judgement.output.max_bound_ratio) {
    const auto& w = judgement.worst_lse;
    outcome.worst_array = "lse";
    outcome.worst_index = unravel(problem.lse_offset(w.batch, w.head, w.position), arrays.lse->shape());
  } else {
    const auto& w = judgement.worst_output;
    outcome.worst_array = "out";
    outcome.worst_index =
        unravel(problem.output_offset(w.batch, w.head, w.position, w.column), arrays.out->shape());
  }
  outcome.gate_case.n = problem.layout == tensor::Layout::packed ? problem.stored_keys() : problem.shape.keys;
  if (!outcome.comparison.passed(options.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(options.strictest) + " in " +
                               problem.describe() + "; " + judgement.describe_worst());
  }
}

// A 2-D array (one head's matrix, rows x columns) read as [1, 1, rows, columns].
std::vector<std::size_t> as_one_head(std::vector<std::size_t> shape) {
  if (shape.size() == 1) return {1, 1, 1, shape[0]};
  if (shape.size() == 2) return {1, 1, shape[0], shape[1]};
  return shape;
}

void fill_packed_shape(const JudgeOptions& options, const std::vector<std::size_t>& q,
                       const std::vector<std::size_t>& k, const std::vector<std::size_t>& v,
                       tensor::AttentionProblem& problem) {
  problem.cu_seqlens_q = options.cu_seqlens_q;
  problem.cu_seqlens_k = options.cu_seqlens_k;
  if (problem.cu_seqlens_q.size() < 2 || problem.cu_seqlens_k.size() < 2)
    refuse(InputProblem::out_of_range, "the packed layout needs cu_seqlens_q and cu_seqlens_k");
  problem.shape = {problem.cu_seqlens_q.size() - 1, q[1], k[1], 0, 0, q[2], v[2]};
  if (q[0] != problem.cu_seqlens_q.back() || k[0] != problem.cu_seqlens_k.back()) {
    refuse(InputProblem::shape_mismatch,
           "the cumulative lengths end at " + std::to_string(problem.cu_seqlens_q.back()) + " and " +
               std::to_string(problem.cu_seqlens_k.back()) + ", the tensors hold " + std::to_string(q[0]) +
               " and " + std::to_string(k[0]) + " tokens");
  }
}

// The outputs as the judge reads them, each checked to be a value of the format.
class CheckedOutput final : public tensor::TensorSource {
 public:
  CheckedOutput(const Array& array, const StoredFormat& stored) : array_(array), stored_(stored) {}
  [[nodiscard]] std::size_t size() const override { return array_.size(); }
  void read(std::size_t first, std::span<double> out) const override {
    array_.read(first, out);
    for (std::size_t i = 0; i < out.size(); ++i) require_value_of(out[i], stored_, array_.name(), first + i);
  }

 private:
  const Array& array_;
  const StoredFormat& stored_;
};

}  // namespace

StoredFormat stored_format(const std::string& name) {
  if (name == "int8") return {&q8_probabilities, -128, name};
  if (name == "uint8") return {&q8_probabilities, 0, name};
  const auto lookup = find_float_format(name);
  if (!lookup) {
    refuse(InputProblem::unsupported_format,
           "the format must be fp64, fp32, tf32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8 or uint8, got '" +
               name + "'");
  }
  return {*lookup, std::nullopt, name};
}

double decode_stored(double raw, io::NpyType type, const StoredFormat& stored, const std::string& array,
                     std::size_t index) {
  const auto where = [&] { return array + ": element " + std::to_string(index); };
  switch (type) {
    case io::NpyType::uint16:
    case io::NpyType::int16:
      return decode(static_cast<std::uint64_t>(raw), *stored.format == fp16 ? fp16 : bf16);
    case io::NpyType::uint8:
    case io::NpyType::int8:
      if (stored.zero_point) {
        if ((type == io::NpyType::int8) != (*stored.zero_point == -128)) {
          refuse(InputProblem::unsupported_format, where() + ": " + stored.name + " codes must be " +
                                                       (*stored.zero_point == -128 ? "int8" : "uint8"));
        }
        return (raw - *stored.zero_point) / 256.0;
      }
      if (type == io::NpyType::uint8 && stored.format->total_bits() == 8) {
        return decode(static_cast<std::uint64_t>(raw), *stored.format);  // fp8 bit patterns
      }
      if (type == io::NpyType::uint8)
        refuse(InputProblem::unsupported_format,
               where() + ": uint8 data is read as fp8 bits or uint8 codes only");
      return raw;
    default:
      return raw;
  }
}

io::NpyLanes lanes_along_dim(const Array& array, int dim) {
  const auto& shape = array.shape();
  if (shape.empty()) return {};
  const auto rank = static_cast<int>(shape.size());
  if (dim < -rank || dim >= rank) {
    refuse(InputProblem::out_of_range, "dim " + std::to_string(dim) + " is outside the " +
                                           std::to_string(rank) + " axes of " + array.name());
  }
  return io::lanes_along(shape, static_cast<std::size_t>(dim < 0 ? dim + rank : dim));
}

Matrix Array::read_lanes(const io::NpyLanes& lanes, std::size_t first, std::size_t count) const {
  Matrix matrix(count, lanes.extent);
  if (lanes.inner == 1) {  // lanes are contiguous rows
    read(first * lanes.extent, matrix.values);
    return matrix;
  }
  for (std::size_t r = 0; r < count; ++r) {
    for (std::size_t a = 0; a < lanes.extent; ++a) {
      double value = 0;
      read(lanes.c_index(first + r, a), std::span(&value, 1));
      matrix(r, a) = value;
    }
  }
  return matrix;
}

// The problem the arrays' shapes describe: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd), or
// [T, H, D] (packed, with cumulative lengths); KV heads from K's shape.
tensor::AttentionProblem attention_problem_of(const JudgeOptions& options, const AttentionArrays& arrays) {
  if (!arrays.q || !arrays.k || !arrays.v) refuse(InputProblem::out_of_range, "attention needs q, k and v");
  for (const Array* array : {arrays.q, arrays.k, arrays.v}) require_elements(*array);
  const bool one_head = arrays.q->shape().size() <= 2;
  const auto shape_of = [&](const Array& array) {
    return one_head ? as_one_head(array.shape()) : array.shape();
  };
  const auto q = shape_of(*arrays.q), k = shape_of(*arrays.k), v = shape_of(*arrays.v);
  tensor::AttentionProblem problem;
  problem.layout = tensor::parse_layout(options.layout);
  const std::size_t dims = problem.layout == tensor::Layout::packed ? 3 : 4;
  for (const auto* shape : {&q, &k, &v}) {
    if (shape->size() != dims) {
      refuse(InputProblem::shape_mismatch, "layout " + options.layout + " needs " + std::to_string(dims) +
                                               "-D q, k and v (or 2-D matrices of one head), got " +
                                               std::to_string(shape->size()) + "-D");
    }
  }
  if (problem.layout == tensor::Layout::packed) {
    if (!options.query_lengths.empty() || !options.key_lengths.empty())
      refuse(InputProblem::out_of_range,
             "query_lengths and key_lengths are for the padded layouts; the packed layout's lengths are its "
             "cu_seqlens");
    fill_packed_shape(options, q, k, v, problem);
  } else {
    if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty())
      refuse(
          InputProblem::out_of_range,
          "cu_seqlens_q and cu_seqlens_k are for the packed layout (layout packed), not " + options.layout);
    const bool bshd = problem.layout == tensor::Layout::bshd;
    auto& shape = problem.shape;
    shape = {q[0], q[bshd ? 2 : 1], k[bshd ? 2 : 1], q[bshd ? 1 : 2], k[bshd ? 1 : 2], q[3], v[3]};
    if (k[0] != shape.batch || v[0] != shape.batch || k[3] != shape.head_dim ||
        v[bshd ? 1 : 2] != shape.keys || v[bshd ? 2 : 1] != shape.kv_heads) {
      refuse(InputProblem::shape_mismatch, "q " + shape_text(q) + ", k " + shape_text(k) + " and v " +
                                               shape_text(v) +
                                               " disagree on batch, keys, KV heads or head dim");
    }
    problem.query_lengths = options.query_lengths;
    problem.key_lengths = options.key_lengths;
  }
  problem.scores = options.scores;
  problem.scores.theta = options.theta;
  problem.sinks = arrays.sinks;
  problem.alibi_slopes = arrays.alibi_slopes;
  problem.keep = arrays.keep;
  problem.keep_extent = arrays.keep_extent;
  problem.bias = arrays.bias;
  problem.bias_extent = arrays.bias_extent;
  return problem;
}

CaseOutcome judge_softmax_arrays(const JudgeOptions& options, const Array& logits, const Array& outputs) {
  const StoredFormat output = stored_format(options.format);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = kernel_name(options, outputs);
  require_elements(logits);
  if (logits.shape() != outputs.shape()) {
    refuse(InputProblem::shape_mismatch, outputs.name() + " does not match " + logits.name() + ": " +
                                             shape_text(logits.shape()) + " against " +
                                             shape_text(outputs.shape()));
  }
  const io::NpyLanes lanes = lanes_along_dim(logits, options.dim);
  const std::string default_entry = output.zero_point               ? output.name
                                    : options.default_entry.empty() ? "plugin_softmax"
                                                                    : options.default_entry;
  const auto& tolerance =
      metrics::tolerance_for(options.tolerance_entry.empty() ? default_entry : options.tolerance_entry);
  if (options.log_softmax && options.operation != kernels::Operation::softmax)
    refuse(InputProblem::out_of_range, "log_softmax applies to softmax alone");
  const metrics::JudgeSpec spec{options.operation, output.format, &tolerance};
  std::vector<RowBlock> blocks = plan_blocks(lanes, options.threads);
  parallel_for(blocks.size(), options.threads,
               [&](std::size_t b) { judge_block(options, spec, output, logits, outputs, lanes, blocks[b]); });
  for (const auto& block : blocks) {  // in order: the same report whatever the threads
    outcome.comparison.merge(block.comparison);
    outcome.reference_statistics.merge(block.statistics);
  }
  outcome.gate_case.n = lanes.extent;
  const auto& worst = outcome.comparison.worst;
  outcome.worst_array = outputs.name();
  outcome.worst_index = unravel(lanes.c_index(worst.row, worst.index), outputs.shape());
  if (!outcome.comparison.passed(options.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(options.strictest));
    if (lanes.inner != 1) {
      outcome.failures.push_back("the worst element, lane " + std::to_string(worst.row) + " position " +
                                 std::to_string(worst.index) + " along dim " + std::to_string(options.dim) +
                                 ", is element " + std::to_string(lanes.c_index(worst.row, worst.index)) +
                                 " of the arrays in C order");
    }
  }
  return outcome;
}

namespace {

// One recipe's judgement of the arrays, and how far it is from passing (the larger of the proven
// and statistical ratios, the row-scale test's included).
struct RecipeJudgement {
  const char* name = nullptr;
  std::string summary;
  metrics::TensorJudgement judgement;
  double closeness = 0;
};

double worst_ratio(const metrics::Comparison& c, metrics::Tier strictest) {
  double ratio = c.max_bound_ratio;
  if (strictest == metrics::Tier::statistical)
    ratio = std::max({ratio, c.max_statistical_ratio, c.max_bias_ratio, c.max_row_scale_ratio});
  return c.non_finite > 0 ? INFINITY : ratio;
}

RecipeJudgement judge_under(const JudgeOptions& options, metrics::JudgeSpec spec, const std::string& entry,
                            const tensor::AttentionProblem& problem, const AttentionArrays& arrays,
                            const tensor::TensorSource& out) {
  spec.tolerance = &metrics::tolerance_for(entry);
  RecipeJudgement r;
  r.summary = std::string(spec.tolerance->reason);
  r.judgement = metrics::judge_attention_tensors(spec, problem, *arrays.q, *arrays.k, *arrays.v, out,
                                                 arrays.lse, options.threads);
  r.closeness = worst_ratio(r.judgement.output, options.strictest);
  if (r.judgement.lse) r.closeness = std::max(r.closeness, worst_ratio(*r.judgement.lse, options.strictest));
  return r;
}

// "; name one of a, b to judge by it" for the recipes tried only when named, or nothing.
std::string named_only_clause(const std::string& named_only) {
  return named_only.empty() ? "" : "; name one of " + named_only + " to judge by it";
}

std::string ratio_text(double ratio) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", ratio);
  return text;
}

// A signal stopped the judgement under `entry`: the report keeps what was judged, the closest
// earlier recipe's verdict when one judged every head (it did not fit; the recipes from `entry` on
// are untried), else the heads `entry` finished.
[[noreturn]] void stop_with_what_was_judged(const JudgeOptions& options, const AttentionArrays& arrays,
                                            const tensor::AttentionProblem& problem, const std::string& entry,
                                            const metrics::InterruptedTensorJudgement& stopped,
                                            const std::optional<RecipeJudgement>& closest,
                                            CaseOutcome& outcome) {
  const std::string signal = "interrupted by signal " + std::to_string(stopped.signal_number());
  if (closest) {
    record_attention(options, arrays, problem, closest->judgement, outcome);
    outcome.recipe = closest->name;
    outcome.failures.push_back("fits none of the recipes tried; closest: " + outcome.recipe + " at ratio " +
                               ratio_text(closest->closeness));
    outcome.incomplete = signal + " while trying " + entry + ": the verdict is " + outcome.recipe +
                         "'s, every head judged; " + entry + " and the recipes after it untried";
  } else {
    const metrics::TensorJudgement& partial = stopped.partial();
    record_attention(options, arrays, problem, partial, outcome);
    outcome.recipe = entry;
    outcome.incomplete = signal + " after " + std::to_string(partial.heads_judged) + " of " +
                         std::to_string(partial.heads) + " heads under " + entry +
                         ": the comparison covers those heads alone";
  }
  throw InterruptedJudgement(stopped.signal_number(), std::move(outcome));
}

// For a failing named recipe: the first other recipe the formats allow that the outputs fit, in a line.
std::string other_recipe_line(const JudgeOptions& options, const metrics::JudgeSpec& spec,
                              const tensor::AttentionProblem& problem, const AttentionArrays& arrays,
                              const tensor::TensorSource& out, const FloatFormat& input,
                              const FloatFormat& output, const std::string& named) {
  std::string tried;
  for (const auto* recipe : metrics::default_recipes(input, output, false)) {
    if (recipe->name == named || (arrays.lse != nullptr && recipe->score_roundings > 0)) continue;
    const RecipeJudgement r = judge_under(options, spec, std::string(recipe->name), problem, arrays, out);
    if (r.closeness <= 1 && r.judgement.output.passed(options.strictest) &&
        (!r.judgement.lse || r.judgement.lse->passed(options.strictest)))
      return "the outputs fit the recipe " + std::string(recipe->name) + " (" + r.summary + ")";
    tried += (tried.empty() ? "" : ", ") + std::string(recipe->name);
  }
  return tried.empty() ? "no other recipe fits the formats"
                       : "they fit no other recipe (tried " + tried + ")";
}

// The problem the arrays describe; empty arrays, a non-finite q, k or v, an output's size or shape refused.
tensor::AttentionProblem checked_problem(const JudgeOptions& options, const AttentionArrays& arrays) {
  for (const Array* array : {arrays.q, arrays.k, arrays.v, arrays.out}) require_elements(*array);
  for (const Array* array : {arrays.q, arrays.k, arrays.v}) require_finite(*array);
  tensor::AttentionProblem problem = attention_problem_of(options, arrays);
  if (arrays.out->size() != problem.output_elements()) {
    refuse(InputProblem::shape_mismatch, arrays.out->name() + " holds " + std::to_string(arrays.out->size()) +
                                             " elements, the problem (" + problem.describe() + ") has " +
                                             std::to_string(problem.output_elements()));
  }
  // The same count in another shape (a flattened or permuted output) is refused too: the output
  // is q's shape with v's last dimension, up to axes of extent 1 and the heads and the value
  // dimension merged into one axis (vLLM's [tokens, heads * dim]), which read in the same order.
  std::vector<std::size_t> want = arrays.q->shape();
  if (!want.empty() && !arrays.v->shape().empty()) want.back() = arrays.v->shape().back();
  if (!same_order_shape(arrays.out->shape(), want,
                        want.size() >= 3 && problem.layout != tensor::Layout::bhsd)) {
    refuse(InputProblem::shape_mismatch, arrays.out->name() + " has shape " +
                                             shape_text(arrays.out->shape()) + "; expected " +
                                             shape_text(want) + " (q's shape with v's last dimension)");
  }
  return problem;
}

}  // namespace

CaseOutcome judge_attention_arrays(const JudgeOptions& options, const AttentionArrays& arrays) {
  if (!arrays.q || !arrays.k || !arrays.v || !arrays.out)
    refuse(InputProblem::out_of_range, "attention needs q, k, v and out");
  const StoredFormat output = stored_format(options.format);
  const StoredFormat input = options.input_format.empty() ? output : stored_format(options.input_format);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "arrays";
  outcome.gate_case.kernel = kernel_name(options, *arrays.out);
  const tensor::AttentionProblem problem = checked_problem(options, arrays);
  metrics::JudgeSpec spec{kernels::Operation::attention, output.format, nullptr};
  spec.lse_base2 = options.lse_base2;
  spec.lse_format = stored_format(options.lse_format).format;
  std::vector<std::optional<metrics::KnownReference>> known;  // each head's reference, for every recipe
  spec.known_heads = &known;
  const CheckedOutput out(*arrays.out, output);
  // A named recipe (or kernel entry) is the verdict's; with none, every recipe the formats allow is
  // tried from the tightest, and the first that fits is the verdict's (metrics/recipes.hpp).
  std::vector<std::string> entries;
  if (!options.tolerance_entry.empty()) {
    entries.push_back(options.tolerance_entry == "attention_flash" ? "attention_fp32"
                                                                   : options.tolerance_entry);
    const std::string why = metrics::intermediate_format_mismatch(
        entries[0], metrics::tolerance_for(entries[0]).probability_format, *input.format, *output.format,
        false);
    if (!why.empty()) refuse(InputProblem::out_of_range, why);
  } else {
    for (const auto* recipe :
         metrics::default_forward_recipes(*input.format, *output.format, arrays.lse != nullptr,
                                          options.strictest == metrics::Tier::proven))
      entries.emplace_back(recipe->name);
  }
  std::optional<RecipeJudgement> closest;
  std::string tried;
  for (const std::string& entry : entries) {
    RecipeJudgement r;
    try {
      r = judge_under(options, spec, entry, problem, arrays, out);
    } catch (const metrics::InterruptedTensorJudgement& stopped) {
      stop_with_what_was_judged(options, arrays, problem, entry, stopped, closest, outcome);
    }
    r.name = entry.c_str();
    const bool fits = r.closeness <= 1 && r.judgement.output.passed(options.strictest) &&
                      (!r.judgement.lse || r.judgement.lse->passed(options.strictest));
    if (!closest || r.closeness < closest->closeness || fits) closest = std::move(r);
    tried += (tried.empty() ? "" : ", ") + entry;
    if (fits) break;
  }
  record_attention(options, arrays, problem, closest->judgement, outcome);
  outcome.recipe = closest->name;
  const bool named = !options.tolerance_entry.empty();
  // A recipe that emulates the math path's scores says which way of forming them the output fits.
  const std::string& variant = closest->judgement.score_variant;
  const std::string scores = variant.empty() ? "" : "; scores formed as " + variant;
  if (outcome.passed()) {
    outcome.recipe_note =
        (named ? "pass under " : "pass as ") + outcome.recipe + ": " + closest->summary + scores;
  } else {
    std::string others;
    try {
      if (named)
        others = other_recipe_line(options, spec, problem, arrays, out, *input.format, *output.format,
                                   outcome.recipe);
    } catch (const Interrupted& stopped) {  // the verdict stands; the other recipes were not tried
      outcome.failures.push_back("fails the named recipe " + outcome.recipe + " at ratio " +
                                 ratio_text(closest->closeness));
      outcome.incomplete = "interrupted by signal " + std::to_string(stopped.signal_number()) +
                           " before the other recipes were tried: the verdict is complete";
      throw InterruptedJudgement(stopped.signal_number(), std::move(outcome));
    }
    outcome.recipe_note = named ? "fails the named recipe " + outcome.recipe + " (" + closest->summary +
                                      ") at ratio " + ratio_text(closest->closeness) + "; " + others
                                : "fits no recipe the formats allow (tried " + tried +
                                      named_only_clause(metrics::recipe_names(false, true)) +
                                      "); closest: " + outcome.recipe + " (" + closest->summary +
                                      ") at ratio " + ratio_text(closest->closeness);
    outcome.recipe_note += scores;
    outcome.failures.push_back(outcome.recipe_note);
  }
  return outcome;
}

}  // namespace sharpcheck::gate
