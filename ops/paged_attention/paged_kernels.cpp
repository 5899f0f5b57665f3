#include "ops/paged_attention/paged_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "core/random.hpp"
#include "formats/float_format.hpp"
#include "gate/case_tools.hpp"
#include "kernels/attention_designs.hpp"
#include "ops/paged_attention/invariance.hpp"

namespace sharpcheck::ops::paged {
namespace {

constexpr Kernel kernel_table[] = {
    {.name = "paged_flash2_bf16",
     .description =
         "FlashAttention 2/3's bf16 loop over the keys read from a paged cache (either table form)"},
    {.name = "paged_flash2_bf16_block_ids_16_bit",
     .description = "broken: page ids truncated to 16 bits (silent KV corruption above 65,535)",
     .bug = Bug::block_ids_16_bit,
     .deliberately_broken = true},
    {.name = "paged_flash2_bf16_last_page_short",
     .description = "broken: the last page's length off by one (the sequence's last key dropped)",
     .bug = Bug::last_page_short,
     .deliberately_broken = true},
    {.name = "paged_flash2_bf16_reads_past_the_end",
     .description = "broken: reads one slot past the sequence (the page's tail or the table's next column)",
     .bug = Bug::reads_past_the_end,
     .deliberately_broken = true},
    {.name = "paged_split_kv_bf16",
     .description =
         "FlashDecoding's split-KV over the pages: splits of 128 keys, fp32 partials merged in fp32 "
         "(batch-invariant: the split size is fixed)",
     .split_keys = 128},
    {.name = "paged_split_kv_bf16_split_count_from_batch",
     .description = "broken: the split count from FlashAttention's heuristic over batch x heads (accurate, "
                    "but a request's bits change with the batch it joins)",
     .bug = Bug::split_count_from_batch,
     .deliberately_broken = true},
    {.name = "paged_split_kv_bf16_lse_path_from_batch",
     .description =
         "broken: from 16 requests on, the merged LSE is taken in base 2 and converted (accurate, and "
         "the output is unchanged, but a request's LSE bits change with the batch it joins)",
     .bug = Bug::lse_path_from_batch,
     .deliberately_broken = true,
     .split_keys = 128},
};

constexpr std::size_t decode_keys[] = {1, 37, 130, 300};
constexpr std::size_t decode_queries[] = {1, 1, 1, 1};
constexpr std::size_t single_page_keys[] = {5, 64, 33};
constexpr std::size_t single_page_queries[] = {1, 1, 1};
constexpr std::size_t speculative_keys[] = {300, 17, 129};
constexpr std::size_t speculative_queries[] = {4, 2, 8};
constexpr std::size_t prefill_keys[] = {200, 90};
constexpr std::size_t prefill_queries[] = {64, 30};
// Requests of mixed lengths, a few speculative: the pool the batch-invariance case regroups.
constexpr std::size_t invariance_keys[] = {1,   37, 130, 300, 64, 513, 7, 200, 129,
                                           256, 90, 17,  700, 33, 128, 5, 420};
constexpr std::size_t invariance_queries[] = {1, 1, 4, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 8, 1, 1};

constexpr Scenario scenario_table[] = {
    {.name = "decode_nhd_page16_ids_above_65535",
     .keys = decode_keys,
     .queries = decode_queries,
     .page = 16,
     .high_ids = true},
    {.name = "decode_hnd_page1_indptr_ids_above_65535",
     .keys = single_page_keys,
     .queries = single_page_queries,
     .page = 1,
     .heads_first = true,
     .indptr_form = true,
     .high_ids = true},
    {.name = "speculative_decode_nhd_page256_causal",
     .keys = speculative_keys,
     .queries = speculative_queries,
     .page = 256,
     .causal = true},
    {.name = "chunked_prefill_hnd_page64_indptr_causal",
     .keys = prefill_keys,
     .queries = prefill_queries,
     .page = 64,
     .heads_first = true,
     .indptr_form = true,
     .causal = true},
    {.name = "invariance_17_requests_decode_and_speculative",
     .keys = invariance_keys,
     .queries = invariance_queries,
     .page = 16,
     .causal = true,
     .invariance = true},
};

constexpr kernels::AttentionDesign flash_bf16{.input = &bf16, .output = &bf16};

std::size_t pages_for(std::size_t keys, std::size_t page) { return (keys + page - 1) / page; }

// Where (slot, head) of a page starts within the page, in the cache's layout.
std::size_t within_page(const Scenario& s, const Problem& p, std::size_t slot, std::size_t head) {
  return s.heads_first ? (head * s.page + slot) * p.dim : (slot * p.kv_heads + head) * p.dim;
}

std::unique_ptr<gate::MemoryArray> integers(const char* name, const std::vector<std::size_t>& values) {
  std::vector<double> doubles(values.begin(), values.end());
  return std::make_unique<gate::MemoryArray>(name, std::vector<std::size_t>{values.size()},
                                             std::move(doubles));
}

void add_tables(const Scenario& s, Problem& p) {
  const std::size_t batch = p.keys.size();
  if (!s.indptr_form) {
    std::size_t width = 0;
    for (const auto& row : p.page_rows) width = std::max(width, row.size());
    std::vector<double> table(batch * width, static_cast<double>(p.page_rows[0].back()));
    for (std::size_t b = 0; b < batch; ++b)
      std::copy(p.page_rows[b].begin(), p.page_rows[b].end(),
                table.begin() + static_cast<std::ptrdiff_t>(b * width));
    p.tables.push_back(std::make_unique<gate::MemoryArray>(
        "block_table", std::vector<std::size_t>{batch, width}, std::move(table)));
    p.tables.push_back(integers("seq_lens", p.keys));
    return;
  }
  std::vector<std::size_t> indptr{0}, indices, last;
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t used = pages_for(p.keys[b], s.page);
    indices.insert(indices.end(), p.page_rows[b].begin(),
                   p.page_rows[b].begin() + static_cast<std::ptrdiff_t>(used));
    indptr.push_back(indices.size());
    last.push_back(p.keys[b] - (used - 1) * s.page);
  }
  p.tables.push_back(integers("kv_indptr", indptr));
  p.tables.push_back(integers("kv_indices", indices));
  p.tables.push_back(integers("kv_last_page_len", last));
}

}  // namespace

