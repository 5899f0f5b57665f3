// The registry: one line per operation, in the gate's sweep order.
#include "ops/registry.hpp"

#include "ops/attention/attention_op.hpp"
#include "ops/attention_backward/attention_backward_op.hpp"
#include "ops/attention_escapes/attention_escapes_op.hpp"
#include "ops/attention_merge/attention_merge_op.hpp"
#include "ops/paged_attention/paged_attention_op.hpp"
#include "ops/row_escapes/row_escapes_op.hpp"
#include "ops/softmax/softmax_op.hpp"
#include "ops/softmax_backward/softmax_backward_op.hpp"

namespace sharpcheck::ops {
namespace {

const gate::Operation* const operations[] = {
    &softmax_operation,
    &log_softmax_operation,
    &adaptive_temperature_operation,
    &scalable_softmax_operation,
    &length_scaled_softmax_operation,
    &sigmoid_attention_operation,
    &stick_breaking_operation,
    &attention_operation,
    &softmax_backward_operation,
    &log_softmax_backward_operation,
    &linear_attention_operation,
    &selective_attention_operation,
    &differential_attention_operation,
    &attention_backward_operation,
    &attention_merge_operation,
    &paged_attention_operation,
};

}  // namespace

std::span<const gate::Operation* const> all_operations() { return operations; }

}  // namespace sharpcheck::ops
