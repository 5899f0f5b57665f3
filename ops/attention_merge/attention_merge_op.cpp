// The attention_merge record (ops/attention_merge/attention_merge_op.hpp): the partial states
// re-expressed as a one-query attention problem per (token, head), judged by attention's judge.
#include "ops/attention_merge/attention_merge_op.hpp"

#include <cmath>
#include <memory>
#include <numbers>

#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "ops/attention_merge/merge_kernels.hpp"

namespace sharpcheck::ops {
namespace {

using gate::OptionKind;
using gate::TensorRole;

constexpr gate::TensorSpec merge_tensors[] = {
    {.name = "partial_out",
     .role = TensorRole::input,
     .shape = "[T, S, H, D] (layout tshd) or [S, T, H, D] (sthd)",
     .meaning = "the S partial outputs of each token and head (an empty partial's are ignored)"},
    {.name = "partial_lse",
     .role = TensorRole::input,
     .shape = "[T, S, H] (tshd) or [S, T, H] (sthd)",
     .meaning = "the partials' log-sum-exps (base e, or 2 with lse_base2); -inf marks an empty partial",
     .format = "fp64"},
    {.name = "out",
     .role = TensorRole::judged,
     .shape = "[T, H, D]",
     .meaning = "the merged output",
     .format = "format"},
    {.name = "lse",
     .role = TensorRole::optional_judged,
     .shape = "[T, H]",
     .meaning = "the merged log-sum-exp",
     .format = "lse_format"},
};

constexpr gate::OptionSpec merge_options[] = {
    {.name = "layout",
     .kind = OptionKind::text,
     .default_text = "tshd",
     .meaning = "the partials' order: tshd (FlashInfer's merge_states) or sthd (splits first)",
     .apply =
         [](gate::OpOptions& o, const std::string& v) {
           if (v != "tshd" && v != "sthd")
             throw InputError(InputProblem::out_of_range, "layout wants tshd or sthd, got '" + v + "'");
           o.judge.layout = v;
         }},
    {.name = "lse_base2",
     .kind = OptionKind::flag,
     .default_text = "false",
     .meaning = "the partial and merged LSEs are base 2 (FlashInfer)",
     .apply = [](gate::OpOptions& o, const std::string& v) { o.judge.lse_base2 = v == "true"; }},
    {.name = "empty",
     .kind = OptionKind::text,
     .default_text = "neg_inf",
     .meaning = "what marks an empty partial: neg_inf (-inf; +inf is refused) or any_inf (vLLM: either)",
     .apply =
         [](gate::OpOptions& o, const std::string& v) {
           if (v != "neg_inf" && v != "any_inf")
             throw InputError(InputProblem::out_of_range, "empty wants neg_inf or any_inf, got '" + v + "'");
           o.merge_any_infinity_is_empty = v == "any_inf";
         }},
    {.name = "lse_format",
     .kind = OptionKind::text,
     .default_text = "fp32",
     .meaning = "the merged LSE's storage format (fp32, or bf16/fp16 judged in it)",
     .apply = [](gate::OpOptions& o, const std::string& v) { o.judge.lse_format = v; }},
};

// A user's array seen with another shape of the same C order (out [T, H, D] as bshd [T, 1, H, D]).
class ReshapedArray final : public gate::Array {
 public:
  ReshapedArray(const gate::Array& array, std::vector<std::size_t> shape)
      : array_(array), shape_(std::move(shape)) {}
  [[nodiscard]] std::size_t size() const override { return array_.size(); }
  void read(std::size_t first, std::span<double> out) const override { array_.read(first, out); }
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return shape_; }
  [[nodiscard]] const std::string& name() const override { return array_.name(); }

