// The attention backward's first stage: dQ, dK, dV, D and the sinks' gradients in double, each with
// a certified error bound, decided where the whole interval rounds to one value of the target
// (fp32 and narrower). It changes cost, never results: whatever it leaves undecided goes on to the
// ball stage and the Ziv loop of reference/attention_backward.cpp, which decide it as before.
//
// How: per query head, blocks of query rows. The scores Q K^T and dP = dO V^T are BLAS products
// whose errors are bounded by the products of their magnitudes |Q| |K|^T and |dO| |V|^T;
// each row's softmax uses the forward's proven pieces (reference/double_stage_row.hpp); D, dS and
// dR carry absolute error bounds term by term (written beside the code); and dQ = dR K,
// dK = dR^T Q, dV = P^T dO are enclosed products (reference/enclosed_product.hpp). Each result's
// interval [mid - r, mid + r] is rounded at both ends; a result whose ends round to a zero is +0,
// as the ball stage returns it (the sign of such a zero is not claimed).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "formats/float_format.hpp"
#include "reference/attention_backward.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

// One flag vector per result, in the order dQ, dK, dV, dsink, D (attention_backward.cpp's order).
using BackwardDecided = std::vector<std::vector<bool>>;

// An enclosure of every result: midpoints in `values` (shaped as AttentionGradients) and radii.
struct BackwardEnclosures {
  AttentionGradients values;
  AttentionGradients radii;
};

// Every result's enclosure in double, or nothing when this stage stands aside: a soft-capped head
// (tanh has no certified double version here), a logit, product or sum that leaves double's range,
// or a logit whose error bound exceeds 2^-30. `heads` are the group's heads as in.head(h) gives
// them; the checks of attention_backward() have passed. `gamma_scale` is 1; tests set it to 0 to
// show that forgetting the products' rounding breaks the enclosures.
[[nodiscard]] std::optional<BackwardEnclosures> enclose_backward_in_double(
    const AttentionBackwardInputs& in, std::span<const tensor::HeadScores> heads, double gamma_scale = 1);

// Decides what the enclosures decide for a target of at most 24 bits rounded to nearest (D in
// d_format(target)), writing the values into `out` and setting their flags; returns how many.
std::size_t decide_backward_in_double(const AttentionBackwardInputs& in,
                                      std::span<const tensor::HeadScores> heads, const FloatFormat& target,
                                      AttentionGradients& out, BackwardDecided& done);

}  // namespace sharpcheck::reference
