// One problem of the matrix-level escapes from dispersion (issue 19), as the reference, the
// kernels under test, the judge and the gate share it: linear attention reads q, k, v (causal or
// not); selective attention reads `logits` and head 0's `selection` (n x n, causal); Differential
// attention reads `logits`, `logits2` and lambda. -inf logits are masked.
#pragma once

#include <string_view>

#include "core/matrix.hpp"

namespace sharpcheck::tensor {

enum class EscapeOperation { linear, selective, differential };

[[nodiscard]] constexpr std::string_view escape_operation_name(EscapeOperation op) {
  switch (op) {
    case EscapeOperation::linear:
      return "linear_attention";
    case EscapeOperation::selective:
      return "selective_attention";
    case EscapeOperation::differential:
      return "differential_attention";
  }
  return "?";
}

struct EscapeProblem {
  EscapeOperation operation = EscapeOperation::linear;
  Matrix queries, keys, values;  // linear
  bool causal = false;           // linear
  Matrix logits, selection;      // selective (logits also Differential's first)
  Matrix logits2;                // Differential's second
  double lambda = 0;             // Differential
};

}  // namespace sharpcheck::tensor
