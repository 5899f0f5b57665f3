// The attention problem's options as a schema: layout, masks, modifiers, lengths, the LSE's form.
#include <optional>
#include <vector>

#include "core/errors.hpp"
#include "ops/attention/attention_op.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::ops {
namespace {

using gate::OpOptions;
using gate::OptionKind;

std::optional<std::size_t> window_side(const std::string& text) {
  if (text == "-1") return std::nullopt;
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18)
    throw InputError(InputProblem::out_of_range,
                     "window wants L,R with -1 for unbounded, got '" + text + "'");
  return std::stoull(text);
}

void set_window(OpOptions& o, const std::string& v) {
  const auto comma = v.find(',');
  if (comma == std::string::npos)
    throw InputError(InputProblem::out_of_range, "window takes L,R, got '" + v + "'");
  o.judge.scores.window_left = window_side(v.substr(0, comma));
  o.judge.scores.window_right = window_side(v.substr(comma + 1));
}

void set_choice(const std::string& v, const char* option, std::initializer_list<const char*> choices) {
  std::string listed;
  for (const char* choice : choices) {
    if (v == choice) return;
    listed += (listed.empty() ? "" : " or ") + std::string(choice);
  }
  throw InputError(InputProblem::out_of_range,
                   std::string(option) + " must be " + listed + ", got '" + v + "'");
}

constexpr gate::OptionSpec attention_option_table[] = {
    {.name = "layout",
     .kind = OptionKind::text,
     .default_text = "bhsd",
     .meaning = "bhsd ([B,H,S,D]), bshd ([B,S,H,D]) or packed ([T,H,D]); 2-D tensors are one head",
     .apply =
         [](OpOptions& o, const std::string& v) {
           set_choice(v, "layout", {"bhsd", "bshd", "packed"});
           o.judge.layout = v;
         }},
    {.name = "causal",
     .kind = OptionKind::flag,
     .default_text = "false",
     .meaning = "causal mask, aligned as align says",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.scores.causal = v == "true"; }},
    {.name = "align",
     .kind = OptionKind::text,
     .default_text = "top-left",
     .meaning = "the causal and window diagonal: top-left (SDPA) or bottom-right (FlashAttention)",
     .apply =
         [](OpOptions& o, const std::string& v) {
           set_choice(v, "align", {"top-left", "bottom-right"});
           o.judge.scores.alignment = v == "top-left" ? tensor::DiagonalAlignment::top_left
                                                      : tensor::DiagonalAlignment::bottom_right;
         }},
    {.name = "window",
     .kind = OptionKind::text,
     .default_text = "-1,-1",
     .meaning = "sliding window L,R (-1: unbounded), FlashAttention's window_size",
     .apply = set_window},
    {.name = "scale",
     .kind = OptionKind::real,
     .default_text = "1/sqrt(d), exactly",
     .meaning = "the softmax scale",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.scores.scale = std::stod(v); }},
    {.name = "softcap",
     .kind = OptionKind::real,
     .default_text = "0",
     .meaning = "soft-cap: scores become cap tanh(s / cap) (0: none)",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.scores.softcap = std::stod(v); }},
    {.name = "theta",
     .kind = OptionKind::real,
     .default_text = "1",
     .meaning = "the temperature",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.theta = std::stod(v); }},
    {.name = "fully_masked",
     .kind = OptionKind::text,
     .default_text = "zeros",
     .meaning = "a row that sees no key: zeros or error",
     .apply =
         [](OpOptions& o, const std::string& v) {
           set_choice(v, "fully_masked", {"zeros", "error"});
           o.judge.scores.fully_masked =
               v == "zeros" ? tensor::FullyMaskedRows::zeros : tensor::FullyMaskedRows::error;
         }},
    {.name = "lse_base2",
     .kind = OptionKind::flag,
     .default_text = "false",
     .meaning = "the log-sum-exp is base 2",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.lse_base2 = v == "true"; }},
    {.name = "lse_format",
     .kind = OptionKind::text,
     .default_text = "fp32",
     .meaning = "the log-sum-exp's format",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.lse_format = gate::stored_format(v).name; }},
    {.name = "query_lengths",
     .kind = OptionKind::count_list,
     .default_text = "all",
     .meaning = "valid query rows per batch (padding after)",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.query_lengths = gate::option_counts(v); }},
    {.name = "key_lengths",
     .kind = OptionKind::count_list,
     .default_text = "all",
     .meaning = "valid keys per batch (a key padding mask)",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.key_lengths = gate::option_counts(v); }},
    {.name = "cu_seqlens_q",
     .kind = OptionKind::count_list,
     .default_text = "",
     .meaning = "packed layout: cumulative query lengths 0,...",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.cu_seqlens_q = gate::option_counts(v); }},
    {.name = "cu_seqlens_k",
     .kind = OptionKind::count_list,
     .default_text = "",
     .meaning = "packed layout: cumulative key lengths 0,...",
     .apply = [](OpOptions& o, const std::string& v) { o.judge.cu_seqlens_k = gate::option_counts(v); }},
};

}  // namespace

std::vector<double> head_values(const gate::Array& array) {
  if (array.shape().size() != 1)
    throw InputError(InputProblem::shape_mismatch, array.name() + " must be 1-D: one value per query head");
  if (array.size() == 0) throw InputError(InputProblem::empty_input, array.name() + " holds no value");
  return array.read_lanes(gate::lanes_along_dim(array, -1), 0, 1).values;
}

std::span<const gate::OptionSpec> attention_options() { return attention_option_table; }

std::span<const gate::OptionSpec> attention_backward_options() {
  static const std::vector<gate::OptionSpec> backward = [] {
    std::vector<gate::OptionSpec> kept;
    for (const gate::OptionSpec& option : attention_option_table) {
      if (option.name != "lse_base2" && option.name != "lse_format") kept.push_back(option);
    }
    return kept;
  }();
  return backward;
}

void read_head_values(const gate::OpCall& call, gate::AttentionArrays& arrays) {
  if (const gate::Array* sinks = call.find("sinks")) arrays.sinks = head_values(*sinks);
  if (const gate::Array* slopes = call.find("alibi_slopes")) arrays.alibi_slopes = head_values(*slopes);
}

}  // namespace sharpcheck::ops
