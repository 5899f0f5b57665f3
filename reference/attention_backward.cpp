#include "reference/attention_backward.hpp"

#include <arb.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "core/parallel.hpp"
#include "reference/attention_backward_double.hpp"
#include "reference/attention_backward_exact.hpp"
#include "reference/ball_stage.hpp"
#include "reference/exact_rounding.hpp"
#include "reference/ziv_loop.hpp"

namespace sharpcheck::reference {
namespace {

void refuse(InputProblem problem, const std::string& what) {
  throw InputError(problem, "attention_backward: " + what);
}

void check_finite(const Matrix& matrix, const char* name) {
  for (std::size_t e = 0; e < matrix.values.size(); ++e) {
    if (!std::isfinite(matrix.values[e])) {
      refuse(std::isnan(matrix.values[e]) ? InputProblem::nan_value : InputProblem::non_finite_value,
             std::string(name) + " entry (" + std::to_string(e / std::max<std::size_t>(matrix.cols, 1)) +
                 ", " + std::to_string(e % std::max<std::size_t>(matrix.cols, 1)) + ") is not finite");
    }
  }
}

void check(const AttentionBackwardInputs& in) {
  const auto shape = [](const Matrix& m) { return std::to_string(m.rows) + "x" + std::to_string(m.cols); };
  if (in.keys.cols != in.queries.cols || in.values.rows != in.keys.rows || in.d_out.rows != in.queries.rows ||
      in.d_out.cols != in.values.cols || in.queries.cols == 0 || in.values.cols == 0) {
    refuse(InputProblem::shape_mismatch, "Q " + shape(in.queries) + ", K " + shape(in.keys) + ", V " +
                                             shape(in.values) + ", dO " + shape(in.d_out));
  }
  if (in.group == 0 || in.queries.rows % in.group != 0)
    refuse(InputProblem::shape_mismatch, std::to_string(in.queries.rows) + " query rows are not " +
                                             std::to_string(in.group) + " heads of equal length");
  if (!in.group_sinks.empty() && in.group_sinks.size() != in.group)
    refuse(InputProblem::shape_mismatch, "one sink per query head of the group is needed");
  if (in.scores.scale_is_ln2 || std::any_of(in.per_head.begin(), in.per_head.end(),
                                            [](const tensor::HeadScores& h) { return h.scale_is_ln2; }))
    refuse(InputProblem::out_of_range, "a scale of ln 2 (base-2 scores, a merge's) has no backward here");
  for (const double sink : in.group_sinks) {
    if (!std::isfinite(sink)) refuse(InputProblem::non_finite_value, "a sink logit is not finite");
  }
  if (!in.d_lse.empty() && in.d_lse.size() != in.queries.rows)
    refuse(InputProblem::shape_mismatch, "dLSE has " + std::to_string(in.d_lse.size()) + " entries, Q " +
                                             std::to_string(in.queries.rows) + " rows");
  check_finite(in.queries, "Q");
  check_finite(in.keys, "K");
  check_finite(in.values, "V");
  check_finite(in.d_out, "dO");
  for (std::size_t i = 0; i < in.d_lse.size(); ++i) {
    if (!std::isfinite(in.d_lse[i]))
      refuse(InputProblem::non_finite_value, "dLSE " + std::to_string(i) + " is not finite");
  }
  if (!in.per_head.empty() && in.per_head.size() != in.group)
    refuse(InputProblem::shape_mismatch, "one HeadScores per query head of the group is needed");
  for (std::size_t h = 0; h < in.group; ++h) {
    const tensor::HeadScores head = in.head(h);
    if (head.queries > in.positions() || head.keys > in.keys.rows)
      refuse(InputProblem::shape_mismatch,
             "head " + std::to_string(h) + " computes " + std::to_string(head.queries) + " queries of " +
                 std::to_string(in.positions()) + " and " + std::to_string(head.keys) + " keys of " +
                 std::to_string(in.keys.rows));
    head.validate("attention_backward head " + std::to_string(h));  // theta, cap, masks, bias
  }
}

// The inputs as exact balls, row-major like the matrices.
struct ExactBalls {
  explicit ExactBalls(const Matrix& m) : balls(m.values.size()) {
    for (std::size_t e = 0; e < m.values.size(); ++e) arb_set_d(balls[e], m.values[e]);
  }
  BallVector balls;
};

// Gradient balls of one pass; dK and dV per worker, summed afterwards.
struct GradientBalls {
  GradientBalls(std::size_t q_count, std::size_t k_count, std::size_t v_count, std::size_t queries,
                std::size_t heads)
      : dq(q_count), dk(k_count), dv(v_count), d_rows(queries), d_sinks(heads) {}
  BallVector dq, dk, dv, d_rows, d_sinks;
};

// The constants of the scores at `precision`: scale, 1/theta, the cap.
struct ScoreConstants {
  Ball scale, inverse_theta, cap;
  bool capped = false;
  ScoreConstants(const tensor::HeadScores& scores, std::size_t d, slong precision) {
    if (scores.scale) {
      arb_set_d(scale.get(), *scores.scale);
    } else {
      arb_set_ui(scale.get(), d);
      arb_rsqrt(scale.get(), scale.get(), precision);
    }
    arb_set_d(inverse_theta.get(), scores.theta);
    arb_inv(inverse_theta.get(), inverse_theta.get(), precision);
    capped = scores.softcap != 0;
    arb_set_d(cap.get(), scores.softcap);
  }
};

// What a Ziv pass computes. Once the double stage has decided nearly everything, a pass computes
// only what is left: the dQ of the rows with one undecided, the dK and dV of the keys with one
// undecided (which need every row's LSE and D, but not its dQ), the sinks' gradients if one is
// undecided; D is computed for every row visited. The first pass without a double stage visits
// everything.
struct PassPlan {
  std::vector<std::size_t> rows;  // the query rows to visit, ascending
  std::vector<char> row_dq;       // per query row: accumulate its dQ
  std::vector<char> key_grads;    // per key: accumulate its dK and dV
  bool sinks = true;
};

class BackwardPass {
 public:
  BackwardPass(const AttentionBackwardInputs& in, const std::vector<tensor::HeadScores>& heads,
               slong precision)
      : in_(in), heads_(heads), p_(precision), q_(in.queries), k_(in.keys), v_(in.values), dout_(in.d_out) {
    for (const tensor::HeadScores& head : heads) constants_.emplace_back(head, in.queries.cols, precision);
  }

