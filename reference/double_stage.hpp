// The reference's cheapest stage: softmax in double precision with a proven error bound per
// element. An element is decided when its whole error interval rounds to one value of the target
// format; the rest go on to the Arb ball stage and then the MPFR Ziv loop, so this stage changes
// cost, never results. It serves targets of at most 24 bits (fp32 and narrower), whose rounding
// boundaries the double result misses by far more than its error on almost every input.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/attention_row.hpp"
#include "reference/input_checks.hpp"

namespace sharpcheck::reference {

// e^x for -708 <= x <= 0, with relative error below certified_exp_error (the proof is in
// double_stage.cpp; tests check it against MPFR, including the worst cases of the reduction).
[[nodiscard]] double certified_exp(double x);
inline constexpr double certified_exp_error = 0x1p-47;

// Decides what it can of the row's softmax coefficients in double, the row's first stage (decided is
// all false on entry). Writes result[row.active[a]] and sets decided[a] for each decided coefficient;
// returns how many. Decides nothing unless the target has at most 24 bits of precision and the
// rounding mode is to nearest (the bound assumes it). The loops over the row run in SIMD
// (reference/double_stage_simd.hpp), lane for lane the formulas proved in double_stage.cpp.
std::size_t decide_softmax_in_double(std::span<const double> logits, const PreparedRow& row, double theta,
                                     const FloatFormat& target, std::span<double> result,
                                     std::vector<bool>& decided);

// One attention query row in double (reference/attention_row.hpp), with the same contract:
// weights and outputs are written and their done flags set where decided. Decides nothing if a
// logit or product overflows double, or for soft-capped rows; never the log-sum-exp.
void decide_attention_row_in_double(const AttentionRow& row, const FloatFormat& target,
                                    AttentionRowResults& results);

}  // namespace sharpcheck::reference
