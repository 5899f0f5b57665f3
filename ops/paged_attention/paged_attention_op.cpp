// The paged_attention record (ops/paged_attention/paged_attention_op.hpp): the pages each
// sequence names gathered into attention's packed problem, judged by attention's judge.
#include "ops/paged_attention/paged_attention_op.hpp"

#include <cmath>
#include <memory>

#include "core/errors.hpp"
#include "gate/case_tools.hpp"
#include "ops/attention/attention_op.hpp"
#include "ops/paged_attention/invariance.hpp"
#include "ops/paged_attention/paged_kernels.hpp"

namespace sharpcheck::ops {
namespace {

using gate::OptionKind;
using gate::TensorRole;

constexpr gate::TensorSpec paged_tensors[] = {
    {.name = "q",
     .role = TensorRole::input,
     .shape = "[T, H, D]",
     .meaning = "the query tokens of every sequence, packed (cu_seqlens_q; default one per sequence)"},
    {.name = "k_cache",
     .role = TensorRole::input,
     .shape = "[pages, page, H_kv, D] (NHD) or [pages, H_kv, page, D] (HND)",
     .meaning = "the paged key cache"},
    {.name = "v_cache",
     .role = TensorRole::input,
     .shape = "as k_cache, with the value dim",
     .meaning = "the paged value cache"},
    {.name = "block_table",
     .role = TensorRole::optional_input,
     .shape = "[B, max_pages]",
     .meaning = "vLLM / FlashAttention: each sequence's page ids in order (with seq_lens)",
     .format = "fp64"},
    {.name = "seq_lens",
     .role = TensorRole::optional_input,
     .shape = "[B]",
     .meaning = "vLLM / FlashAttention: each sequence's key count (with block_table)",
     .format = "fp64"},
    {.name = "kv_indptr",
     .role = TensorRole::optional_input,
     .shape = "[B + 1]",
     .meaning = "FlashInfer: where each sequence's page ids start in kv_indices",
     .format = "fp64"},
    {.name = "kv_indices",
     .role = TensorRole::optional_input,
     .shape = "[kv_indptr[B]] or more",
     .meaning = "FlashInfer: the page ids of every sequence, one after another",
     .format = "fp64"},
    {.name = "kv_last_page_len",
     .role = TensorRole::optional_input,
     .shape = "[B]",
     .meaning = "FlashInfer: the slots used in each sequence's last page (1 to page)",
     .format = "fp64"},
    sinks_tensor,
    alibi_slopes_tensor,
    {.name = "out",
     .role = TensorRole::judged,
     .shape = "[T, H, D]",
     .meaning = "the output",
     .format = "format"},
    {.name = "lse",
     .role = TensorRole::optional_judged,
     .shape = "[T, H]",
     .meaning = "the log-sum-exp per token and head (FlashInfer's and vLLM's order)",
     .format = "lse_format"},
};

// Attention's options that a paged problem has (its layout and lengths come from the pages, its
// diagonal is bottom-right), and the page layout.
std::span<const gate::OptionSpec> paged_options() {
  static const std::vector<gate::OptionSpec> options = [] {
    std::vector<gate::OptionSpec> kept{
        {.name = "page_layout",
         .kind = OptionKind::text,
         .default_text = "NHD",
         .meaning = "the caches' page layout: NHD ([pages, page, H_kv, D]) or HND ([pages, H_kv, page, D])",
         .apply = [](gate::OpOptions& o, const std::string& v) {
           if (v != "NHD" && v != "HND")
             throw InputError(InputProblem::out_of_range, "page_layout wants NHD or HND, got '" + v + "'");
           o.judge.layout = v;
         }}};
    for (const gate::OptionSpec& option : attention_options()) {
      for (const std::string_view name : {"causal", "window", "scale", "softcap", "theta", "fully_masked",
                                          "lse_base2", "lse_format", "cu_seqlens_q"}) {
        if (option.name == name) kept.push_back(option);
      }
    }
    return kept;
  }();
  return options;
}

[[noreturn]] void refuse(InputProblem problem, const std::string& what) {
  throw InputError(problem, "paged_attention: " + what);
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

struct Cache {
  std::size_t pages = 0, page = 0, heads = 0, dim = 0;
  bool heads_first = false;  // HND
  // Where slot `slot` of page `id`, head `head` starts (its dim is the last, contiguous axis).
  [[nodiscard]] std::size_t offset(std::size_t id, std::size_t slot, std::size_t head) const {
    return heads_first ? ((id * heads + head) * page + slot) * dim
                       : ((id * page + slot) * heads + head) * dim;
  }
};

Cache cache_of(const gate::Array& array, bool heads_first) {
  const auto& s = array.shape();
  if (s.size() != 4)
    refuse(InputProblem::shape_mismatch,
           array.name() + " must be 4-D " +
               (heads_first ? "[pages, H_kv, page, D]" : "[pages, page, H_kv, D]") + ", got " +
               shape_text(s));
  Cache c{s[0], heads_first ? s[2] : s[1], heads_first ? s[1] : s[2], s[3], heads_first};
  if (c.pages * c.page * c.heads * c.dim == 0)
    refuse(InputProblem::empty_input, array.name() + " holds no element");
  return c;
}

// An index tensor's entry as a count: a finite non-negative integer, else InputError naming it.
std::size_t count_at(const gate::Array& array, std::span<const double> values, std::size_t i) {
  const double x = values[i];
  if (!(x >= 0) || x != std::floor(x) || x > 0x1p52)
    refuse(InputProblem::out_of_range, array.name() + " element " + std::to_string(i) + " is " +
                                           std::to_string(x) +
                                           "; page ids and lengths are non-negative integers");
  return static_cast<std::size_t>(x);
}

struct Sequence {
  std::vector<std::size_t> pages;
  std::size_t keys = 0;
  std::vector<std::string> where;  // each page id's element, for messages ("block_table at [2, 5]")
};

std::vector<Sequence> from_block_table(const gate::OpCall& call, const Cache& cache) {
  const gate::Array& table = call.at("block_table");
  const gate::Array& lengths = call.at("seq_lens");
  if (table.shape().size() != 2 || lengths.shape().size() != 1 || lengths.shape()[0] != table.shape()[0])
    refuse(InputProblem::shape_mismatch, "block_table must be [B, max_pages] and seq_lens [B], got " +
                                             shape_text(table.shape()) + " and " +
                                             shape_text(lengths.shape()));
  const std::size_t batch = table.shape()[0], width = table.shape()[1];
  const std::vector<double> ids = gate::all_values(table), lens = gate::all_values(lengths);
  std::vector<Sequence> sequences(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    Sequence& s = sequences[b];
    s.keys = count_at(lengths, lens, b);
    const std::size_t used = (s.keys + cache.page - 1) / cache.page;
    if (used > width)
      refuse(InputProblem::shape_mismatch, "seq_lens[" + std::to_string(b) + "] = " + std::to_string(s.keys) +
                                               " needs " + std::to_string(used) + " pages of " +
                                               std::to_string(cache.page) + ", block_table has " +
                                               std::to_string(width) + " columns");
    for (std::size_t i = 0; i < used; ++i) {
      s.pages.push_back(count_at(table, ids, b * width + i));
      s.where.push_back("block_table at [" + std::to_string(b) + ", " + std::to_string(i) + "]");
    }
  }
  return sequences;
}

std::vector<Sequence> from_indptr(const gate::OpCall& call, const Cache& cache) {
  const gate::Array& indptr = call.at("kv_indptr");
  const gate::Array& indices = call.at("kv_indices");
  const gate::Array& last = call.at("kv_last_page_len");
  if (indptr.shape().size() != 1 || indptr.shape()[0] < 2 ||
      last.shape() != std::vector{indptr.shape()[0] - 1} || indices.shape().size() != 1)
    refuse(InputProblem::shape_mismatch,
           "kv_indptr must be [B + 1], kv_last_page_len [B] and kv_indices 1-D, got " +
               shape_text(indptr.shape()) + ", " + shape_text(last.shape()) + " and " +
               shape_text(indices.shape()));
  const std::vector<double> ptr = gate::all_values(indptr), ids = gate::all_values(indices),
                            lasts = gate::all_values(last);
  std::vector<Sequence> sequences(ptr.size() - 1);
  for (std::size_t b = 0; b + 1 < ptr.size(); ++b) {
    const std::size_t begin = count_at(indptr, ptr, b), end = count_at(indptr, ptr, b + 1);
    if (end < begin || end > ids.size())
      refuse(InputProblem::out_of_range, "kv_indptr[" + std::to_string(b) + ".." + std::to_string(b + 1) +
                                             "] = " + std::to_string(begin) + ".." + std::to_string(end) +
                                             " is not a range of kv_indices' " + std::to_string(ids.size()));
    Sequence& s = sequences[b];
    for (std::size_t i = begin; i < end; ++i) {
      s.pages.push_back(count_at(indices, ids, i));
      s.where.push_back("kv_indices[" + std::to_string(i) + "]");
    }
    const std::size_t used = count_at(last, lasts, b);
    if (!s.pages.empty() && (used == 0 || used > cache.page))
      refuse(InputProblem::out_of_range, "kv_last_page_len[" + std::to_string(b) +
                                             "] = " + std::to_string(used) + ": a last page holds 1 to " +
                                             std::to_string(cache.page) + " slots");
    s.keys = s.pages.empty() ? 0 : (s.pages.size() - 1) * cache.page + used;
  }
  return sequences;
}

std::vector<Sequence> sequences_of(const gate::OpCall& call, const Cache& cache) {
  const bool table = call.find("block_table") != nullptr || call.find("seq_lens") != nullptr;
  const bool indptr = call.find("kv_indptr") != nullptr || call.find("kv_indices") != nullptr ||
                      call.find("kv_last_page_len") != nullptr;
  if (table == indptr)
    refuse(
        InputProblem::out_of_range,
        std::string(table ? "give one page table, not both: " : "no page table given: give ") +
            "block_table and seq_lens (vLLM, FlashAttention) or kv_indptr, kv_indices and kv_last_page_len "
            "(FlashInfer)");
  std::vector<Sequence> sequences = table ? from_block_table(call, cache) : from_indptr(call, cache);
  for (const Sequence& s : sequences) {
    for (std::size_t i = 0; i < s.pages.size(); ++i) {
      if (s.pages[i] >= cache.pages)
        refuse(InputProblem::out_of_range, s.where[i] + " = " + std::to_string(s.pages[i]) +
                                               ", but the caches hold " + std::to_string(cache.pages) +
                                               " pages");
    }
  }
  return sequences;
}

// Every sequence's keys (or values) in order, packed [N, H_kv, D]; a NaN or infinity in a slot a
// sequence reaches is named by its place in the cache.
std::unique_ptr<gate::MemoryArray> gather(const gate::Array& array, const Cache& cache,
                                          const std::vector<Sequence>& sequences, const char* name) {
  std::size_t total = 0;
  for (const Sequence& s : sequences) total += s.keys;
  std::vector<double> packed(total * cache.heads * cache.dim);
  std::size_t row = 0;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    const Sequence& s = sequences[b];
    for (std::size_t j = 0; j < s.keys; ++j, ++row) {
      const std::size_t id = s.pages[j / cache.page], slot = j % cache.page;
      for (std::size_t h = 0; h < cache.heads; ++h) {
        const std::span<double> out(packed.data() + (row * cache.heads + h) * cache.dim, cache.dim);
        array.read(cache.offset(id, slot, h), out);
        for (std::size_t d = 0; d < cache.dim; ++d) {
          if (std::isfinite(out[d])) continue;
          refuse(std::isnan(out[d]) ? InputProblem::nan_value : InputProblem::non_finite_value,
                 array.name() + " page " + std::to_string(id) + " slot " + std::to_string(slot) + " head " +
                     std::to_string(h) + " dim " + std::to_string(d) + " (sequence " + std::to_string(b) +
                     ", key " + std::to_string(j) + ") is " + (std::isnan(out[d]) ? "NaN" : "infinite"));
        }
      }
    }
  }
  return std::make_unique<gate::MemoryArray>(name, std::vector<std::size_t>{total, cache.heads, cache.dim},
                                             std::move(packed));
}

// The judged LSE [T, H] in the packed problem's [H, T] order.
std::unique_ptr<gate::MemoryArray> transposed_lse(const gate::Array& lse, std::size_t tokens,
                                                  std::size_t heads) {
  if (lse.shape() != std::vector<std::size_t>{tokens, heads})
    refuse(InputProblem::shape_mismatch,
           "lse must be " + shape_text({tokens, heads}) + " [T, H], got " + shape_text(lse.shape()));
  const std::vector<double> given = gate::all_values(lse);
  std::vector<double> values(given.size());
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) values[h * tokens + t] = given[t * heads + h];
  }
  return std::make_unique<gate::MemoryArray>("lse", std::vector<std::size_t>{heads, tokens},
                                             std::move(values));
}