 private:
  const gate::Array& array_;
  std::vector<std::size_t> shape_;
};

struct MergeShape {
  std::size_t tokens = 0, splits = 0, heads = 0, dim = 0;
};

[[noreturn]] void refuse(const std::string& what) {
  throw InputError(InputProblem::shape_mismatch, "attention_merge: " + what);
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

MergeShape shape_of(const gate::OpCall& call, bool splits_first) {
  const auto& o = call.at("partial_out").shape();
  const auto& l = call.at("partial_lse").shape();
  if (o.size() != 4)
    refuse("partial_out must be 4-D " + std::string(splits_first ? "[S, T, H, D]" : "[T, S, H, D]") +
           ", got " + shape_text(o));
  MergeShape s{splits_first ? o[1] : o[0], splits_first ? o[0] : o[1], o[2], o[3]};
  if (l != std::vector<std::size_t>{o[0], o[1], o[2]})
    refuse("partial_lse must be " + shape_text({o[0], o[1], o[2]}) +
           " (partial_out's less its last axis), got " + shape_text(l));
  if (call.at("out").shape() != std::vector<std::size_t>{s.tokens, s.heads, s.dim})
    refuse("out must be " + shape_text({s.tokens, s.heads, s.dim}) + " [T, H, D], got " +
           shape_text(call.at("out").shape()));
  if (const gate::Array* lse = call.find("lse");
      lse != nullptr && lse->shape() != std::vector<std::size_t>{s.tokens, s.heads})
    refuse("lse must be " + shape_text({s.tokens, s.heads}) + " [T, H], got " + shape_text(lse->shape()));
  if (s.tokens * s.splits * s.heads * s.dim == 0) refuse("the partial states hold no element");
  return s;
}

// The one-query problem: q = 1 (d = 1), k_j = lse_j (0 where empty, masked), v_j = o_j (0 where
// empty), in bshd with batch = tokens, seq_q = 1, seq_k = splits; keep [T, H, 1, S].
struct OneQueryProblem {
  std::unique_ptr<gate::MemoryArray> k, v;
  std::vector<std::uint8_t> keep;
};

struct MergeConvention {
  bool splits_first = false;
  bool any_infinity_is_empty = false;
};

// "partial_lse at [t, s, h]" in the user's own order.
std::string lse_element(const MergeConvention& c, std::size_t t, std::size_t j, std::size_t h) {
  const std::size_t first = c.splits_first ? j : t, second = c.splits_first ? t : j;
  return "partial_lse at [" + std::to_string(first) + ", " + std::to_string(second) + ", " +
         std::to_string(h) + "]";
}

// "[t, s, h, d]" of partial_out in the user's own order.
std::string partial_element(const MergeConvention& c, std::size_t t, std::size_t j, std::size_t h,
                            std::size_t d) {
  const std::size_t first = c.splits_first ? j : t, second = c.splits_first ? t : j;
  return "[" + std::to_string(first) + ", " + std::to_string(second) + ", " + std::to_string(h) + ", " +
         std::to_string(d) + "]";
}

OneQueryProblem one_query_problem(const gate::OpCall& call, const MergeShape& s, const MergeConvention& c) {
  const std::vector<double> lse = gate::all_values(call.at("partial_lse"));
  const std::vector<double> out = gate::all_values(call.at("partial_out"));
  std::vector<double> k(s.tokens * s.splits * s.heads), v(s.tokens * s.splits * s.heads * s.dim);
  std::vector<std::uint8_t> keep(s.tokens * s.heads * s.splits, 1);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (std::size_t j = 0; j < s.splits; ++j) {
      for (std::size_t h = 0; h < s.heads; ++h) {
        const std::size_t from = ((c.splits_first ? j * s.tokens + t : t * s.splits + j) * s.heads) + h;
        const std::size_t to = (t * s.splits + j) * s.heads + h;  // bshd [T, S, H, .]
        const double x = lse[from];
        if (std::isnan(x))
          throw InputError(InputProblem::nan_value,
                           "attention_merge: " + lse_element(c, t, j, h) + " is NaN");
        if (x == INFINITY && !c.any_infinity_is_empty)
          throw InputError(InputProblem::positive_infinity,
                           "attention_merge: " + lse_element(c, t, j, h) +
                               " is +inf; give empty=any_inf if +inf marks an empty partial (vLLM)");
        const bool empty = std::isinf(x);
        keep[(t * s.heads + h) * s.splits + j] = empty ? 0 : 1;
        k[to] = empty ? 0 : x;
        for (std::size_t d = 0; d < s.dim; ++d) {
          const double o = out[from * s.dim + d];
          if (!empty && !std::isfinite(o))  // named here, in the user's order, not the one-query view's
            throw InputError(std::isnan(o) ? InputProblem::nan_value : InputProblem::non_finite_value,
                             "attention_merge: partial_out at " + partial_element(c, t, j, h, d) +
                                 (std::isnan(o) ? " is NaN" : " is infinite") +
                                 " in a partial that is not empty");
          v[to * s.dim + d] = empty ? 0 : o;
        }
      }
    }
  }
  return {std::make_unique<gate::MemoryArray>(
              "partial_lse", std::vector<std::size_t>{s.tokens, s.splits, s.heads, 1}, std::move(k)),
          std::make_unique<gate::MemoryArray>(
              "partial_out", std::vector<std::size_t>{s.tokens, s.splits, s.heads, s.dim}, std::move(v)),
          std::move(keep)};
}

gate::CaseOutcome judge_merge(const gate::OpCall& call) {
  gate::JudgeOptions options = call.options.judge;
  const MergeConvention c{.splits_first = options.layout == "sthd",
                          .any_infinity_is_empty = call.options.merge_any_infinity_is_empty};
  const MergeShape s = shape_of(call, c.splits_first);
  OneQueryProblem p = one_query_problem(call, s, c);
  const gate::MemoryArray q("q", {s.tokens, 1, s.heads, 1}, std::vector<double>(s.tokens * s.heads, 1.0));
  const ReshapedArray out(call.at("out"), {s.tokens, 1, s.heads, s.dim});
  std::unique_ptr<ReshapedArray> lse;
  if (const gate::Array* given = call.find("lse"))
    lse = std::make_unique<ReshapedArray>(*given, std::vector<std::size_t>{s.tokens, s.heads, 1});
  gate::AttentionArrays arrays;
  arrays.q = &q;
  arrays.k = p.k.get();
  arrays.v = p.v.get();
  arrays.out = &out;
  arrays.lse = lse.get();
  arrays.keep = p.keep;
  arrays.keep_extent = {.per_batch = true, .per_head = true};
  options.layout = "bshd";
  // Base 2: the scores are lse_i ln 2, the real ln 2 in the reference (scale_is_ln2), ln 2 rounded
  // to a double in the allowances (within 2^-53 of it relatively).
  options.scores.scale = options.lse_base2 ? std::numbers::ln2 : 1.0;
  options.scores.scale_is_ln2 = options.lse_base2;
  options.scores.fully_masked = tensor::FullyMaskedRows::zeros;  // every partial empty: o = 0
  options.input_format = "fp64";  // the partials were read in their own format already
  if (options.tolerance_entry.empty()) options.tolerance_entry = "attention_fp32";
  // The worst element's index in the user's [T, H, D] out or [T, H] lse, not the one-query view's
  // (the attention judge names them "out" and "lse", whatever the arrays are called); also in the
  // partial outcome of an interrupted judgement.
  const auto in_user_order = [&lse](gate::CaseOutcome& outcome) {
    auto& index = outcome.worst_index;
    if (index.size() == 4 && outcome.worst_array == "out") index.erase(index.begin() + 1);
    if (index.size() == 3 && lse != nullptr && outcome.worst_array == "lse") index.pop_back();
  };
  gate::CaseOutcome outcome;
  try {
    outcome = gate::judge_attention_arrays(options, arrays);
  } catch (const gate::InterruptedJudgement& stopped) {
    gate::CaseOutcome partial = stopped.partial();
    in_user_order(partial);
    throw gate::InterruptedJudgement(stopped.signal_number(), std::move(partial));
  }
  in_user_order(outcome);
  return outcome;
}

}  // namespace

const gate::Operation attention_merge_operation{
    .name = "attention_merge",
    .summary = "the merge of S partial attention states: sum_i exp(lse_i - L) o_i, L = logsumexp lse_i",
    .tensors = merge_tensors,
    .options = merge_options,
    .allowance = "the attention_fp32 recipe (metrics/recipes.hpp) of the one-query attention the merge is",
    .plugin_entry = {},
    .kernels = merge::kernel_rows,
    .plan_builtin = merge::plan_builtin,
    .plan_plugin = nullptr,
    .run = merge::run_case,
    .judge = judge_merge,
    .external_cases = merge_external_cases,
};

}  // namespace sharpcheck::ops