std::span<const Kernel> kernels() { return kernel_table; }

const Kernel* find_kernel(std::string_view name) {
  for (const Kernel& k : kernel_table) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::span<const Scenario> scenarios() { return scenario_table; }

const Scenario* find_scenario(std::string_view name) {
  for (const Scenario& s : scenario_table) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::size_t total_keys(const Scenario& scenario) {
  return std::accumulate(scenario.keys.begin(), scenario.keys.end(), std::size_t{0});
}

PoisonedCache::PoisonedCache(std::string name, std::vector<std::size_t> shape)
    : name_(std::move(name)), shape_(std::move(shape)), per_page_(shape_[1] * shape_[2] * shape_[3]) {}

void PoisonedCache::read(std::size_t first, std::span<double> out) const {
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t at = first + i;
    const auto found = pages_.find(at / per_page_);
    out[i] = found == pages_.end() ? std::numeric_limits<double>::quiet_NaN() : found->second[at % per_page_];
  }
}

std::vector<double>& PoisonedCache::page(std::size_t id) {
  auto [found, added] = pages_.try_emplace(id);
  if (added) found->second.assign(per_page_, std::numeric_limits<double>::quiet_NaN());
  return found->second;
}

namespace {

// Page ids drawn without repeats from [low, low + used + 8), low = 65,536 when asked (the cache
// then has that many pages more, never written); the last id is used by no sequence.
std::vector<std::size_t> scrambled_ids(const Scenario& layout, std::span<const std::size_t> keys,
                                       DeterministicRandom& random) {
  std::size_t used_total = 0;
  for (const std::size_t n : keys) used_total += pages_for(n, layout.page);
  const std::size_t low = layout.high_ids ? 65'536 : 0;
  std::vector<std::size_t> ids(used_total + 8);
  std::iota(ids.begin(), ids.end(), low);
  for (std::size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[random.below(i)]);
  return ids;
}

// The requests written into pages `ids` names in turn; each sequence's row of ids ends with the
// last id, which no sequence uses (what a read past its pages finds).
Problem place(std::span<const Request> requests, const Scenario& s, const std::vector<std::size_t>& ids) {
  Problem p;
  const std::size_t pages = *std::max_element(ids.begin(), ids.end()) + 1;
  const std::vector<std::size_t> shape = s.heads_first
                                             ? std::vector<std::size_t>{pages, p.kv_heads, s.page, p.dim}
                                             : std::vector<std::size_t>{pages, s.page, p.kv_heads, p.dim};
  p.k_cache = std::make_unique<PoisonedCache>("k_cache", shape);
  p.v_cache = std::make_unique<PoisonedCache>("v_cache", shape);
  std::size_t next = 0;
  p.query_offsets = {0};
  std::vector<double> q;
  for (const Request& r : requests) {
    std::vector<std::size_t> row;
    for (std::size_t i = 0; i < pages_for(r.keys, s.page); ++i) row.push_back(ids[next++]);
    for (std::size_t j = 0; j < r.keys; ++j) {
      for (std::size_t h = 0; h < p.kv_heads; ++h) {
        const std::size_t at = within_page(s, p, j % s.page, h), from = (j * p.kv_heads + h) * p.dim;
        std::copy_n(r.k.begin() + static_cast<std::ptrdiff_t>(from), p.dim,
                    p.k_cache->page(row[j / s.page]).begin() + static_cast<std::ptrdiff_t>(at));
        std::copy_n(r.v.begin() + static_cast<std::ptrdiff_t>(from), p.dim,
                    p.v_cache->page(row[j / s.page]).begin() + static_cast<std::ptrdiff_t>(at));
      }
    }
    row.push_back(ids.back());  // never written: NaN
    p.page_rows.push_back(std::move(row));
    p.keys.push_back(r.keys);
    p.query_offsets.push_back(p.query_offsets.back() + r.queries);
    q.insert(q.end(), r.q.begin(), r.q.end());
  }
  p.q = std::make_unique<gate::MemoryArray>(
      "q", std::vector<std::size_t>{p.query_offsets.back(), p.heads, p.dim}, std::move(q));
  add_tables(s, p);
  return p;
}

}  // namespace

// The ids first, then each sequence's keys and values (interleaved key by key, head by head), then
// every query: the order the gate's reports were made with.
Problem make_problem(const Scenario& s, std::uint64_t seed, const FloatFormat& format) {
  DeterministicRandom random(seed);
  const std::vector<std::size_t> ids = scrambled_ids(s, s.keys, random);
  const Problem shape_only;
  std::vector<Request> requests(s.keys.size());
  for (std::size_t b = 0; b < requests.size(); ++b) {
    Request& r = requests[b];
    r.keys = s.keys[b];
    r.queries = s.queries[b];
    for (std::size_t j = 0; j < r.keys * shape_only.kv_heads; ++j) {
      for (std::vector<double>* values : {&r.k, &r.v}) {
        for (std::size_t d = 0; d < shape_only.dim; ++d)
          values->push_back(round_to_format(random.normal(), format));
      }
    }
  }
  for (Request& r : requests) {
    r.q.resize(r.queries * shape_only.heads * shape_only.dim);
    for (double& x : r.q) x = round_to_format(random.normal(), format);
  }
  return place(requests, s, ids);
}

Request make_request(std::size_t keys, std::size_t queries, std::uint64_t seed, const FloatFormat& format) {
  DeterministicRandom random(seed);
  const Problem shape_only;
  Request r{.keys = keys, .queries = queries, .k = {}, .v = {}, .q = {}};
  for (std::vector<double>* values : {&r.k, &r.v}) {
    values->resize(keys * shape_only.kv_heads * shape_only.dim);
    for (double& x : *values) x = round_to_format(random.normal(), format);
  }
  r.q.resize(queries * shape_only.heads * shape_only.dim);
  for (double& x : r.q) x = round_to_format(random.normal(), format);
  return r;
}

Problem pack_requests(std::span<const Request> requests, const Scenario& layout, std::uint64_t seed) {
  DeterministicRandom random(seed);
  std::vector<std::size_t> keys;
  for (const Request& r : requests) keys.push_back(r.keys);
  return place(requests, layout, scrambled_ids(layout, keys, random));
}

namespace {

// The rows of keys (or values) of sequence b for KV head h as the kernel reads them.
Matrix read_rows(const Kernel& kernel, const Scenario& s, const Problem& p, const PoisonedCache& cache,
                 std::size_t b, std::size_t h, std::size_t count) {
  Matrix rows(count, p.dim);
  const std::size_t per_page = cache.size() / cache.shape()[0];
  for (std::size_t j = 0; j < count; ++j) {
    std::size_t id = p.page_rows[b][j / s.page];
    if (kernel.bug == Bug::block_ids_16_bit) id &= 0xFFFF;
    cache.read(id * per_page + within_page(s, p, j % s.page, h), rows.row(j));
  }
  return rows;
}

constexpr kernels::AttentionDesign fp32_partials{.input = &bf16, .output = &fp32};

// FlashAttention's num_splits_heuristic, simplified: enough splits (of whole 64-key blocks) for
// batch x heads x splits to fill 132 SMs, at most 128 and one per block.
std::size_t split_keys_from_batch(std::size_t batch, std::size_t heads, std::size_t keys) {
  constexpr std::size_t sms = 132, block = 64;
  const std::size_t blocks = std::max<std::size_t>(1, pages_for(keys, block));
  const std::size_t splits =
      std::clamp<std::size_t>(pages_for(sms, batch * heads), 1, std::min<std::size_t>(128, blocks));
  return block * pages_for(blocks, splits);
}

// FlashDecoding for one head: each split of `split` keys runs the flash loop to an fp32 output and
// log-sum-exp (a split a query sees nothing of is empty: zeros, -inf), and the partials are merged in
// fp32 as vLLM's merge_attn_states does (the merged log-sum-exp max + log(sum)), then rounded once
// to bf16.
void split_kv(const Matrix& queries, const Matrix& keys, const Matrix& values,
              const tensor::HeadScores& scores, std::size_t split, bool base_2_lse, Matrix& result,
              std::vector<double>& lse) {
  const std::size_t m = queries.rows, n = keys.rows, dim = values.cols;
  std::vector<Matrix> outs;
  std::vector<std::vector<double>> lses;
  for (std::size_t first = 0; first < n; first += split) {
    const std::size_t length = std::min(split, n - first);
    std::vector<std::uint8_t> keep(m * length);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < length; ++j) keep[i * length + j] = scores.sees(i, first + j) ? 1 : 0;
    }
    tensor::HeadScores part;
    part.queries = m;
    part.keys = part.row_stride = length;
    part.keep = keep;
    part.fully_masked = tensor::FullyMaskedRows::zeros;
    Matrix k(length, keys.cols), v(length, dim);
    for (std::size_t j = 0; j < length; ++j) {
      std::copy(keys.row(first + j).begin(), keys.row(first + j).end(), k.row(j).begin());
      std::copy(values.row(first + j).begin(), values.row(first + j).end(), v.row(j).begin());
    }
    kernels::attention_by_design(fp32_partials, queries, k, v, part, outs.emplace_back(),
                                 &lses.emplace_back());
  }
  result = Matrix(m, dim);
  lse.assign(m, -std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i < m; ++i) {
    float top = -std::numeric_limits<float>::infinity();
    for (const auto& partial : lses) top = std::max(top, static_cast<float>(partial[i]));
    if (top == -std::numeric_limits<float>::infinity()) continue;  // nothing seen: zeros
    float sum = 0;
    for (const auto& partial : lses) sum += std::exp(static_cast<float>(partial[i]) - top);
    constexpr float log2e = std::numbers::log2e_v<float>, ln2 = std::numbers::ln2_v<float>;
    lse[i] = base_2_lse ? (top * log2e + std::log2(sum)) * ln2 : top + std::log(sum);
    for (std::size_t c = 0; c < dim; ++c) {
      float o = 0;
      for (std::size_t t = 0; t < outs.size(); ++t)
        o += std::exp(static_cast<float>(lses[t][i]) - top) / sum * static_cast<float>(outs[t](i, c));
      result(i, c) = round_to_format(o, bf16);
    }
  }
}

}  // namespace

