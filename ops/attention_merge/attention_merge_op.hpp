// attention_merge: the merge of k partial attention states (o_i, lse_i), as split-KV combines,
// cascade (shared-prefix) attention and context parallelism compute it:
//   o = sum_i exp(lse_i - L) o_i,  L = logsumexp_i lse_i,
// with an empty partial (no key) marked by lse_i = -inf (FlashAttention 4, FlashInfer) or by
// either infinity (vLLM's +inf), its o_i ignored. The merge is exactly a one-query attention whose
// scores are the partial LSEs and whose values are the partial outputs, so its correctly rounded
// reference, its allowance (the attention_fp32 recipe: the kernel computes exp(lse_i - L) and the
// sums in fp32, as attention computes exp(s_j - m)) and its judge are attention's, reached through
// that identity (issue 35).
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation attention_merge_operation;

// The merge sweep for a kernel outside the gate (ops/attention_merge/merge_cases.cpp).
[[nodiscard]] std::vector<gate::ExternalCase> merge_external_cases(const gate::ExternalSweep& sweep);

}  // namespace sharpcheck::ops