  // Adds query row i's contributions to `out` (head i / positions, at position i mod positions):
  // its D, and what `plan` asks of it: its dQ, its shares of some keys' dK and dV and of the sinks'
  // gradients.
  // dP_a - D + g for every key a, without D's cancellation against dP_a: with c = dP at the key of
  // the largest logit (the pivot) and sum_a P_a = 1 - P_sink exactly, dP_a - D + g = (dP_a - c) +
  // (g + c P_sink - sum_l P_l (dP_l - c)). Where P sits on keys whose dP equal c (a one-hot row,
  // the commonest case of a gradient below the formats' range), their terms are exactly 0 and the
  // rest are enclosed to relative precision, so a gradient of e^-800 has a ball on its own side of
  // 0 (D - dP_a enclosed directly holds 0 until the precision passes 1,150 bits).
  void centre_on_top(const BallVector& z, const BallVector& dp, const BallVector& weight, arb_srcptr sink_z,
                     arb_srcptr lse, std::size_t i, arb_ptr pivot, arb_ptr centred) const {
    std::size_t top = 0;
    if (dp.empty()) {  // a sink alone: no pivot, dP - D + g is g
      arb_zero(pivot);
      arb_set_d(centred, in_.d_lse.empty() ? 0.0 : in_.d_lse[i]);
      return;
    }
    for (std::size_t a = 1; a < z.size(); ++a) {
      if (arf_cmp(arb_midref(z[a]), arb_midref(z[top])) > 0) top = a;
    }
    arb_set(pivot, dp[top]);
    arb_set_d(centred, in_.d_lse.empty() ? 0.0 : in_.d_lse[i]);
    Ball term;
    if (sink_z != nullptr) {  // + c P_sink
      arb_sub(term.get(), sink_z, lse, p_);
      arb_exp(term.get(), term.get(), p_);
      arb_addmul(centred, term.get(), pivot, p_);
    }
    for (std::size_t a = 0; a < dp.size(); ++a) {
      if (a == top) continue;  // dP_top - c = 0 exactly
      arb_sub(term.get(), dp[a], pivot, p_);
      arb_submul(centred, term.get(), weight[a], p_);
    }
  }

