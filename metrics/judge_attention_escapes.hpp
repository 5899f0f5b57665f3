// The verdict on a linear, selective or Differential attention kernel (kernels/
// attention_escape_kernels.hpp): its results against the correctly rounded reference
// (reference/attention_escapes.hpp), each element within an allowance derived in the .cpp from the
// fp32 arithmetic every such kernel does, plus the output format's rounding (2 u_out |expected|).
#pragma once

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "metrics/comparison.hpp"
#include "tensor/escape_problem.hpp"

namespace sharpcheck::metrics {

struct EscapeJudgement {
  Matrix expected;  // the reference: linear attention's outputs, or the weights
  Comparison comparison;
};

// InputError as the reference's for bad problems; a result of the wrong shape is an InputError too.
[[nodiscard]] EscapeJudgement judge_attention_escape(const tensor::EscapeProblem& problem,
                                                     const FloatFormat& output, const Matrix& actual);

// The fp32 arithmetic allowance of each element (absolute), before the output rounding.
[[nodiscard]] Matrix escape_arithmetic_allowance(const tensor::EscapeProblem& problem);

}  // namespace sharpcheck::metrics