Outputs run(const Kernel& kernel, const Scenario& s, const Problem& p) {
  const std::size_t tokens = p.query_offsets.back();
  std::vector<double> out(tokens * p.heads * p.dim, 0.0);
  std::vector<double> lse(tokens * p.heads, -std::numeric_limits<double>::infinity());
  for (std::size_t b = 0; b < p.keys.size(); ++b) {
    std::size_t count = p.keys[b];
    if (kernel.bug == Bug::last_page_short) --count;
    if (kernel.bug == Bug::reads_past_the_end) ++count;
    const std::size_t m = p.query_offsets[b + 1] - p.query_offsets[b], first = p.query_offsets[b];
    std::size_t split = kernel.split_keys;
    if (kernel.bug == Bug::split_count_from_batch)
      split = split_keys_from_batch(p.keys.size(), p.heads, count);
    for (std::size_t h = 0; h < p.heads; ++h) {
      if (count == 0) continue;  // nothing read: zeros
      const std::size_t kv = h / (p.heads / p.kv_heads);
      Matrix queries(m, p.dim);
      for (std::size_t i = 0; i < m; ++i) p.q->read(((first + i) * p.heads + h) * p.dim, queries.row(i));
      tensor::HeadScores scores;
      scores.queries = m;
      scores.keys = scores.row_stride = count;
      scores.causal = s.causal;
      scores.alignment = tensor::DiagonalAlignment::bottom_right;
      const Matrix keys = read_rows(kernel, s, p, *p.k_cache, b, kv, count);
      const Matrix values = read_rows(kernel, s, p, *p.v_cache, b, kv, count);
      Matrix result;
      std::vector<double> head_lse;
      if (split == 0) {
        kernels::attention_by_design(flash_bf16, queries, keys, values, scores, result, &head_lse);
      } else {
        const bool base_2_lse = kernel.bug == Bug::lse_path_from_batch && p.keys.size() >= 16;
        split_kv(queries, keys, values, scores, split, base_2_lse, result, head_lse);
      }
      for (std::size_t i = 0; i < m; ++i) {
        std::copy(result.row(i).begin(), result.row(i).end(),
                  out.begin() + static_cast<std::ptrdiff_t>(((first + i) * p.heads + h) * p.dim));
        lse[(first + i) * p.heads + h] = head_lse[i];
      }
    }
  }
  return {.out = std::make_unique<gate::MemoryArray>("out", std::vector<std::size_t>{tokens, p.heads, p.dim},
                                                     std::move(out)),
          .lse = std::make_unique<gate::MemoryArray>("lse", std::vector<std::size_t>{tokens, p.heads},
                                                     std::move(lse))};
}

