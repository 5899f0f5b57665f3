// softmax_backward and log_softmax_backward over rows (PyTorch's _softmax_backward_data and
// _log_softmax_backward_data at theta = 1, from the logits): the registry's kernels
// (kernels/softmax_backward.hpp) on every row kind with a fully masked second row, and gradients
// computed elsewhere judged along a dim against reference/softmax_backward.hpp.
#pragma once

#include "gate/operation.hpp"

namespace sharpcheck::ops {

extern const gate::Operation softmax_backward_operation;
extern const gate::Operation log_softmax_backward_operation;

}  // namespace sharpcheck::ops
