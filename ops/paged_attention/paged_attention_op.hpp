// paged_attention: attention whose keys and values live in a paged KV cache, as serving kernels
// read them (vLLM and FlashAttention's kvcache path, FlashInfer, SGLang): the cache is pages of
// `page` slots, [pages, page, H_kv, D] (NHD) or [pages, H_kv, page, D] (HND), and each sequence
// names its pages either by a block table, `block_table [B, max_pages]` with `seq_lens [B]`
// (vLLM, FlashAttention), or by FlashInfer's `kv_indptr [B + 1]`, `kv_indices` and
// `kv_last_page_len [B]`. The queries are packed, `q [T, H, D]` with `cu_seqlens_q` (default: one
// query per sequence, decode); several queries of a sequence are its last ones (speculative decode,
// chunked prefill), so the causal and window diagonals are aligned bottom-right.
//
// The judgement gathers each sequence's keys and values from its pages in order, checking every
// page id against the cache (a read past the cache or past the block table is an InputError naming
// the element), and judges the packed problem with attention's judge and recipes: the reference
// is the gathered contiguous problem's, bit for bit. Slots the sequences do not reach (unreferenced
// pages, the tail of each last page) are never read, so NaN there (as the gate's sweep puts) can
// reach the output only through a kernel that reads them.
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation paged_attention_operation;

}  // namespace sharpcheck::ops