namespace {

gate::ExternalTensor whole(const gate::Array& array, std::string_view stored_as = {}) {
  return {.name = array.name(),
          .shape = array.shape(),
          .values = gate::all_values(array),
          .stored_as = stored_as};
}

}  // namespace

namespace {

// A problem as a kernel outside the gate is handed it: the caches in full (NaN where no sequence
// reaches), the tables as int64, the layout and mask as options, the output's shape.
gate::ExternalCall external_call(const Problem& p, const Scenario& layout) {
  gate::ExternalCall call;
  call.tensors = {whole(*p.q), whole(*p.k_cache), whole(*p.v_cache)};
  for (const auto& table : p.tables) call.tensors.push_back(whole(*table, "int64"));
  call.options = {{"page_layout", layout.heads_first ? "HND" : "NHD"},
                  {"causal", layout.causal},
                  {"cu_seqlens_q", p.query_offsets}};
  call.outputs.push_back({.name = "out", .shape = p.q->shape(), .values = {}});
  call.outputs.push_back({.name = "lse",
                          .shape = {p.q->shape()[0], p.q->shape()[1]},
                          .values = {},
                          .stored_as = "fp32",
                          .optional = true});
  return call;
}

}  // namespace

std::vector<gate::ExternalCase> external_cases(const gate::ExternalSweep& sweep) {
  const std::string kernel = "python:paged_attention:" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  for (const Scenario& s : scenario_table) {
    gate::GateCase shape;  // only for the id, the gate's form
    shape.kernel = kernel;
    shape.input = "paged_" + std::string(s.name);
    shape.n = total_keys(s);
    gate::ExternalCase c;
    c.id = shape.id();
    if (!sweep.only_id.empty() && sweep.only_id != c.id) continue;
    const std::uint64_t seed = gate::case_seed(sweep.seed, c.id);
    if (s.invariance) {  // the first call, then its reruns
      InvarianceCalls calls = invariance_calls(s, seed, *sweep.format);
      gate::ExternalCall first = external_call(calls.problems[0], calls.layouts[0]);
      c.tensors = std::move(first.tensors);
      c.options = std::move(first.options);
      c.outputs = std::move(first.outputs);
      for (std::size_t i = 1; i < calls.problems.size(); ++i)
        c.reruns.push_back(external_call(calls.problems[i], calls.layouts[i]));
      c.invariance = std::move(calls.plan);
      cases.push_back(std::move(c));
      continue;
    }
    const Problem p = make_problem(s, seed, *sweep.format);
    if (p.k_cache->size() > (std::size_t{1} << 24)) continue;
    gate::ExternalCall call = external_call(p, s);
    c.tensors = std::move(call.tensors);
    c.options = std::move(call.options);
    c.outputs = std::move(call.outputs);
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace sharpcheck::ops::paged
