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

/* Version 2 added `features`; the gate still loads version-1 plugins (no features declared). */
#define SHARPCHECK_PLUGIN_ABI_VERSION 2u

enum sharpcheck_format {
  SHARPCHECK_FP32 = 1u << 0,
  SHARPCHECK_BF16 = 1u << 1,
  SHARPCHECK_FP16 = 1u << 2,
};

/* What a plugin declares it honours beyond the plain call; the gate sweeps each declared feature
 * and fails a plugin that ignores one. Undeclared, the gate calls softmax with scale 1 only and
 * attention with scale 1/sqrt(dim) and causal = 0 only. */
enum sharpcheck_feature {
  SHARPCHECK_SOFTMAX_SCALE = 1u << 0,   /* softmax scales other than 1 (the gate uses 1/4 and 4) */
  SHARPCHECK_ATTENTION_SCALE = 1u << 1, /* attention scales other than 1/sqrt(dim) (the gate halves it) */
  SHARPCHECK_ATTENTION_CAUSAL = 1u << 2 /* causal = 1 (top-left aligned) */
};

struct sharpcheck_plugin_description {
  uint32_t abi_version;       /* SHARPCHECK_PLUGIN_ABI_VERSION */
  const char* name;           /* short, no spaces: used in case ids */
  const char* description;    /* one line */
  uint32_t softmax_formats;   /* bitmask of enum sharpcheck_format with a softmax entry point */
  uint32_t attention_formats; /* bitmask with an attention entry point (0: none) */
  uint32_t features;          /* version >= 2: bitmask of enum sharpcheck_feature */
};

/* Required. */
const struct sharpcheck_plugin_description* sharpcheck_plugin_info(void);

/* Required when softmax_formats != 0: softmax of each of `rows` rows of `n` logits. */
int sharpcheck_softmax(uint32_t format, const void* logits, void* out, size_t rows, size_t n, float scale);

/* Required when attention_formats != 0: one head, q (queries x dim), k (keys x dim),
 * v (keys x value_dim), out (queries x value_dim); causal = top-left aligned mask. */
int sharpcheck_attention(uint32_t format, const void* q, const void* k, const void* v, void* out,
                         size_t queries, size_t keys, size_t dim, size_t value_dim, float scale, int causal);

#ifdef __cplusplus
}
#endif

#endif /* SHARPCHECK_PLUGIN_ABI_H */