std::vector<std::size_t> query_offsets(const gate::OpCall& call, std::size_t sequences) {
  const gate::Array& q = call.at("q");
  if (q.shape().size() != 3)
    refuse(InputProblem::shape_mismatch, "q must be [T, H, D], got " + shape_text(q.shape()));
  std::vector<std::size_t> offsets = call.options.judge.cu_seqlens_q;
  if (offsets.empty()) {
    if (q.shape()[0] != sequences)
      refuse(InputProblem::shape_mismatch,
             "q holds " + std::to_string(q.shape()[0]) + " tokens for " + std::to_string(sequences) +
                 " sequences: give cu_seqlens_q (one query per sequence is the default)");
    for (std::size_t b = 0; b <= sequences; ++b) offsets.push_back(b);
  }
  if (offsets.size() != sequences + 1)
    refuse(InputProblem::shape_mismatch, "cu_seqlens_q has " + std::to_string(offsets.size()) +
                                             " offsets for " + std::to_string(sequences) +
                                             " sequences (wants B + 1)");
  return offsets;
}

gate::CaseOutcome judge_paged(const gate::OpCall& call) {
  gate::JudgeOptions options = call.options.judge;
  const bool heads_first = options.layout == "HND";
  const Cache keys = cache_of(call.at("k_cache"), heads_first);
  const Cache values = cache_of(call.at("v_cache"), heads_first);
  if (values.pages != keys.pages || values.page != keys.page || values.heads != keys.heads)
    refuse(InputProblem::shape_mismatch, "v_cache " + shape_text(call.at("v_cache").shape()) +
                                             " and k_cache " + shape_text(call.at("k_cache").shape()) +
                                             " differ in pages, page size or heads");
  const std::vector<Sequence> sequences = sequences_of(call, keys);
  options.cu_seqlens_q = query_offsets(call, sequences.size());
  options.cu_seqlens_k = {0};
  for (const Sequence& s : sequences) options.cu_seqlens_k.push_back(options.cu_seqlens_k.back() + s.keys);
  const auto k = gather(call.at("k_cache"), keys, sequences, "k");
  const auto v = gather(call.at("v_cache"), values, sequences, "v");
  const gate::Array& q = call.at("q");
  std::unique_ptr<gate::MemoryArray> lse;
  if (const gate::Array* given = call.find("lse")) lse = transposed_lse(*given, q.shape()[0], q.shape()[1]);
  gate::AttentionArrays arrays;
  arrays.q = &q;
  arrays.k = k.get();
  arrays.v = v.get();
  arrays.out = &call.at("out");
  arrays.lse = lse.get();
  read_head_values(call, arrays);
  options.layout = "packed";
  options.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  const auto in_user_order = [](gate::CaseOutcome& outcome) {
    if (outcome.worst_array == "lse" && outcome.worst_index.size() == 2)
      std::swap(outcome.worst_index[0], outcome.worst_index[1]);  // the user's [T, H]
  };
  gate::CaseOutcome outcome;
  try {
    outcome = gate::judge_attention_arrays(options, arrays);
  } catch (const gate::InterruptedJudgement& stopped) {  // its partial outcome in the user's order too
    gate::CaseOutcome partial = stopped.partial();
    in_user_order(partial);
    throw gate::InterruptedJudgement(stopped.signal_number(), std::move(partial));
  }
  in_user_order(outcome);
  return outcome;
}

