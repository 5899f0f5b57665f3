// The gate's problems for linear, selective and Differential attention (issue 19): each a function
// of (kind, format, seed), entries values of the format. They stress what each operator's port can
// get wrong: linear attention's feature map on negative and outlying scores (where elu without +1
// cancels), selective attention's row shift (strong selections from one token), and Differential
// attention's subtraction when lambda > 1 and the two softmaxes nearly agree.
#pragma once

#include <cstdint>
#include <string_view>

#include "formats/float_format.hpp"
#include "tensor/escape_problem.hpp"

namespace sharpcheck::inputs {

enum class EscapeKind {
  linear_normal,            // 32 queries x 64 keys, d = dv = 16, N(0, 1), all keys
  linear_causal_outliers,   // 64 x 64 causal, 1% of Q and K entries times 10..100
  selective_head0,          // n = 64, logits 2 q.k / sqrt(16), head 0 selects with its own logits
  selective_strong,         // n = 64, a separate selection with 5% of its entries 2..6
  differential_normal,      // 32 x 64, logits N(0, 4), lambda 0.35
  differential_cancelling,  // 32 x 64, z2 = z1 + N(0, 0.1^2), lambda 1.25: the weights nearly cancel
};

inline constexpr EscapeKind all_escape_kinds[] = {
    EscapeKind::linear_normal,    EscapeKind::linear_causal_outliers, EscapeKind::selective_head0,
    EscapeKind::selective_strong, EscapeKind::differential_normal,    EscapeKind::differential_cancelling};

[[nodiscard]] std::string_view escape_kind_name(EscapeKind kind);
[[nodiscard]] tensor::EscapeOperation escape_kind_operation(EscapeKind kind);
// The keys per row (n in the gate's case id).
[[nodiscard]] std::size_t escape_kind_keys(EscapeKind kind);
[[nodiscard]] tensor::EscapeProblem make_escape_problem(EscapeKind kind, const FloatFormat& format,
                                                        std::uint64_t seed);

}  // namespace sharpcheck::inputs