  void add_query(std::size_t i, GradientBalls& out, const PassPlan& plan) {
    const std::size_t positions = in_.positions(), h = i / positions;
    const tensor::HeadScores& head = heads_[h];
    const ScoreConstants& constants = constants_[h];
    if (i % positions >= head.queries) return;  // a padded query contributes nothing
    head.visible_keys(i % positions, visible_);
    const std::size_t count = visible_.size();
    const std::optional<double> sink = head.sink;
    if (count == 0 && !sink) return;
    BallVector z(count), slope(count), weight(count), dp(count);
    for (std::size_t a = 0; a < count; ++a) logit(head, constants, i, visible_[a], z[a], slope[a]);
    Ball sink_z, lse, total, scratch;
    if (sink) {
      arb_set_d(sink_z.get(), *sink);
      arb_mul(sink_z.get(), sink_z.get(), constants.inverse_theta.get(), p_);
    }
    log_sum_exp(z, sink ? sink_z.get() : nullptr, lse.get());
    const std::size_t dv = in_.values.cols, d = in_.queries.cols;
    arb_zero(total.get());  // D_i
    // A query that sees one key and no sink has P = 1 exactly: its contributions are then exact
    // dyadic numbers (a ball of radius 0 once the precision holds them), so a result that is
    // exactly a rounding boundary (a tie) is still decided; exp(z - L) would only enclose 1.
    const bool single = count == 1 && !sink;
    for (std::size_t a = 0; a < count; ++a) {
      if (single) {
        arb_one(weight[a]);
      } else {
        arb_sub(weight[a], z[a], lse.get(), p_);
        arb_exp(weight[a], weight[a], p_);
      }
      arb_dot(dp[a], nullptr, 0, dout_.balls[i * dv], 1, v_.balls[visible_[a] * dv], 1,
              static_cast<slong>(dv), p_);
      arb_addmul(total.get(), weight[a], dp[a], p_);
    }
    arb_set(out.d_rows[i], total.get());
    Ball g;  // g_i - D_i
    arb_set_d(g.get(), in_.d_lse.empty() ? 0.0 : in_.d_lse[i]);
    arb_sub(g.get(), g.get(), total.get(), p_);
    Ball pivot, centred;  // dP - D + g = (dP - c) + centred (centre_on_top)
    centre_on_top(z, dp, weight, sink ? sink_z.get() : nullptr, lse.get(), i, pivot.get(), centred.get());
    for (std::size_t a = 0; a < count; ++a) {
      const std::size_t j = visible_[a];
      arb_sub(scratch.get(), dp[a], pivot.get(), p_);
      arb_add(scratch.get(), scratch.get(), centred.get(), p_);  // dP - D + g
      arb_mul(scratch.get(), scratch.get(), weight[a], p_);
      arb_mul(scratch.get(), scratch.get(), slope[a], p_);  // dr_ij
      if (plan.row_dq[i] != 0) {
        for (std::size_t c = 0; c < d; ++c)
          arb_addmul(out.dq[i * d + c], scratch.get(), k_.balls[j * d + c], p_);
      }
      if (plan.key_grads[j] == 0) continue;
      for (std::size_t c = 0; c < d; ++c)
        arb_addmul(out.dk[j * d + c], scratch.get(), q_.balls[i * d + c], p_);
      for (std::size_t c = 0; c < dv; ++c)
        arb_addmul(out.dv[j * dv + c], weight[a], dout_.balls[i * dv + c], p_);
    }
    if (sink && plan.sinks) {  // dz_sink / theta = P_sink (g - D) / theta
      arb_sub(scratch.get(), sink_z.get(), lse.get(), p_);
      arb_exp(scratch.get(), scratch.get(), p_);
      arb_mul(scratch.get(), scratch.get(), g.get(), p_);
      arb_addmul(out.d_sinks[h], scratch.get(), constants.inverse_theta.get(), p_);
    }
  }

