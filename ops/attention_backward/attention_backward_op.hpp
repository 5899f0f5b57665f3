// attention_backward: the gradients of attention (dQ, dK, dV, the sinks' and D) for every layout,
// mask and modifier of the forward; judged against reference/attention_backward.hpp under the
// backward precision recipes.
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation attention_backward_operation;

}  // namespace sharpcheck::ops
