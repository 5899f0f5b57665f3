/* The C ABI of sharpcheck kernel plugins: a shared library exporting these symbols can be judged
 * by `sharpcheck gate --plugin path.so` exactly like a built-in kernel. The gate calls every
 * entry point in a child process under a time limit, so a plugin that crashes or hangs becomes a
 * failure record with a reproducer, never a crashed gate.
 *
 * Storage: SHARPCHECK_FP32 is float; SHARPCHECK_BF16 and SHARPCHECK_FP16 are uint16_t bit
 * patterns. Arrays are row-major. scale = 1/theta (softmax) or (1/sqrt(d))/theta (attention).
 * Entry points return 0 on success and non-zero on failure. */
#ifndef SHARPCHECK_PLUGIN_ABI_H
#define SHARPCHECK_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added `features`; version 3 the attention features below 1u << 3 and
 * sharpcheck_attention_layer; version 4 the attention backward (SHARPCHECK_ATTENTION_BACKWARD and
 * sharpcheck_attention_backward); version 5 the backward through the log-sum-exp and the sinks
 * (SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK and sharpcheck_attention_backward_lse); version 6 one
 * entry for any operation `sharpcheck ops` lists, named by the operation (sharpcheck_op, below),
 * and the description's `operations` and `operation_formats`. The gate still loads plugins of
 * every earlier version, and none of them needs the version-6 fields. */
#define SHARPCHECK_PLUGIN_ABI_VERSION 6u

enum sharpcheck_format {
  SHARPCHECK_FP32 = 1u << 0,
  SHARPCHECK_BF16 = 1u << 1,
  SHARPCHECK_FP16 = 1u << 2,
};

/* What a plugin declares it honours beyond the plain call; the gate sweeps each declared feature
 * and fails a plugin that ignores one. Undeclared, the gate calls softmax with scale 1 only and
 * attention with scale 1/sqrt(dim) and causal = 0 only. */
enum sharpcheck_feature {
  SHARPCHECK_SOFTMAX_SCALE = 1u << 0,    /* softmax scales other than 1 (the gate uses 1/4 and 4) */
  SHARPCHECK_ATTENTION_SCALE = 1u << 1,  /* attention scales other than 1/sqrt(dim) (the gate halves it) */
  SHARPCHECK_ATTENTION_CAUSAL = 1u << 2, /* causal = 1 (top-left aligned) */
  /* Version 3: features of sharpcheck_attention_layer (required when any is declared). */
  SHARPCHECK_ATTENTION_BOTTOM_RIGHT = 1u << 3, /* causal and window aligned bottom-right */
  SHARPCHECK_ATTENTION_WINDOW = 1u << 4,       /* sliding window (left, right) */
  SHARPCHECK_ATTENTION_SOFTCAP = 1u << 5,      /* cap * tanh(score / cap) */
  SHARPCHECK_ATTENTION_ALIBI = 1u << 6,        /* - slope_h * |i + diagonal - j| per head */
  SHARPCHECK_ATTENTION_SINK = 1u << 7,         /* one sink logit per head, no value */
  SHARPCHECK_ATTENTION_GQA = 1u << 8, /* kv_heads < heads: head h reads KV head h / (heads / kv_heads) */
  SHARPCHECK_ATTENTION_LSE = 1u << 9, /* writes the natural log-sum-exp per query row */
  SHARPCHECK_ATTENTION_KEY_PADDING = 1u << 10, /* valid_keys < keys: keys past it are never seen */
  /* Version 4: sharpcheck_attention_backward (the gate runs its backward sweep on it). */
  SHARPCHECK_ATTENTION_BACKWARD = 1u << 11,
  /* Version 5: sharpcheck_attention_backward_lse (a gradient reaching the log-sum-exp; the sinks'
   * gradients). With SHARPCHECK_ATTENTION_SINK the gate's sink case runs on it. */
  SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK = 1u << 12
};

/* One batch element of a multi-head attention layer (version 3). Tensors are [heads, seq, dim]
 * row-major: q is heads x queries x dim, k is kv_heads x keys x dim, v kv_heads x keys x
 * value_dim, out heads x queries x value_dim, lse heads x queries (float). The logit of query i
 * and key j in head h is softcap(scale * q.k) - alibi_slopes[h] * |i + diagonal - j| with
 * diagonal = 0 (top-left) or valid_keys - queries (bottom-right), softcap(s) = cap tanh(s / cap)
 * (cap 0: none); query i sees key j < valid_keys with j <= i + diagonal when causal and
 * i + diagonal - window_left <= j <= i + diagonal + window_right (-1: unbounded). sinks[h] (if
 * not null) is one more logit with no value. A query that sees nothing outputs zeros, lse -inf. */
struct sharpcheck_attention_call {
  size_t heads, kv_heads, queries, keys, valid_keys, dim, value_dim;
  float scale;
  int causal;
  int bottom_right;
  int64_t window_left, window_right;
  float softcap;
  const float* alibi_slopes; /* heads entries, or null */
  const float* sinks;        /* heads entries, or null */
  float* lse;                /* heads x queries, or null when not asked for */
};

