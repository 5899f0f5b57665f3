// The softmax double stage's two loops over a row, vectorised with Highway (compiled once per SIMD
// target, the best one the CPU has chosen at run time). Each lane computes exactly what the scalar
// formulas of reference/double_stage.cpp compute, operation for operation and rounding for rounding
// (no fused multiply-add: the file is built with -ffp-contract=off), so the proofs there cover these
// results too; tests/reference_stages_test.cpp checks the lanes against the scalar code bit for bit
// on every compiled target.
#pragma once

#include <cstddef>
#include <span>

namespace sharpcheck::reference {

// certified_exp of each x (-708 <= x <= 0), lane by lane; out may alias x.
void certified_exp_many(std::span<const double> x, std::span<double> out);

// What the exponentiation pass found.
struct ShiftedExponentials {
  bool finite = true;            // false: some difference e_j - shift overflowed (the stage stands aside)
  double largest_magnitude = 0;  // the largest |z_j| over the entries that were exponentiated
  std::size_t tiny = 0;          // entries with z_j < -700: weight 0, bounded as an absolute term
};

// z_j = (e_j - shift) / theta, magnitudes[j] = |z_j|, weights[j] = certified_exp(min(z_j, 0)) or 0
// for z_j < -700. The spans have equal lengths.
ShiftedExponentials exponentiate_shifted(std::span<const double> logits, double shift, double theta,
                                         std::span<double> weights, std::span<double> magnitudes);

// The coefficient intervals of the double stage: with error_j = (certified_exp_error + 2.01 u
// magnitudes[j] + shared) (1 + 2^-20) and c_j = weights[j] / sum, [c_j (1 - error_j - 4u),
// c_j (1 + error_j + 4u)], or [0, 2^-1008] where weights[j] = 0.
void bracket_coefficients(std::span<const double> weights, std::span<const double> magnitudes, double sum,
                          double shared, std::span<double> low, std::span<double> high);

// The same intervals rounded to fp32 (to nearest even): values[j] is the fp32 value both ends round
// to, or NaN where they round apart (undecided). Returns how many were decided.
std::size_t decide_coefficients_in_fp32(std::span<const double> weights, std::span<const double> magnitudes,
                                        double sum, double shared, std::span<double> values);

}  // namespace sharpcheck::reference
