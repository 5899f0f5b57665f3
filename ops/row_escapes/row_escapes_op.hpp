// The escapes from softmax's dispersion that act on one row of logits (reference/
// dispersion_escapes.hpp): adaptive temperature, SSMax, length-scaled logits, sigmoid attention and
// stick-breaking attention. Each is its own operation; they share the softmax rows' machinery
// (ops/softmax/softmax_op.hpp) and differ in the reference, the kernels and the default entry.
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation adaptive_temperature_operation;
extern const gate::Operation scalable_softmax_operation;
extern const gate::Operation length_scaled_softmax_operation;
extern const gate::Operation sigmoid_attention_operation;
extern const gate::Operation stick_breaking_operation;

}  // namespace sharpcheck::ops