 private:
  // z_ij and dz/dr at query row i (position i mod positions of its head), key j. The bias does
  // not depend on Q or K, so it moves z but not dz/dr.
  void logit(const tensor::HeadScores& head, const ScoreConstants& constants, std::size_t i, std::size_t j,
             arb_ptr z, arb_ptr slope) {
    const std::size_t d = in_.queries.cols;
    arb_dot(z, nullptr, 0, q_.balls[i * d], 1, k_.balls[j * d], 1, static_cast<slong>(d), p_);
    arb_mul(z, z, constants.scale.get(), p_);
    arb_set(slope, constants.scale.get());
    if (constants.capped) {
      Ball t;
      arb_div(t.get(), z, constants.cap.get(), p_);
      arb_tanh(t.get(), t.get(), p_);
      arb_mul(z, t.get(), constants.cap.get(), p_);
      arb_sqr(t.get(), t.get(), p_);
      arb_sub_ui(t.get(), t.get(), 1, p_);
      arb_neg(t.get(), t.get());  // 1 - tanh^2
      arb_mul(slope, slope, t.get(), p_);
    }
    if (head.has_bias()) {  // additive - slope * distance, exact inputs, enclosed
      const tensor::HeadScores::BiasTerms terms = head.bias_terms(i % in_.positions(), j);
      Ball alibi, additive;
      arb_set_d(alibi.get(), terms.slope);
      arb_mul_si(alibi.get(), alibi.get(), static_cast<slong>(terms.distance), p_);
      arb_set_d(additive.get(), terms.additive);
      arb_add(z, z, additive.get(), p_);
      arb_sub(z, z, alibi.get(), p_);
    }
    arb_mul(z, z, constants.inverse_theta.get(), p_);
    arb_mul(slope, slope, constants.inverse_theta.get(), p_);
  }

  // L = m + ln(sum e^{z - m} [+ e^{sink - m}]), m the largest midpoint (any m gives the same L),
  // taken exactly as Arb holds it: a logit beyond double's range (2^1033 at a tiny theta) stays a
  // finite shift, where a double would make it inf and every difference NaN.
  void log_sum_exp(BallVector& z, arb_srcptr sink, arb_ptr lse) {
    arf_srcptr largest = sink != nullptr ? arb_midref(sink) : nullptr;
    for (std::size_t a = 0; a < z.size(); ++a) {
      if (largest == nullptr || arf_cmp(arb_midref(z[a]), largest) > 0) largest = arb_midref(z[a]);
    }
    Ball sum, term, shift;
    if (largest != nullptr) arb_set_arf(shift.get(), largest);
    arb_zero(sum.get());
    for (std::size_t a = 0; a <= z.size(); ++a) {
      if (a == z.size() && sink == nullptr) break;
      arb_sub(term.get(), a < z.size() ? z[a] : sink, shift.get(), p_);
      arb_exp(term.get(), term.get(), p_);
      arb_add(sum.get(), sum.get(), term.get(), p_);
    }
    arb_log(lse, sum.get(), p_);
    arb_add(lse, lse, shift.get(), p_);
  }

