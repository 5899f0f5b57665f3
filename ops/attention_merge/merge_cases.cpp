// The merge sweep for kernels outside the gate (sharpcheck.sweep(kernel, "attention_merge")):
// partial states computed exactly from real splits of attention problems (each chunk's output
// correctly rounded to the format, its LSE to fp32), over 2, 4, 16 and 133 splits (FlashAttention
// 4 tests up to 133), with empty partials (LSE -inf, output NaN: a kernel must not read it), and
// with every LSE shifted by +100 (a merge that exponentiates without subtracting the max overflows).
#include <cmath>
#include <string>

#include "core/random.hpp"
#include "gate/case_inputs.hpp"
#include "gate/case_tools.hpp"
#include "ops/attention_merge/attention_merge_op.hpp"
#include "reference/attention.hpp"

namespace sharpcheck::ops {
namespace {

constexpr std::size_t tokens = 8, heads = 2, dim = 32, keys = 1064;  // 1064 = 133 x 8

struct Partials {
  std::vector<double> out;  // [T, S, H, D]
  std::vector<double> lse;  // [T, S, H]
};

// Each head's keys split into `splits` chunks, each chunk's attention computed exactly.
Partials split_attention(std::size_t splits, std::uint64_t seed, const FloatFormat& format) {
  DeterministicRandom random(seed);
  Partials p{std::vector<double>(tokens * splits * heads * dim),
             std::vector<double>(tokens * splits * heads)};
  const std::size_t chunk = (keys + splits - 1) / splits;
  for (std::size_t h = 0; h < heads; ++h) {
    const Matrix q = gate::normal_matrix(tokens, dim, random, format);
    const Matrix k = gate::normal_matrix(keys, dim, random, format);
    const Matrix v = gate::normal_matrix(keys, dim, random, format);
    for (std::size_t s = 0; s < splits; ++s) {
      const std::size_t first = s * chunk, count = std::min(chunk, keys - first);
      Matrix kc(count, dim), vc(count, dim);
      std::copy_n(k.values.begin() + static_cast<std::ptrdiff_t>(first * dim), count * dim,
                  kc.values.begin());
      std::copy_n(v.values.begin() + static_cast<std::ptrdiff_t>(first * dim), count * dim,
                  vc.values.begin());
      reference::AttentionOptions options;
      options.return_lse = true;
      options.lse_format = &fp32;
      const reference::AttentionResult r = reference::attention(q, kc, vc, format, options);
      for (std::size_t t = 0; t < tokens; ++t) {
        const std::size_t at = (t * splits + s) * heads + h;
        p.lse[at] = r.lse[t];
        for (std::size_t d = 0; d < dim; ++d) p.out[at * dim + d] = r.output(t, d);
      }
    }
  }
  return p;
}

gate::ExternalCase merge_case(std::string id, std::size_t splits, Partials p) {
  gate::ExternalCase c;
  c.id = std::move(id);
  c.tensors.push_back(
      {.name = "partial_out", .shape = {tokens, splits, heads, dim}, .values = std::move(p.out)});
  c.tensors.push_back({.name = "partial_lse",
                       .shape = {tokens, splits, heads},
                       .values = std::move(p.lse),
                       .stored_as = "fp32"});
  c.outputs.push_back({.name = "out", .shape = {tokens, heads, dim}, .values = {}});
  c.outputs.push_back({.name = "lse", .shape = {tokens, heads}, .values = {}, .stored_as = "fp32"});
  return c;
}

std::string case_id(const std::string& kernel, const std::string& input) {
  gate::GateCase shape;  // only for the id, the gate's form
  shape.kernel = kernel;
  shape.input = input;
  shape.n = keys;
  return shape.id();
}

}  // namespace

std::vector<gate::ExternalCase> merge_external_cases(const gate::ExternalSweep& sweep) {
  const std::string kernel = "python:attention_merge:" + std::string(sweep.format->name);
  std::vector<gate::ExternalCase> cases;
  for (const std::size_t splits : {2U, 4U, 16U, 133U}) {
    std::string id = case_id(kernel, "merge_splits_" + std::to_string(splits));
    cases.push_back(
        merge_case(id, splits, split_attention(splits, gate::case_seed(sweep.seed, id), *sweep.format)));
  }
  {  // empty partials: chunk s of token t empty when (t + s) % 3 == 0; token 5 has none at all
    std::string id = case_id(kernel, "merge_empty_partials");
    Partials p = split_attention(4, gate::case_seed(sweep.seed, id), *sweep.format);
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t s = 0; s < 4; ++s) {
        if ((t + s) % 3 != 0 && t != 5) continue;
        for (std::size_t h = 0; h < heads; ++h) {
          const std::size_t at = (t * 4 + s) * heads + h;
          p.lse[at] = -INFINITY;
          for (std::size_t d = 0; d < dim; ++d) p.out[at * dim + d] = NAN;
        }
      }
    }
    cases.push_back(merge_case(std::move(id), 4, std::move(p)));
  }
  {  // an exact probe: two identical partials merge to the same output, exactly, and lse + ln 2
    std::string id = case_id(kernel, "merge_probe_identical_partials");
    Partials p = split_attention(2, gate::case_seed(sweep.seed, id), *sweep.format);
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t first = (t * 2) * heads + h, second = (t * 2 + 1) * heads + h;
        p.lse[second] = p.lse[first];
        for (std::size_t d = 0; d < dim; ++d) p.out[second * dim + d] = p.out[first * dim + d];
      }
    }
    cases.push_back(merge_case(std::move(id), 2, std::move(p)));
  }
  {  // every LSE + 100, rounded to fp32 as a kernel stores it (the merge is unchanged by a common shift)
    std::string id = case_id(kernel, "merge_large_lse");
    Partials p = split_attention(4, gate::case_seed(sweep.seed, id), *sweep.format);
    for (double& x : p.lse) x = static_cast<double>(static_cast<float>(x + 100));
    cases.push_back(merge_case(std::move(id), 4, std::move(p)));
  }
  return cases;
}

}  // namespace sharpcheck::ops