// The gate's cases: every built-in paged kernel on every scenario (paged_kernels.hpp), the
// input named "paged_" + the scenario and n its keys in all.
constexpr std::string_view input_prefix = "paged_";

void plan_builtin(const gate::PlanContext& context, std::vector<gate::GateCase>& cases) {
  for (const paged::Kernel& kernel : paged::kernels()) {
    if (!context.wanted(kernel.name)) continue;
    for (const paged::Scenario& scenario : paged::scenarios()) {
      cases.push_back(gate::make_case(
          std::string(kernel.name), std::string(input_prefix) + std::string(scenario.name),
          paged::total_keys(scenario), context.settings, kernel.deliberately_broken, nullptr));
    }
  }
}

// A built-in paged kernel's output and LSE judged as arrays handed over are.
gate::CaseOutcome judge_output(const paged::Kernel& kernel, const paged::Scenario& layout,
                               const paged::Problem& problem, const paged::Outputs& outputs) {
  gate::OpCall call;
  call.tensors = {{"q", problem.q.get()},
                  {"k_cache", problem.k_cache.get()},
                  {"v_cache", problem.v_cache.get()},
                  {"out", outputs.out.get()},
                  {"lse", outputs.lse.get()}};
  for (const auto& table : problem.tables) call.tensors[table->name()] = table.get();
  gate::JudgeOptions& options = call.options.judge;
  options.format = options.input_format = "bf16";
  options.layout = layout.heads_first ? "HND" : "NHD";
  options.scores.causal = layout.causal;
  options.cu_seqlens_q = problem.query_offsets;
  options.threads = 1;  // the gate runs cases side by side
  options.name = std::string(kernel.name);
  return judge_paged(call);
}