struct sharpcheck_plugin_description {
  uint32_t abi_version;       /* SHARPCHECK_PLUGIN_ABI_VERSION */
  const char* name;           /* short, no spaces: used in case ids */
  const char* description;    /* one line */
  uint32_t softmax_formats;   /* bitmask of enum sharpcheck_format with a softmax entry point */
  uint32_t attention_formats; /* bitmask with an attention entry point (0: none) */
  uint32_t features;          /* version >= 2: bitmask of enum sharpcheck_feature */
  /* Version 6: the operations sharpcheck_op computes, comma-separated by their names in
   * `sharpcheck ops` ("attention_merge,paged_attention"; null or "": none), and the formats
   * (bitmask of enum sharpcheck_format) it computes them in. */
  const char* operations;
  uint32_t operation_formats;
};

/* Version 6: how a tensor handed to or filled by sharpcheck_op is stored. A tensor in the case's
 * format (q, k, v, a cache, an output) is stored as that format says (float, or uint16 bits);
 * values kept in full precision (per-head sinks and slopes) are doubles; values a kernel keeps in
 * fp32 (partial log-sum-exps, a log-sum-exp output) are floats; indices are int64. */
enum sharpcheck_storage {
  SHARPCHECK_STORE_FP32 = 1u, /* float */
  SHARPCHECK_STORE_BF16 = 2u, /* uint16_t bit patterns */
  SHARPCHECK_STORE_FP16 = 3u, /* uint16_t bit patterns */
  SHARPCHECK_STORE_FP64 = 4u, /* double */
  SHARPCHECK_STORE_INT64 = 5u /* int64_t */
};

struct sharpcheck_tensor {
  const char* name; /* the operation's tensor name, as `sharpcheck ops` lists it */
  uint32_t storage; /* enum sharpcheck_storage */
  size_t rank;
  const size_t* shape; /* row-major, rank extents */
  void* data;          /* inputs: read only; outputs: every element written by the plugin */
};

/* One case of an operation: its input tensors and options (a JSON object, the options
 * `sharpcheck ops` lists with the case's values, e.g. {"layout":"sthd","lse_base2":true}), and
 * the judged tensors the gate allocated for the plugin to fill. */
struct sharpcheck_op_call {
  const char* operation;
  uint32_t format; /* enum sharpcheck_format: the case's format */
  const char* options;
  size_t input_count;
  const struct sharpcheck_tensor* inputs;
  size_t output_count;
  struct sharpcheck_tensor* outputs;
};

/* Required. */
const struct sharpcheck_plugin_description* sharpcheck_plugin_info(void);

/* Required when softmax_formats != 0: softmax of each of `rows` rows of `n` logits. */
int sharpcheck_softmax(uint32_t format, const void* logits, void* out, size_t rows, size_t n, float scale);

/* Required when attention_formats != 0: one head, q (queries x dim), k (keys x dim),
 * v (keys x value_dim), out (queries x value_dim); causal = top-left aligned mask. */
int sharpcheck_attention(uint32_t format, const void* q, const void* k, const void* v, void* out,
                         size_t queries, size_t keys, size_t dim, size_t value_dim, float scale, int causal);

/* Required when any version-3 attention feature is declared: one batch element, every head. */
int sharpcheck_attention_layer(uint32_t format, const void* q, const void* k, const void* v, void* out,
                               const struct sharpcheck_attention_call* call);

/* Required when SHARPCHECK_ATTENTION_BACKWARD is declared: the gradients of one batch element's
 * attention (the call as sharpcheck_attention_layer's, with the features declared; the gate's
 * backward sweep uses one head and valid_keys == keys, and never a sink here) given dout (heads x
 * queries x value_dim, in `format`): dq, dk, dv in q's, k's and v's shapes and `format`, and, when
 * d is not null, D = rowsum(dO * O) per head and query (float), which the gate judges too. */
int sharpcheck_attention_backward(uint32_t format, const void* q, const void* k, const void* v,
                                  const void* dout, void* dq, void* dk, void* dv, float* d,
                                  const struct sharpcheck_attention_call* call);

/* Required when SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK is declared (version 5): as
 * sharpcheck_attention_backward, and also d_lse (heads x queries floats, or null: no gradient
 * reaches the log-sum-exp), the gradient reaching the natural log-sum-exp of each query, and, when
 * call->sinks is not null, d_sinks (heads floats written): the gradient of each head's sink logit
 * call->sinks[h]. The gate calls this entry for every problem with a sink or a log-sum-exp
 * gradient, and the version-4 entry for the others. */
int sharpcheck_attention_backward_lse(uint32_t format, const void* q, const void* k, const void* v,
                                      const void* dout, const float* d_lse, void* dq, void* dk, void* dv,
                                      float* d, float* d_sinks, const struct sharpcheck_attention_call* call);

/* Required when version-6 `operations` are declared: computes call->operation on one case.
 * Tensors are found by name; an operation or option the plugin does not know is an error
 * (non-zero), which the gate reports as a failure of the case. */
int sharpcheck_op(const struct sharpcheck_op_call* call);

#ifdef __cplusplus
}
#endif

#endif /* SHARPCHECK_PLUGIN_ABI_H */