  const AttentionBackwardInputs& in_;
  const std::vector<tensor::HeadScores>& heads_;
  slong p_;
  ExactBalls q_, k_, v_, dout_;
  std::deque<ScoreConstants> constants_;  // per head (a Ball does not move)
  std::vector<std::size_t> visible_;
};

using Partials = std::vector<std::unique_ptr<GradientBalls>>;

// The gradient balls `plan` asks for at `precision`, summed into partials[0]: the queries are split
// over workers, each with its own dK and dV (ball sums enclose whatever the order).
GradientBalls& compute_at(const AttentionBackwardInputs& in, const std::vector<tensor::HeadScores>& heads,
                          slong precision, const PassPlan& plan, Partials& partials) {
  const std::size_t m = in.queries.rows, n = in.keys.rows, d = in.queries.cols, dv = in.values.cols;
  const std::size_t count = plan.rows.size();
  const std::size_t workers =
      std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, std::max<std::size_t>(count, 1));
  partials.clear();
  partials.resize(workers);
  const bool listening = interrupts_apply_here();  // on this thread; the rows run on workers
  parallel_for(workers, 0, [&](std::size_t w) {
    partials[w] = std::make_unique<GradientBalls>(m * d, n * d, n * dv, m, in.group);
    BackwardPass pass(in, heads, precision);
    for (std::size_t r = w; r < count; r += workers) {
      if (const int signal = interrupt_signal(); listening && signal != 0) throw Interrupted(signal);
      pass.add_query(plan.rows[r], *partials[w], plan);
    }
  });
  GradientBalls& sum = *partials[0];
  for (std::size_t w = 1; w < workers; ++w) {
    _arb_vec_add(sum.dq.data(), sum.dq.data(), partials[w]->dq.data(), static_cast<slong>(m * d), precision);
    _arb_vec_add(sum.dk.data(), sum.dk.data(), partials[w]->dk.data(), static_cast<slong>(n * d), precision);
    _arb_vec_add(sum.dv.data(), sum.dv.data(), partials[w]->dv.data(), static_cast<slong>(n * dv), precision);
    _arb_vec_add(sum.d_sinks.data(), sum.d_sinks.data(), partials[w]->d_sinks.data(),
                 static_cast<slong>(in.group), precision);
    _arb_vec_add(sum.d_rows.data(), sum.d_rows.data(), partials[w]->d_rows.data(), static_cast<slong>(m),
                 precision);
  }
  return sum;
}

// The format value every point of the ball rounds to, with ends as fine as the ball; a ball
// within the zero band (both ends round to a zero) gives -0 when it lies below 0 and +0 otherwise
// (the header: the sign of a zero whose ball holds both signs is not claimed).
std::optional<double> decide(arb_srcptr ball, slong precision, const FloatFormat& target) {
  if (!arb_is_finite(ball)) return std::nullopt;
  mpfr_t lo, hi;
  mpfr_inits2(static_cast<mpfr_prec_t>(precision) + 64, lo, hi, static_cast<mpfr_ptr>(nullptr));
  arb_get_interval_mpfr(lo, hi, ball);
  const std::optional<double> value = round_if_decided(lo, hi, target);  // finite ends: never NaN here
  mpfr_clears(lo, hi, static_cast<mpfr_ptr>(nullptr));
  return value;
}

// Decides what it can of one output; returns the index of the first undecided element, if any.
std::optional<std::size_t> decide_all(BallVector& balls, std::vector<double>& values, std::vector<bool>& done,
                                      slong precision, const FloatFormat& target) {
  std::optional<std::size_t> first;
  for (std::size_t e = 0; e < values.size(); ++e) {
    if (done[e]) continue;
    if (const auto value = decide(balls[e], precision, target)) {
      values[e] = *value;
      done[e] = true;
    } else if (!first) {
      first = e;
    }
  }
  return first;
}

// Rounds every still undecided result that the exact stage finds rational (its ties above all,
// which no precision decides).
void decide_rational_results(BackwardExactCases& exact, const FloatFormat& target, AttentionGradients& out,
                             std::vector<std::vector<bool>>& done) {
  const auto settle = [](std::optional<Rational> value, const FloatFormat& format, double& slot,
                         std::vector<bool>::reference flag) {
    if (!value) return;
    slot = round_exact_ratio(mpq_numref(value->get()), mpq_denref(value->get()), format);
    flag = true;
  };
  const std::size_t dv = out.d_values.cols;
  BackwardExactCases::Products products = exact.d_products(done[0], done[1]);
  for (std::size_t e = 0; e < done[0].size(); ++e)
    if (!done[0][e]) settle(std::move(products.d_queries[e]), target, out.d_queries.values[e], done[0][e]);
  for (std::size_t e = 0; e < done[1].size(); ++e)
    if (!done[1][e]) settle(std::move(products.d_keys[e]), target, out.d_keys.values[e], done[1][e]);
  for (std::size_t e = 0; e < done[2].size(); ++e)
    if (!done[2][e]) settle(exact.d_value(e / dv, e % dv), target, out.d_values.values[e], done[2][e]);
  for (std::size_t h = 0; h < done[3].size(); ++h)
    if (!done[3][h]) settle(exact.d_sink(h), target, out.d_sinks[h], done[3][h]);
  for (std::size_t i = 0; i < done[4].size(); ++i)
    if (!done[4][i]) settle(exact.d_row(i), d_format(target), out.d_rows[i], done[4][i]);
}

struct Undecided {
  std::string where;
  [[nodiscard]] bool any() const { return !where.empty(); }
};

// The plan for what `done` leaves undecided (PassPlan).
PassPlan plan_pass(const AttentionGradients& out, const std::vector<std::vector<bool>>& done) {
  const std::size_t m = out.d_queries.rows, n = out.d_keys.rows, d = out.d_queries.cols,
                    dv = out.d_values.cols;
  const auto any_undecided = [](const std::vector<bool>& flags, std::size_t first, std::size_t count) {
    return std::find(flags.begin() + static_cast<std::ptrdiff_t>(first),
                     flags.begin() + static_cast<std::ptrdiff_t>(first + count),
                     false) != flags.begin() + static_cast<std::ptrdiff_t>(first + count);
  };
  PassPlan plan{.rows = {},
                .row_dq = std::vector<char>(m),
                .key_grads = std::vector<char>(n),
                .sinks = any_undecided(done[3], 0, done[3].size())};
  bool keys = false;
  for (std::size_t j = 0; j < n; ++j) {
    plan.key_grads[j] = any_undecided(done[1], j * d, d) || any_undecided(done[2], j * dv, dv) ? 1 : 0;
    keys = keys || plan.key_grads[j] != 0;
  }
  for (std::size_t i = 0; i < m; ++i) {
    plan.row_dq[i] = any_undecided(done[0], i * d, d) ? 1 : 0;
    if (keys || plan.sinks || plan.row_dq[i] != 0 || !done[4][i]) plan.rows.push_back(i);
  }
  return plan;
}

// One Ziv pass: decides what the balls at `precision` decide; names the first undecided output.
Undecided decide_pass(const AttentionBackwardInputs& in, const std::vector<tensor::HeadScores>& heads,
                      slong precision, const FloatFormat& target, AttentionGradients& out,
                      std::vector<std::vector<bool>>& done) {
  Partials partials;
  GradientBalls& balls = compute_at(in, heads, precision, plan_pass(out, done), partials);
  Undecided undecided;
  const auto name = [&](const char* what, const Matrix& m, std::size_t e) {
    if (undecided.any()) return;
    undecided.where =
        std::string(what) + "(" + std::to_string(e / m.cols) + ", " + std::to_string(e % m.cols) + ")";
  };
  if (const auto e = decide_all(balls.dq, out.d_queries.values, done[0], precision, target))
    name("dQ", out.d_queries, *e);
  if (const auto e = decide_all(balls.dk, out.d_keys.values, done[1], precision, target))
    name("dK", out.d_keys, *e);
  if (const auto e = decide_all(balls.dv, out.d_values.values, done[2], precision, target))
    name("dV", out.d_values, *e);
  if (const auto e = decide_all(balls.d_rows, out.d_rows, done[4], precision, d_format(target))) {
    if (!undecided.any()) undecided.where = "D(" + std::to_string(*e) + ")";
  }
  if (const auto e = decide_all(balls.d_sinks, out.d_sinks, done[3], precision, target)) {
    if (!undecided.any()) undecided.where = "dsink(" + std::to_string(*e) + ")";
  }
  return undecided;
}

// The first result still undecided, named as decide_pass names it.
Undecided first_undecided(const AttentionGradients& out, const std::vector<std::vector<bool>>& done) {
  const auto index = [&](std::size_t which) -> std::optional<std::size_t> {
    const auto at = std::find(done[which].begin(), done[which].end(), false);
    if (at == done[which].end()) return std::nullopt;
    return static_cast<std::size_t>(at - done[which].begin());
  };
  const auto element = [](const char* what, const Matrix& m, std::size_t e) {
    return std::string(what) + "(" + std::to_string(e / m.cols) + ", " + std::to_string(e % m.cols) + ")";
  };
  if (const auto e = index(0)) return {element("dQ", out.d_queries, *e)};
  if (const auto e = index(1)) return {element("dK", out.d_keys, *e)};
  if (const auto e = index(2)) return {element("dV", out.d_values, *e)};
  if (const auto e = index(4)) return {"D(" + std::to_string(*e) + ")"};
  if (const auto e = index(3)) return {"dsink(" + std::to_string(*e) + ")"};
  return {};
}

}  // namespace