// Runs a built-in paged kernel on its scenario and judges it; an invariance scenario reruns its
// requests in other batches (paged/invariance.hpp).
void run_case(const gate::GateCase& gate_case, const gate::GateSettings&, gate::CaseOutcome& outcome) {
  const paged::Kernel& kernel = *paged::find_kernel(gate_case.kernel);
  const paged::Scenario& scenario = *paged::find_scenario(gate_case.input.substr(input_prefix.size()));
  if (scenario.invariance) {
    paged::judge_invariance(
        kernel, scenario, gate_case.seed,
        [&kernel](const paged::Scenario& layout, const paged::Problem& problem,
                  const paged::Outputs& outputs) { return judge_output(kernel, layout, problem, outputs); },
        outcome);
    return;
  }
  const paged::Problem problem = paged::make_problem(scenario, gate_case.seed);
  gate::adopt_judgement(judge_output(kernel, scenario, problem, paged::run(kernel, scenario, problem)),
                        outcome);
}

std::vector<gate::KernelRow> kernel_rows() {
  return gate::kernel_rows_of(paged::kernels(), [](const paged::Kernel&) { return true; });
}

}  // namespace

const gate::Operation paged_attention_operation{
    .name = "paged_attention",
    .summary = "attention over a paged KV cache (block table or FlashInfer's indptr form, NHD or HND)",
    .tensors = paged_tensors,
    .options = paged_options(),
    .allowance = "attention's precision recipes (metrics/recipes.hpp) on the gathered problem",
    .plugin_entry = {},
    .kernels = kernel_rows,
    .plan_builtin = plan_builtin,
    .plan_plugin = nullptr,
    .run = run_case,
    .judge = judge_paged,
    .external_cases = paged::external_cases,
};

}  // namespace sharpcheck::ops
