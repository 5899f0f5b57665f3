// The correctly rounded backward pass of softmax and log-softmax for one row: the gradient with
// respect to the logits e, given the incoming gradient dy (the reference computes y itself).
//
// Definitions, with z_j = e_j / theta over the unmasked entries and y = softmax(z):
//   softmax_backward_j     = y_j (dy_j - sum_i y_i dy_i) / theta
//   log_softmax_backward_j = (dy_j - y_j sum_i dy_i) / theta
// (at theta = 1 these are PyTorch's _softmax_backward_data and _log_softmax_backward_data.)
// Masked entries (-inf logits or keep flag 0) get exactly 0, and their dy is not read.
//
// Accuracy contract: every returned value is the exact real result rounded to nearest-even in the
// target format (subnormals included), by Ziv's strategy on Arb ball enclosures at doubling
// precision. Why the loop ends (Lindemann-Weierstrass: e^{w_1}, ..., e^{w_k} are linearly
// independent over the algebraic numbers for distinct algebraic w; the z are rationals), per output:
// - One distinct unmasked logit (y = 1/k): both results are rational, computed exactly with GMP.
// - softmax_backward, two or more distinct logits: group the entries by logit value g with counts
//   k_g and c_g = sum_{i in g} (dy_j - dy_i) (exact rationals). Then the result is
//   e^{z_j} N / (theta S^2), N = sum_g c_g e^{z_g}, S = sum_g k_g e^{z_g}. It is 0 exactly when every
//   c_g = 0 (detected and returned as 0). Otherwise it is irrational: were it a rational r, then
//   sum_g c_g e^{z_j + z_g} - r theta sum_{g,h} k_g k_h e^{z_g + z_h} = 0; at the exponent 2 z_min
//   (or 2 z_max when z_j is the smallest) only the second sum contributes, with coefficient
//   -r theta k^2, so r = 0 and the result would be 0. An irrational number is no rounding boundary.
// - log_softmax_backward, two or more distinct logits: with D = sum_i dy_i = 0 the result is
//   dy_j / theta, rational, computed exactly; otherwise y_j is irrational (y_j = r would give
//   e^{z_j} - r sum_g k_g e^{z_g} = 0, impossible with a second group), so the result is too.
// - log_softmax_backward where one group of logits lies far above the rest (a spread of 1e30, or
//   theta = 1e-17): the result is r plus a tail of size about e^-gap, and when r is a rounding
//   boundary (dy of few bits make that common in fp8) no enclosure within the cap decides. The
//   tail's sign does, exactly: y_j = 1/k_G - T/(k_G (k_G + T)) in the top group G (T > 0), so the
//   tail is D T/(...theta), of sign sign(D) sign(theta), and y_j > 0 elsewhere gives the opposite
//   sign; |tail| <= |D| n e^-gap / |theta|. Where r is a representable value or a midpoint and that
//   bound is below a quarter of the spacing, r + tail rounds to r or to the neighbour on the tail's
//   side (decide_by_tails, through round_near_boundary, which attention's outputs use too).
// - A result that rounds to a zero carries the exact result's sign (an exact 0 is +0). Where its
//   enclosure holds both signs (the terms of dy_j - D or dy_j - y_j D cancel to below the pass's
//   precision), the sign is that of N_j = sum_g c_g e^{z_g} times theta's, with exact rational
//   coefficients (softmax's c_g above; log-softmax's k_g dy_j, less D in j's own group), each term
//   enclosed to relative precision; N_j is not 0 by the arguments above, so refinement ends.
// The loop is still capped (ZivSchedule) and reports UndecidedRounding past the cap, never a guess.
#pragma once

#include <span>
#include <vector>

#include "formats/float_format.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::reference {

// InputError as softmax's for the logits and theta, and for dy of another length or holding a NaN
// or an infinity at an unmasked entry (named with its index).
[[nodiscard]] std::vector<double> softmax_backward(std::span<const double> logits, std::span<const double> dy,
                                                   const FloatFormat& target, const RowOptions& options = {});
[[nodiscard]] std::vector<double> log_softmax_backward(std::span<const double> logits,
                                                       std::span<const double> dy, const FloatFormat& target,
                                                       const RowOptions& options = {});

}  // namespace sharpcheck::reference
