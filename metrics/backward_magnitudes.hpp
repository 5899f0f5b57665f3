// What each attention-backward gradient element's allowance is relative to (internal to
// metrics/judge_backward.cpp): its magnitude (kernels/tolerance.hpp), what an error of D moves it
// by, the statistical spreads and subnormal floors of a recipe's intermediate roundings, the
// scores' roundings and the gradient-scale test's sums, all in double (relative error below
// 1e-12 for the sizes judged, covered by the 1e-9 they are inflated by).
#pragma once

#include <vector>

#include "core/matrix.hpp"
#include "kernels/attention_backward.hpp"
#include "reference/attention_backward.hpp"

namespace sharpcheck::metrics {

struct Magnitudes {
  Matrix dq, dk, dv;
  // What each element's own fp32 accumulation sums: sum_j |dS_ij| dz/dr |k_jc| (dK: over queries
  // with |q_ic|), the exact |dS| (the kernel's is within the entry's allowance of it); dV's is dv.
  Matrix dq_accumulated, dk_accumulated;
  Matrix d_sinks;  // group x 1
  // What an error of D_i by u_out sum_c |dO_ic O_ic| (O rounded to the format) moves each
  // gradient by, over u_out: dV does not depend on D.
  Matrix dq_from_d, dk_from_d;
  Matrix d_sinks_from_d;
  Matrix d_rows, d_rows_from_o;  // D_i's own: A_i, and B_i = sum_c |dO_ic O_ic|
  // The statistical spreads of a recipe's k intermediate roundings (metrics/recipes.cpp), over
  // u_i: Hoeffding's sums of squares of each rounding's bound, square roots taken at the end. dS's
  // rounding moves dQ_ic by at most u_i |dS~_ij| dz/dr |k_jc|; the kernel's fp32 dS~ is within the
  // fp32 entry's allowance of the exact dS_ij, so u_i |dS~_ij| <= u_i |dS_ij| + u_i (that
  // allowance), and the second part is covered by the entry's margins (every count there is at
  // least twice what its derivation needs): the sum is (dS_ij dz/dr)^2 k_jc^2 with the exact dS.
  // The math path's roundings of P and dP move dS by up to its bound mag_ij (not |dS_ij|): each of
  // the other k - 1 adds mag_ij^2 k_jc^2. dK likewise over queries with q_ic. dV = P^T dO depends
  // on P's one rounding only: P_ij^2 dO_ic^2.
  // The math path (k = 3) replaces dQ's and dK's by the roundings' exact first-order coefficients
  // (block_exact_terms in backward_magnitudes.cpp), plus (growth - 1) times the bounds' spread
  // for the coefficients' change under the scores' perturbation.
  Matrix dq_spread, dk_spread, dv_spread;
  Matrix dq_spread_exact, dk_spread_exact;  // the exact coefficients' sums (empty unless k = 3)
  // Below its format's normal range a rounding errs absolutely, by up to half the subnormal step f
  // (fp16's 2^-25; P and dS near 0 are common): P's moves dV_jc by at most f sum_i |dO_ic|, dS's
  // moves dQ_ic by f sum_j dz/dr |k_jc| and dK_jc by f sum_i dz/dr |q_ic| (dP's, in the math
  // path, by P_ij f <= f as well; P's, rounded before dS there, by f (|dP_ij| + A_i + |g_i| +
  // P_ij sum_k |dP_ik|) dz/dr: block_pair_terms adds that share, over k). These sums, charged as k f times
  // them.
  Matrix dq_floor, dk_floor, dv_floor;
  // A soft-cap's slope 1 - t^2, t = tanh(s / cap), as the kernel forms it errs absolutely, by
  // |t'^2 - t^2| <= dt (2 |t| + dt) with dt what the kernel's score roundings, the quotient's and the
  // tanh's own (F's where the recipe rounds each step to F; 2^-20 in fp32) move t by, plus fp32's
  // 2^-20 (cap_slope_error in backward_emulation.cpp): relative to the slope it is unbounded where
  // t rounds to 1 (a sharp head, the kernel's slope 0 where the exact one is 1e-12). That error,
  // times the pair's |P (dP - D + g)| (with 2^-8 of its magnitude for the kernel's own deviation)
  // and |scale / theta|, summed as the gradients sum dS: an absolute allowance of dQ and dK (0
  // without a cap).
  Matrix dq_slope, dk_slope;
  // A GQA group (empty for one head): per element, the sum over the group's heads of |dK_h| and
  // |dV_h|, each head's own signed gradient. A kernel may round each head's dK and dV to the output
  // format before summing them over the group (autograd back through repeat_interleave, FlashAttention
  // 2's dk_expanded), up to u_out times these in all; charged in full, as the element tier's absolute
  // part: for a group of at most 64 heads no smaller than lambda times their Hoeffding root, and
  // right where the heads are alike (identical query heads round alike, as one error G times over).
  // The math path (autograd back through repeat_interleave, torch's index_add) also sums the heads'
  // gradients in the output format in the group's order: each partial sum |S_h|, h >= 2, is added.
  // An order other than the heads' (CUDA's atomics) is not covered.
  Matrix dk_heads, dv_heads;
  // The gradient-scale test's sums of squares (judge_gradient_scale): the intermediate roundings
  // projected on each gradient's signs, and D's errors (one per query row) likewise.
  double dq_scale_inside = 0, dk_scale_inside = 0, dv_scale_inside = 0;
  // The same projections' worst case, sum of |projection| (over u_i): where few roundings are
  // independent (repeated tokens round alike), smaller than lambda times the root.
  double dq_scale_inside_linear = 0, dk_scale_inside_linear = 0, dv_scale_inside_linear = 0;
  double dq_scale_from_d = 0, dk_scale_from_d = 0;
  // The same for the fp32 arithmetic's errors, each bounded relative to its pair's magnitude
  // (mag_ij for dQ and dK, P_ij for dV) times the fp32 units: one error per (i, j) pair
  // (sum of (mag_ij on_ij)^2) and one shared by query row i's pairs (L_i, D_i: sum over i of
  // (sum_j mag_ij |on_ij|)^2), on_ij the pair's projection on the gradient's signs.
  double dq_scale_pairs = 0, dk_scale_pairs = 0, dv_scale_pairs = 0;
  double dq_scale_rows = 0, dk_scale_rows = 0, dv_scale_rows = 0;
  // The pairs' and rows' sums split by what each fp32 error scales (judge_backward.cpp's
  // with_split_pairs), for a D formed from O: P's and dS's own errors scale the pair's dS_ij (sum
  // of (|dS_ij| on_ij)^2), dP's dot product errs relative to P_ij sum_c |dO_ic v_jc| dz/dr (`dp`),
  // and their products with D's error from O's rounding relative to P_ij B_i dz/dr (`from_d`); a
  // row's LSE error scales its dS, and D's error from the forward's scores is centred (row_shared:
  // `rows_centred`), the forward's other errors relative to A_i (`rows_rest`). dQ's and dK's (dV's
  // pairs are P's already).
  struct SplitPairs {
    double ds = 0, dp = 0, from_d = 0, rows_centred = 0, rows_rest = 0;
  };
  SplitPairs dq_scale_split, dk_scale_split;
  // A recipe's score roundings (add_score_terms), per element: the Hoeffding spread (over
  // 2.0001 u_S) and the second-order part; empty when the recipe keeps the scores in fp32. And the
  // largest |z| of a non-negligible pair.
  Matrix dq_scores, dk_scores, dv_scores, dq_scores_second, dk_scores_second, dv_scores_second;
  // Emulated scores only (EmulatedScoreSlack): the slack's first order in the worst case, summed
  // with every sign against the kernel, and its second order key by key (add_slack_terms derives
  // both); dQ's first order lacks its part through the row's mean slack, |dQ_ic| slack_mean_i,
  // which the judgement adds with the centre's dQ. Where few scores are ambiguous these are far
  // below Hoeffding's lambda root of the same perturbations and the row's largest slack's second order.
  Matrix dq_slack_worst, dk_slack_worst, dv_slack_worst, dq_slack_second, dk_slack_second, dv_slack_second;
  std::vector<double> slack_mean;  // per query row: sum_l P_il slack_il
  std::vector<double> row_copies;  // per query row: how many rows are its copies (PairBlock::copies)
  // The same roundings projected on each gradient's signs, for the gradient-scale test
  // (backward_score_terms.cpp derives each part); not known (`scale_scores_known` false) with a
  // soft-cap, whose dz/dr moves with the scores: the test then charges the scores' worst case in full.
  struct ScaleScoreTerms {
    double first = 0;   // the first order's Hoeffding sum of squares (coefficient times eps_ij)^2
    double second = 0;  // the second order's bound, charged in full
    double growth = 0;  // the growth of dS's rounding coefficient: sum of squares, over u_i^2
  };
  ScaleScoreTerms dq_scale_scores, dk_scale_scores, dv_scale_scores;
  bool scale_scores_charged = false;  // the sums above were formed (a recipe rounds the scores)
  bool scale_scores_known = true;
  double scale_growth = 1;  // the other roundings' coefficients grow by at most this factor
  struct ExactSums {  // the math path's roundings with exact coefficients (backward_blocks::exact_inside)
    double squares = 0, cross = 0;
  };
  ExactSums dq_scale_exact, dk_scale_exact;  // summed over the rows: the gradient-scale test's
  // The D-direction test (judge_backward.cpp): an error delta_i of D_i moves dQ_i by exactly
  // -delta_i w_i, w_i = sum_j P_ij dz/dr k_j (row i of `dq_direction`); each row's error is
  // projected on w_i, and the noise sums are the gradient-scale test's for that one row with the
  // pair projections on_ij = w_i . k_j in place of the signs'.
  struct ProjectedSums {
    double inside = 0, from_d = 0, pairs = 0, rows = 0;
    SplitPairs split;
    ScaleScoreTerms scores;
    ExactSums exact;
  };
  Matrix dq_direction;
  std::vector<ProjectedSums> d_direction;  // per query row
  // A GQA group's dQ sums per query head (empty for one head): the gradient-scale test judges each
  // head's dQ as well as the group's, where a bug in one head's dQ is diluted by the group's size
  // (a trial's dQ x 1.02 on one head of eight passed at 0.62; alone it failed at 3.1).
  struct ScaleSums {
    double inside = 0, inside_linear = 0, from_d = 0, pairs = 0, rows = 0;
    SplitPairs split;
    ScaleScoreTerms scores;
    ExactSums exact;
  };
  std::vector<ScaleSums> dq_scale_heads;
  double ds_roundings = 1;  // the most roundings of dS of any head (PairBlock::ds_roundings)
  double largest_z = 0;
  double logit_rounding = 0, largest_lse = 0, largest_gap = 0;
  // logit_rounding's two parts, each its own maximum over the pairs: the fp32 dot product's worst
  // case d sum_t |q_t k_t| |scale / theta| and the rest (4 |z| + 2 |b / theta|). The projected
  // tests charge the dot product by its d roundings' Hoeffding root (judge_backward.cpp).
  double logit_dot = 0, logit_rest = 0;
};

// dQ's gradient-scale sums of the whole (the group's) as one Magnitudes::ScaleSums.
[[nodiscard]] Magnitudes::ScaleSums dq_scale_sums(const Magnitudes& m);

// The math path's scores as a judgement emulates them (judge_backward.cpp, metrics/score_emulation.hpp):
// the problem's logits are then the emulated scores, and per head of the group (positions x keys,
// row-major) the slack: how far an honest kernel's score may lie from them (ScoreEmulator's
// ambiguity, 0 for most). The projected tests charge the slack as they charge the scores'
// roundings (eps_ij = slack_ij in place of 2.0001 u_S |z_ij|); the element-wise sums of the
// scores' roundings are not formed.
struct EmulatedScoreSlack {
  std::vector<std::vector<double>> per_head;
  // dS's roundings (PairBlock::ds_roundings): 2 where autograd multiplies dS by an inexact scale
  // (the product then the scale), else 1; the scale alone cannot tell (a prescaled chain's s').
  // A soft-cap adds its backward's: the slope's product, and c's two where c is inexact
  // (each step in F), or the one rounding back to F (the cap in fp32).
  double ds_roundings = 1;
  // A soft-capped head's slope 1 - t^2 per pair (per head, positions x keys; empty without a cap):
  // dz/dr is then s' times it, not s', and every charge through dS follows.
  std::vector<std::vector<double>> slopes;
};

// The math path's roundings' products with n roundings of dS, over u_i^2 mag_ij (to within a factor
// 1 + u_i): P's and dP's with each other and D's (3), each of dS's with the first order before it
// (3 n), dS's with one another (n (n - 1) / 2). 6 for one, 10 for two (an inexact scale).
[[nodiscard]] inline double second_order_of_ds(double n) { return 3 + 3 * n + n * (n - 1) / 2; }

// u_s, u_i: the unit roundoffs of a recipe's score and intermediate roundings (0: none);
// roundings: how many intermediates it rounds (k); emulated: the scores' slack when the
// problem's logits are a math path's emulated scores (u_s is then 0); copies_from: the problem whose
// rows and keys tell which pairs repeat (the emulated problem's source: its scores carry a bias).
[[nodiscard]] Magnitudes magnitudes_of(const kernels::BackwardProblem& p,
                                       const reference::AttentionGradients& e, double u_s, double u_i,
                                       double roundings, const EmulatedScoreSlack* emulated = nullptr,
                                       const kernels::BackwardProblem* copies_from = nullptr);

}  // namespace sharpcheck::metrics
