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
#include "reference/double_stage_row.hpp"
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

// The attention rows' double stage (reference/attention_double_block.hpp runs it for a block of
// query rows, its sums over keys as BLAS products) is built from these pieces, proved in
// double_stage.cpp, one row at a time. With the same contract: weights, outputs and the
// log-sum-exp are written and their done flags set where decided. Nothing is decided if a logit or
// product overflows double, or for soft-capped rows.

// Whether the stage can decide anything of this row: a target of at most 24 bits, rounding to
// nearest, some key seen, no soft-cap.
[[nodiscard]] bool attention_double_stage_applies(const AttentionRow& source, const FloatFormat& target);

// The row's logits and their errors into `row` from each active key's q . k and sum_t |q_t k_t|,
// both summed in double in any order; false when the stage cannot take the row.
bool bound_attention_logits(const AttentionRow& source, std::span<const double> dots,
                            std::span<const double> absolutes, AttentionRowInDouble& row);

// After bound_attention_exponentials: the coefficients (where asked for), the outputs from
// numerators[c] = sum_j w_j v_jc and magnitudes[c] = sum_j |w_j v_jc| (over the active keys, any
// order), and the log-sum-exp (count: the row's entries, sink included).
void decide_attention_weights(const AttentionRow& source, const FloatFormat& target,
                              const AttentionRowInDouble& row, AttentionRowResults& results);
void decide_attention_outputs(const AttentionRow& source, const FloatFormat& target,
                              const AttentionRowInDouble& row, std::span<const double> numerators,
                              std::span<const double> magnitudes, AttentionRowResults& results);
void decide_lse_in_double(const AttentionRowInDouble& row, std::size_t count, AttentionRowResults& results);

}  // namespace sharpcheck::reference
