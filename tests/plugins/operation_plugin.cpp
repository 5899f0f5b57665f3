// A version-6 plugin (kernels/plugin_abi.h's sharpcheck_op) for the gate's own tests: the merge of
// partial attention states and paged attention, computed in float as a serving kernel would, and
// mutants carrying a bug each (SHARPCHECK_OPERATION_MUTANT): 1, the merge's log-sum-exp taken as the
// max and its weights left unnormalised; 2, paged page ids truncated to 16 bits; 3, paged keys
// summed in another order when the batch holds 16 or more sequences (accurate, not batch-invariant).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {

constexpr int mutant = SHARPCHECK_OPERATION_MUTANT;

const sharpcheck_plugin_description info{
    SHARPCHECK_PLUGIN_ABI_VERSION,
    SHARPCHECK_TEST_PLUGIN_NAME,
    "attention_merge and paged_attention through sharpcheck_op, in float",
    0,
    0,
    0,
    "attention_merge,paged_attention",
    SHARPCHECK_FP32 | SHARPCHECK_BF16};

float get(const sharpcheck_tensor& t, std::size_t i) {
  switch (t.storage) {
    case SHARPCHECK_STORE_FP32:
      return static_cast<const float*>(t.data)[i];
    case SHARPCHECK_STORE_BF16: {
      const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(t.data)[i])
                                 << 16;
      float value = 0;
      std::memcpy(&value, &bits, sizeof value);
      return value;
    }
    case SHARPCHECK_STORE_FP64:
      return static_cast<float>(static_cast<const double*>(t.data)[i]);
    case SHARPCHECK_STORE_INT64:
      return static_cast<float>(static_cast<const std::int64_t*>(t.data)[i]);
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
}

std::int64_t index_at(const sharpcheck_tensor& t, std::size_t i) {
  return static_cast<const std::int64_t*>(t.data)[i];
}

void put(const sharpcheck_tensor& t, std::size_t i, float value) {
  if (t.storage == SHARPCHECK_STORE_FP32) {
    static_cast<float*>(t.data)[i] = value;
    return;
  }
  std::uint32_t bits = 0;  // bf16, rounded to nearest even
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t rounded = std::isnan(value) ? 0x7FC00000U : bits + 0x7FFFU + ((bits >> 16) & 1U);
  static_cast<std::uint16_t*>(t.data)[i] = static_cast<std::uint16_t>(rounded >> 16);
}

const sharpcheck_tensor* find(const sharpcheck_tensor* tensors, std::size_t count, const char* name) {
  for (std::size_t i = 0; i < count; ++i) {
    if (std::strcmp(tensors[i].name, name) == 0) return &tensors[i];
  }
  return nullptr;
}

// partial_out [T, S, H, D], partial_lse [T, S, H] -> out [T, H, D], lse [T, H] (layout tshd).
int merge(const sharpcheck_op_call& call) {
  const sharpcheck_tensor* po = find(call.inputs, call.input_count, "partial_out");
  const sharpcheck_tensor* pl = find(call.inputs, call.input_count, "partial_lse");
  const sharpcheck_tensor* out = find(call.outputs, call.output_count, "out");
  const sharpcheck_tensor* lse = find(call.outputs, call.output_count, "lse");
  if (po == nullptr || pl == nullptr || out == nullptr || po->rank != 4) return 2;
  const std::size_t tokens = po->shape[0], splits = po->shape[1], heads = po->shape[2], dim = po->shape[3];
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      float top = -std::numeric_limits<float>::infinity();
      for (std::size_t s = 0; s < splits; ++s) top = std::fmax(top, get(*pl, (t * splits + s) * heads + h));
      std::vector<float> acc(dim, 0.0F);
      float sum = 0;
      for (std::size_t s = 0; s < splits && std::isfinite(top); ++s) {
        const float x = get(*pl, (t * splits + s) * heads + h);
        if (x == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(x - top);
        sum += w;
        for (std::size_t d = 0; d < dim; ++d)
          acc[d] += w * get(*po, ((t * splits + s) * heads + h) * dim + d);
      }
      const float norm = mutant == 1 || sum == 0 ? 1.0F : sum;
      for (std::size_t d = 0; d < dim; ++d)
        put(*out, (t * heads + h) * dim + d, sum == 0 ? 0.0F : acc[d] / norm);
      if (lse != nullptr) put(*lse, t * heads + h, mutant == 1 || sum == 0 ? top : top + std::log(sum));
    }
  }
  return 0;
}

// Each sequence's page ids and key count, from either table form.
struct Pages {
  std::vector<std::vector<std::int64_t>> ids;
  std::vector<std::size_t> keys;
};

