// The attention backward's rational results, found and computed exactly: the exact stage of
// reference/attention_backward.cpp, for the results Ziv's loop can never decide because they lie
// exactly on a rounding boundary (a tie), such as dV = (dO_1 + dO_2) / 2 when q = 0 makes every
// probability 1/2.
//
// Which results are rational, and why the rules below find them (definitions as in
// reference/attention_backward.hpp). Entry j of query row i has the logit
// z_ij = (s a_ij + b_ij) / theta (a_ij = q_i . k_j rational, b_ij the exact bias, s the scale;
// with a soft-cap, cap tanh(s a_ij / cap) + b_ij in place of s a_ij + b_ij), a sink being one more
// entry with a = 0, b = sink and no value. By Lindemann-Weierstrass (reference/attention_exact.cpp),
// P_ij = e^{z_ij} / sum_k e^{z_ik} is rational exactly when every entry of the row has the same
// logit ("one group"), and is then 1 / (entries). So, term by term:
//  - D_i = sum_j P_ij dP_ij is rational in a one-group row (the mean of dP), and in any row whose
//    dP are all equal (that value; the sink's dP is 0);
//  - dz_ij = P_ij (dP_ij - D_i + g_i) is rational when D_i is and either the bracket is 0 (dz = 0)
//    or the row is one group;
//  - dr_ij = dz_ij dz/dr is rational when dz_ij = 0, or the row is one group and dz/dr = s / theta
//    is rational (s a given scale or 1/sqrt(d) with d a square; with a soft-cap, also s a_ij = 0);
//  - dQ, dK, dV and the sink's gradient are sums of such terms (times exact inputs): rational
//    when every term is, a term with a zero input factor being 0 whatever its weight.
// Completeness: a sum of irrational terms can still be rational (terms of two rows cancelling,
// or a multi-group row whose groups have equal means), and those are not found here; such a
// result, if it is a tie, reaches Ziv's cap and the call refuses (UndecidedRounding), never
// guesses. Every value returned is exact: it is computed in GMP rationals from the inputs.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "core/rational.hpp"
#include "tensor/backward_problem.hpp"
#include "tensor/head_scores.hpp"

namespace sharpcheck::reference {

class BackwardExactCases {
 public:
  // `heads` are in.head(h) for every query head of the group (lengths filled in).
  BackwardExactCases(const tensor::AttentionBackwardProblem& in,
                     const std::vector<tensor::HeadScores>& heads);

  // Each result exactly, when the rules above make it rational; nullopt otherwise.
  [[nodiscard]] std::optional<Rational> d_value(std::size_t j, std::size_t c);
  [[nodiscard]] std::optional<Rational> d_row(std::size_t i);
  [[nodiscard]] std::optional<Rational> d_sink(std::size_t h);
  // The dQ and dK elements not yet `decided` (flags per element, row-major), each exactly where the
  // rules above make it rational (nullopt otherwise), row by row: a row's dr_ij is formed once for
  // all its keys and shared by its dQ elements and its keys' dK. Element by element each dr was formed
  // d times over for dQ and again for dK: on a head of equal keys (every dQ exactly 0, a tie
  // everywhere) that took 32 s at 160 queries and keys, and over 20 minutes at 333.
  struct Products {
    std::vector<std::optional<Rational>> d_queries, d_keys;
  };
  [[nodiscard]] Products d_products(const std::vector<bool>& dq_decided, const std::vector<bool>& dk_decided);

 private:
  struct Row {
    bool analysed = false;
    bool one_group = false;
    std::size_t entries = 0;        // visible keys, plus the sink
    std::optional<Rational> d;      // D_i when rational
    std::optional<Rational> slope;  // dz/dr = s / theta, in a one-group row where it is rational
  };
  const Row& row(std::size_t i);
  [[nodiscard]] bool visible(std::size_t i, std::size_t j) const;
  [[nodiscard]] bool clearly_two_groups(std::size_t i, const std::vector<std::size_t>& keys) const;
  [[nodiscard]] bool one_group(std::size_t i, const std::vector<std::size_t>& keys,
                               Rational& common_dot) const;
  [[nodiscard]] Rational d_prob(std::size_t i, std::size_t j) const;  // dP_ij = dO_i . v_j
  [[nodiscard]] std::optional<Rational> common_d_prob(std::size_t i, const std::vector<std::size_t>& keys,
                                                      bool sink) const;
  [[nodiscard]] std::optional<Rational> d_logit(std::size_t i, std::size_t j);  // dz_ij
  [[nodiscard]] std::optional<Rational> d_raw(std::size_t i, std::size_t j);    // dr_ij
  void analyse(std::size_t i, Row& facts);
  [[nodiscard]] std::optional<Rational> scale_of(std::size_t i) const;

  const tensor::AttentionBackwardProblem& in_;
  const std::vector<tensor::HeadScores>& heads_;
  std::vector<Row> rows_;
};

}  // namespace sharpcheck::reference
