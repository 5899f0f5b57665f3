// The escapes from dispersion that act on whole attention matrices (tensor/escape_problem.hpp):
// linear attention (no softmax), selective attention (logits less a running selection penalty)
// and Differential attention (the difference of two softmaxes). Each is its own operation: the
// registry's kernels (kernels/attention_escape_kernels.hpp) on their problems
// (inputs/attention_escape_cases.hpp), and one head's matrices computed elsewhere judged by
// metrics/judge_attention_escapes.hpp.
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation linear_attention_operation;
extern const gate::Operation selective_attention_operation;
extern const gate::Operation differential_attention_operation;

}  // namespace sharpcheck::ops
