// attention's optional max_logit output (QK-Clip's input; Transformer Engine's and MagiAttention's
// max_logit): each query head's largest scaled score scale * q . k over the pairs it sees, before
// soft-cap, bias and temperature, as [H] (over the whole batch) or [B, H] (per batch element),
// stored in fp32. Judged against reference/max_logit.hpp's correctly rounded value.
//
// Allowance (proven): a kernel forming each score in fp32 (any summation order, fused or not;
// products of bf16/fp16/fp32 inputs) is off by at most b_ij = gamma_{d+3} sum_t |q_t k_t| |scale|,
// gamma_n = n u / (1 - n u), u = 2^-24 (the dot's gamma_d, the scale's two roundings when it is
// formed as 1/sqrtf(d), and the product's), so its maximum lies in [max (s_ij - b_ij),
// max (s_ij + b_ij)]: one pair with large magnitudes and a low score widens neither end. Allowed:
// up to that interval's ends on either side of the reference, plus half an fp32 ulp of the
// reference for its own rounding. A max taken before the scale, over masked keys, after the
// soft-cap, in log2 units or per query lies far outside.
#pragma once

#include "gate/cases.hpp"
#include "gate/judge_arrays.hpp"

namespace sharpcheck::ops {

// Judges `given` (the max_logit array) for the problem of `arrays` under `options`: folds its
// comparison into outcome.comparison (the worst element is max_logit's when its ratio is the
// largest), adds a "max_logit" tensor verdict, and a failure naming the head when an element is
// outside its allowance. InputError for a shape other than [H] or [B, H].
void judge_max_logit(const gate::JudgeOptions& options, const gate::AttentionArrays& arrays,
                     const gate::Array& given, gate::CaseOutcome& outcome);

}  // namespace sharpcheck::ops