Pages pages_of(const sharpcheck_op_call& call, std::size_t page) {
  Pages p;
  if (const sharpcheck_tensor* table = find(call.inputs, call.input_count, "block_table")) {
    const sharpcheck_tensor* lens = find(call.inputs, call.input_count, "seq_lens");
    for (std::size_t b = 0; b < table->shape[0]; ++b) {
      p.keys.push_back(static_cast<std::size_t>(index_at(*lens, b)));
      p.ids.emplace_back(static_cast<const std::int64_t*>(table->data) + b * table->shape[1],
                         static_cast<const std::int64_t*>(table->data) + (b + 1) * table->shape[1]);
    }
    return p;
  }
  const sharpcheck_tensor* indptr = find(call.inputs, call.input_count, "kv_indptr");
  const sharpcheck_tensor* indices = find(call.inputs, call.input_count, "kv_indices");
  const sharpcheck_tensor* last = find(call.inputs, call.input_count, "kv_last_page_len");
  for (std::size_t b = 0; b + 1 < indptr->shape[0]; ++b) {
    const auto begin = index_at(*indptr, b), end = index_at(*indptr, b + 1);
    p.ids.emplace_back(static_cast<const std::int64_t*>(indices->data) + begin,
                       static_cast<const std::int64_t*>(indices->data) + end);
    p.keys.push_back(end == begin ? 0
                                  : static_cast<std::size_t>(end - begin - 1) * page +
                                        static_cast<std::size_t>(index_at(*last, b)));
  }
  return p;
}

int paged(const sharpcheck_op_call& call) {
  const auto options = nlohmann::json::parse(call.options);
  const bool hnd = options.value("page_layout", std::string("NHD")) == "HND";
  const bool causal = options.value("causal", false);
  const auto cu = options.at("cu_seqlens_q").get<std::vector<std::size_t>>();
  const sharpcheck_tensor* q = find(call.inputs, call.input_count, "q");
  const sharpcheck_tensor* kc = find(call.inputs, call.input_count, "k_cache");
  const sharpcheck_tensor* vc = find(call.inputs, call.input_count, "v_cache");
  const sharpcheck_tensor* out = find(call.outputs, call.output_count, "out");
  const sharpcheck_tensor* lse = find(call.outputs, call.output_count, "lse");  // optional: written
  const std::size_t heads = q->shape[1], dim = q->shape[2];
  const std::size_t page = hnd ? kc->shape[2] : kc->shape[1], kv_heads = hnd ? kc->shape[1] : kc->shape[2];
  const Pages p = pages_of(call, page);
  const auto at = [&](std::int64_t id, std::size_t slot, std::size_t head) {
    if (mutant == 2) id &= 0xFFFF;
    const auto u = static_cast<std::size_t>(id);
    return hnd ? ((u * kv_heads + head) * page + slot) * dim : ((u * page + slot) * kv_heads + head) * dim;
  };
  for (std::size_t b = 0; b < p.keys.size(); ++b) {
    const std::size_t n = p.keys[b], m = cu[b + 1] - cu[b];
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t kv = h / (heads / kv_heads), row = (cu[b] + i) * heads + h;
        const std::size_t visible = causal ? std::min(n, n - m + i + 1) : n;
        std::vector<float> s(visible);
        float top = -std::numeric_limits<float>::infinity();
        for (std::size_t j = 0; j < visible; ++j) {
          float dot = 0;
          for (std::size_t d = 0; d < dim; ++d)
            dot += get(*q, row * dim + d) * get(*kc, at(p.ids[b][j / page], j % page, kv) + d);
          s[j] = dot / std::sqrt(static_cast<float>(dim));
          top = std::fmax(top, s[j]);
        }
        std::vector<float> acc(dim, 0.0F);
        float sum = 0;
        // mutant 3: a path chosen by batch bucket (the keys summed last to first from 16 sequences)
        const bool reversed = mutant == 3 && p.keys.size() >= 16;
        for (std::size_t a = 0; a < visible; ++a) {
          const std::size_t j = reversed ? visible - 1 - a : a;
          const float w = std::exp(s[j] - top);
          sum += w;
          for (std::size_t d = 0; d < dim; ++d)
            acc[d] += w * get(*vc, at(p.ids[b][j / page], j % page, kv) + d);
        }
        for (std::size_t d = 0; d < dim; ++d) put(*out, row * dim + d, sum == 0 ? 0.0F : acc[d] / sum);
        if (lse != nullptr)
          put(*lse, row, sum == 0 ? -std::numeric_limits<float>::infinity() : top + std::log(sum));
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" const sharpcheck_plugin_description* sharpcheck_plugin_info() { return &info; }

extern "C" int sharpcheck_op(const sharpcheck_op_call* call) {
  if (std::strcmp(call->operation, "attention_merge") == 0) return merge(*call);
  if (std::strcmp(call->operation, "paged_attention") == 0) return paged(*call);
  return 1;
}
