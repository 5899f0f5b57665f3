// The forward attention reference's double stage for a block of query rows of one head: the sums
// over keys of every row at once as BLAS products, the bounds row by row (double_stage.hpp).
//
// The products: q . k and sum_t |q_t k_t| of every (row, key) pair of the block as Q K^T and
// |Q| |K|^T over the keys the block's rows see; then, after each row's logits, exponentials w and
// bounded sum (bound_attention_exponentials), sum_j w_j v_jc and sum_j |w_j v_jc| as W V and W |V|,
// W holding each row's exponentials at its keys and 0 at the keys it does not see. Every bound the
// row stage uses holds for a sum computed in any order, with or without fused multiply-adds
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.1 and 4.2), and a zero term
// adds nothing, so a product of the BLAS (a classical blocked triple loop: reference/enclosed_product.hpp
// says which are admissible) stands in for the row's own loops with the same bounds, and the
// results, correctly rounded, are the same.
#pragma once

#include <span>

#include "formats/float_format.hpp"
#include "reference/attention_row.hpp"

namespace sharpcheck::reference {

// rows[r] and results[r] for each row of the block: rows of one head (the same keys, values and
// scores), each with its own query and active keys, as many as rows_per_block allows for the keys
// they see (reference/enclosed_product.hpp). Callers that run blocks in parallel hold a
// SingleThreadedBlas around them (reference/enclosed_product.hpp).
void decide_attention_block_in_double(std::span<const AttentionRow> rows, const FloatFormat& target,
                                      std::span<AttentionRowResults> results);

}  // namespace sharpcheck::reference