AttentionGradients attention_backward(const AttentionBackwardInputs& in, const FloatFormat& target,
                                      ZivStatistics* statistics, RowsOfD rows_of_d) {
  check(in);
  std::vector<tensor::HeadScores> heads;
  for (std::size_t h = 0; h < in.group; ++h) heads.push_back(in.head(h));
  const std::size_t m = in.queries.rows, n = in.keys.rows, d = in.queries.cols, dv = in.values.cols;
  const bool sinks =
      std::any_of(heads.begin(), heads.end(), [](const auto& h) { return h.sink.has_value(); });
  AttentionGradients out{Matrix(m, d), Matrix(n, d), Matrix(n, dv), std::vector<double>(sinks ? in.group : 0),
                         std::vector<double>(m)};
  std::vector<std::vector<bool>> done{std::vector<bool>(m * d), std::vector<bool>(n * d),
                                      std::vector<bool>(n * dv), std::vector<bool>(out.d_sinks.size()),
                                      std::vector<bool>(m)};
  if (statistics != nullptr) ++statistics->calls;
  const std::size_t in_double = decide_backward_in_double(in, heads, target, out, done);
  if (statistics != nullptr) statistics->decided_in_double += static_cast<long>(in_double);
  if (rows_of_d == RowsOfD::not_needed) {
    std::fill(out.d_rows.begin(), out.d_rows.end(), std::numeric_limits<double>::quiet_NaN());
    std::fill(done[4].begin(), done[4].end(), true);
  }
  if (!first_undecided(out, done).any()) return out;
  Undecided undecided;
  std::optional<BackwardExactCases> exact;  // built once a pass leaves something undecided
  run_ziv_passes(
      ZivSchedule::for_format(target), 0, statistics,
      [&](mpfr_prec_t precision) {
        undecided = decide_pass(in, heads, static_cast<slong>(precision), target, out, done);
        if (undecided.any() && !exact) {
          exact.emplace(in, heads);
          decide_rational_results(*exact, target, out, done);
          undecided = first_undecided(out, done);
        }
        return !undecided.any();
      },
      [&] { return "attention_backward: " + undecided.where; });
  return out;
}

}  // namespace sharpcheck::reference
