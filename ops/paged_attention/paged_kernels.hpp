// The gate's paged_attention cases: serving problems over a paged KV cache as serving kernels meet
// them (scrambled physical pages, page ids above 65,535, NaN in every slot no sequence reaches,
// page sizes 1 to 256, decode, speculative decode and chunked prefill, both page-table forms,
// NHD and HND, and a batch-invariance scenario: ops/paged_attention/invariance.hpp), and built-in
// paged kernels to run on them: FlashAttention 2/3's bf16 loop (kernels/attention_designs.hpp)
// over the keys it reads from the pages, FlashDecoding's split-KV (fp32 partials merged in fp32)
// with a fixed split size, and twins carrying the bugs serving kernels shipped: three paged-cache
// bugs and a split count taken from the batch (accurate, but not batch-invariant). Internal to
// ops/paged_attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/float_format.hpp"
#include "gate/judge_arrays.hpp"
#include "gate/operation.hpp"

namespace sharpcheck::ops::paged {

enum class Bug {
  none,
  block_ids_16_bit,    // page ids truncated to 16 bits (silent corruption above 65,535)
  last_page_short,     // the last page's length off by one: the sequence's last key dropped
  reads_past_the_end,  // one slot past the sequence's last (the page's tail or the table's next column)
  // split-KV only: FlashAttention's num_splits heuristic (fill 132 SMs with batch x heads x splits),
  // so a request's splits, and its bits, change with what else is in the batch
  split_count_from_batch,
  // split-KV only: a path chosen by batch bucket, as serving kernels choose them: from 16 requests on,
  // the merged log-sum-exp is taken in base 2 and converted, (m log2 e + log2 sum) ln 2, as
  // FlashInfer's kernels keep it. Accurate both ways and the output is unchanged, but a request's
  // LSE bits change with the batch it joins.
  lse_path_from_batch,
};

struct Kernel {
  std::string_view name, description;
  Bug bug = Bug::none;
  bool deliberately_broken = false;
  const FloatFormat* format = &bf16;  // its tensors' (the arithmetic is fp32)
  // 0: one flash loop over each sequence's keys; otherwise FlashDecoding's split-KV with splits of
  // this many keys (each split's fp32 output and LSE merged in fp32, as vLLM's merge_attn_states)
  std::size_t split_keys = 0;
};
[[nodiscard]] std::span<const Kernel> kernels();
[[nodiscard]] const Kernel* find_kernel(std::string_view name);

struct Scenario {
  std::string_view name;
  std::span<const std::size_t> keys;     // per sequence
  std::span<const std::size_t> queries;  // per sequence, its last ones
  std::size_t page = 16;
  bool heads_first = false;  // HND
  bool indptr_form = false;  // FlashInfer's kv_indptr / kv_indices / kv_last_page_len
  bool high_ids = false;     // every page id above 65,535
  bool causal = false;
  // The batch-invariance case (invariance.hpp): the sequences are requests, rerun in other batches.
  bool invariance = false;
};
[[nodiscard]] std::span<const Scenario> scenarios();
[[nodiscard]] const Scenario* find_scenario(std::string_view name);
[[nodiscard]] std::size_t total_keys(const Scenario& scenario);

// A cache of `pages` pages that holds only the pages written; every other element reads as NaN,
// so a cache with ids above 65,535 costs only the pages used.
class PoisonedCache final : public gate::Array {
 public:
  PoisonedCache(std::string name, std::vector<std::size_t> shape);
  [[nodiscard]] std::size_t size() const override { return shape_[0] * per_page_; }
  void read(std::size_t first, std::span<double> out) const override;
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return shape_; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  // Page `id`'s elements (in the page's own order), NaN where not written.
  std::vector<double>& page(std::size_t id);

 private:
  std::string name_;
  std::vector<std::size_t> shape_;
  std::size_t per_page_ = 0;
  std::unordered_map<std::size_t, std::vector<double>> pages_;
};

// One sequence's values as its caller holds them: keys and values [keys, H_kv, D] and its
// queries [queries, H, D], row-major.
struct Request {
  std::size_t keys = 0, queries = 1;
  std::vector<double> k, v, q;
};

// One scenario's inputs (bf16 values): the arrays a judge reads by name, and each sequence's row
// of page ids as a kernel reads them (the used pages, then a column holding an unreferenced page).
struct Problem {
  std::size_t heads = 4, kv_heads = 2, dim = 64;
  std::unique_ptr<gate::MemoryArray> q;
  std::unique_ptr<PoisonedCache> k_cache, v_cache;
  std::vector<std::unique_ptr<gate::MemoryArray>> tables;  // block_table, seq_lens or the indptr form
  std::vector<std::vector<std::size_t>> page_rows;
  std::vector<std::size_t> keys;           // per sequence
  std::vector<std::size_t> query_offsets;  // cu_seqlens_q
};
// Values of `format` (the gate's built-in kernels run in bf16).
[[nodiscard]] Problem make_problem(const Scenario& scenario, std::uint64_t seed,
                                   const FloatFormat& format = bf16);
// Values of `format` for one request of `keys` keys and `queries` queries, drawn from `seed` alone
// (the same request whatever batch it joins).
[[nodiscard]] Request make_request(std::size_t keys, std::size_t queries, std::uint64_t seed,
                                   const FloatFormat& format = bf16);
// The requests in a paged cache laid out as `layout` says (its page size, NHD or HND, table form,
// ids above 65,535), their pages scrambled by `seed`; the scenario's keys and queries are ignored.
[[nodiscard]] Problem pack_requests(std::span<const Request> requests, const Scenario& layout,
                                    std::uint64_t seed);

// A kernel's results: the output [T, H, D] in bf16 and the log-sum-exp [T, H] in fp32 (natural
// log; -inf for a query that sees no key), as FlashInfer and vLLM return them.
struct Outputs {
  std::unique_ptr<gate::MemoryArray> out, lse;
};
// Runs the kernel (the scenario gives the page layout and the mask; the sequences are the problem's).
[[nodiscard]] Outputs run(const Kernel& kernel, const Scenario& scenario, const Problem& problem);

// The scenarios as cases for a kernel outside the gate (sharpcheck.sweep, a plugin's sharpcheck_op):
// the caches in full (NaN where no sequence reaches), the tables as int64; those whose caches
// exceed 2^24 elements (ids above 65,535 over pages of 16) stay the gate's own.
[[nodiscard]] std::vector<gate::ExternalCase> external_cases(const gate::ExternalSweep& sweep);

}  // namespace sharpcheck::ops::paged
