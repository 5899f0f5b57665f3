#include "reference/softmax_backward.hpp"

#include <flint/fmpq.h>
#include <gmp.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <optional>
#include <string>

#include "core/errors.hpp"
#include "core/mpfr_number.hpp"
#include "reference/ball_stage.hpp"
#include "reference/exact_rounding.hpp"
#include "reference/input_checks.hpp"
#include "reference/ziv_loop.hpp"

namespace sharpcheck::reference {
namespace {

enum class Operation { softmax, log_softmax };

const char* name_of(Operation operation) {
  return operation == Operation::softmax ? "softmax_backward" : "log_softmax_backward";
}

// An exact rational, freed on scope exit.
struct Rational {
  Rational() { mpq_init(value); }
  explicit Rational(double x) : Rational() { mpq_set_d(value, x); }  // doubles convert exactly
  ~Rational() { mpq_clear(value); }
  Rational(const Rational&) = delete;
  Rational& operator=(const Rational&) = delete;
  mpq_t value;
};

void check_gradient(std::span<const double> dy, const PreparedRow& row, std::size_t length,
                    Operation operation) {
  if (dy.size() != length) {
    throw InputError(InputProblem::shape_mismatch, std::string(name_of(operation)) + ": dy has " +
                                                       std::to_string(dy.size()) + " entries, the logits " +
                                                       std::to_string(length));
  }
  for (const std::size_t j : row.active) {
    if (!std::isfinite(dy[j])) {
      throw InputError(std::isnan(dy[j]) ? InputProblem::nan_value : InputProblem::non_finite_value,
                       std::string(name_of(operation)) + ": dy " + std::to_string(j) + " is not finite");
    }
  }
}

// Everything exact about the row: per distinct logit the mean of dy (as a rational), whether those
// means are all equal (then softmax_backward_j = 0 exactly where dy_j is that mean), and D = sum dy.
struct ExactFacts {
  std::optional<double> common_mean;  // the group means' common value, when they are all equal and a double
  bool means_equal = false;
  Rational total;                    // D
  std::vector<Rational> group_sums;  // per distinct logit, the sum of its entries' dy
};

void gather_exact_facts(std::span<const double> dy, const PreparedRow& row, const DistinctLogits& distinct,
                        ExactFacts& facts) {
  facts.group_sums = std::vector<Rational>(distinct.values.size());
  std::vector<Rational>& sums = facts.group_sums;
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    Rational term(dy[row.active[a]]);
    mpq_add(sums[distinct.of_active[a]].value, sums[distinct.of_active[a]].value, term.value);
    mpq_add(facts.total.value, facts.total.value, term.value);
  }
  Rational first, mean, count;
  facts.means_equal = true;
  for (std::size_t v = 0; v < sums.size(); ++v) {
    mpq_set_ui(count.value, distinct.counts[v], 1);
    mpq_div(mean.value, sums[v].value, count.value);
    if (v == 0) mpq_set(first.value, mean.value);
    if (!mpq_equal(first.value, mean.value)) facts.means_equal = false;
  }
  // dy_j equals the common mean only if the mean is a double (dy_j is one); otherwise no entry is 0.
  if (facts.means_equal && mpz_sizeinbase(mpq_denref(first.value), 2) <= 1100) {
    const double candidate = mpq_get_d(first.value);
    Rational back(candidate);
    if (mpq_equal(back.value, first.value)) facts.common_mean = candidate;
  }
}

// One distinct logit: y = 1/k, so softmax_backward_j = (k dy_j - D) / (k^2 theta) and
// log_softmax_backward_j = (k dy_j - D) / (k theta), exactly.
double exact_single_group(double dy_j, const ExactFacts& facts, std::uint64_t k, double theta,
                          const FloatFormat& target, Operation operation) {
  Rational result(dy_j), scale, divisor(theta);
  mpq_set_ui(scale.value, k, 1);
  mpq_mul(result.value, result.value, scale.value);
  mpq_sub(result.value, result.value, facts.total.value);
  if (operation == Operation::softmax) mpq_mul(divisor.value, divisor.value, scale.value);
  mpq_mul(divisor.value, divisor.value, scale.value);
  mpq_div(result.value, result.value, divisor.value);
  return round_exact_ratio(mpq_numref(result.value), mpq_denref(result.value), target);
}

// What a ball says about one result: the format value every point of it rounds to, or that every
// point rounds to a zero while the ball holds both signs (then the sign is found exactly, below).
struct BallVerdict {
  std::optional<double> value;
  bool zero_of_unknown_sign = false;
};

BallVerdict decided_value(arb_srcptr ball, mpfr_prec_t precision, const FloatFormat& target) {
  if (!arb_is_finite(ball)) return {};
  mpfr_t lo, hi;
  mpfr_inits2(precision + 64, lo, hi, static_cast<mpfr_ptr>(nullptr));
  arb_get_interval_mpfr(lo, hi, ball);
  BallVerdict verdict;
  if (round_to_format(lo, target) == 0 && round_to_format(hi, target) == 0 && end_sign(lo) < 0 &&
      end_sign(hi) > 0) {
    verdict.zero_of_unknown_sign = true;
  } else {
    verdict.value = round_if_decided(lo, hi, target);
  }
  mpfr_clears(lo, hi, static_cast<mpfr_ptr>(nullptr));
  return verdict;
}

struct LoopState {
  std::span<const double> logits, dy;
  const PreparedRow* row;
  const DistinctLogits* distinct;
  double theta;
  Operation operation;
};

// The row's exponentials w_g = e^{z_g - shift} at `precision`.
void enclose_weights(const LoopState& s, slong precision, BallVector& weights) {
  Ball multiplier, sum;
  enclose_inverse_temperature(multiplier.get(), s.theta, precision);
  enclose_exponentials(*s.distinct, s.row->shift, multiplier.get(), precision, weights, sum.get());
}

// N_j's coefficient of group g (below), exactly: softmax's k_g dy_j - sum_{i in g} dy_i; log-softmax's
// k_g dy_j, less D in j's own group.
void zero_sign_coefficient(const LoopState& s, const ExactFacts& facts, double dy_j, std::size_t group_of_j,
                           std::size_t g, Rational& c) {
  Rational count;
  mpq_set_ui(count.value, s.distinct->counts[g], 1);
  mpq_set_d(c.value, dy_j);
  mpq_mul(c.value, c.value, count.value);
  if (s.operation == Operation::softmax) {
    mpq_sub(c.value, c.value, facts.group_sums[g].value);
  } else if (g == group_of_j) {
    mpq_sub(c.value, c.value, facts.total.value);
  }
}

// x as a ball at `precision` (exact where it fits).
void enclose_rational(arb_ptr ball, const Rational& x, slong precision) {
  fmpq_t q;
  fmpq_init(q);
  fmpq_set_mpq(q, x.value);
  arb_set_fmpq(ball, q, precision);
  fmpq_clear(q);
}

// The sign of each key's quantity (0 in `signs` while unknown), found at growing precision:
// `enclose(key, weights, precision, ball)` adds the quantity into a zeroed ball from the row's
// exponentials at that precision, and a key is settled once its ball excludes 0. Capped as Ziv's
// loop is; past the cap it refuses, naming `what`, never guessing.
template <typename Key, typename Enclose>
void find_signs(const LoopState& s, std::map<Key, int>& signs, ZivStatistics* statistics,
                const std::string& what, Enclose&& enclose) {
  run_ziv_passes(
      ZivSchedule{.initial = 64}, 0, statistics,
      [&](mpfr_prec_t bits) {
        const auto precision = static_cast<slong>(bits);
        BallVector weights(s.distinct->values.size());
        enclose_weights(s, precision, weights);
        Ball value;
        bool all_known = true;
        for (auto& [key, sign] : signs) {
          if (sign != 0) continue;
          arb_zero(value.get());
          enclose(key, weights, precision, value.get());
          sign = arb_is_positive(value.get()) ? 1 : arb_is_negative(value.get()) ? -1 : 0;
          all_known = all_known && sign != 0;
        }
        return all_known;
      },
      [&] { return what; });
}

// The signs of results every possible value of which rounds to a zero, their balls holding both
// signs (`pending`: indices into row.active). With w_g = e^{z_g - shift} and S = sum_g k_g w_g the
// result is N_j / (theta S^2) times w_j (softmax) or N_j / (theta S) (log-softmax), N_j =
// sum_g c_g w_g (zero_sign_coefficient; softmax's N is the header's). The c_g are exact, so each
// term is enclosed to relative precision and only the terms' own cancellation costs bits. N_j is
// not 0: decide_exactly took every case where all c_g are 0, and otherwise Lindemann-Weierstrass
// applies. So the loop ends; it is capped as Ziv's loop is, and refuses past the cap, never guessing.
// One sign per (dy_j, group) for log-softmax and per dy_j for softmax: the entries sharing them.
void settle_zero_signs(const LoopState& s, const ExactFacts& facts, const std::vector<std::size_t>& pending,
                       std::vector<double>& result, std::vector<bool>& done, ZivStatistics* statistics) {
  const bool by_group = s.operation == Operation::log_softmax;
  std::map<std::pair<double, std::size_t>, int> signs;  // 0 while unknown
  const auto key_of = [&](std::size_t a) {
    return std::pair{s.dy[s.row->active[a]], by_group ? s.distinct->of_active[a] : std::size_t{0}};
  };
  for (const std::size_t a : pending) signs.emplace(key_of(a), 0);
  Rational coefficient;
  Ball term;
  find_signs(s, signs, statistics, std::string(name_of(s.operation)) + ": the sign of a zero result",
             [&](const auto& key, BallVector& weights, slong precision, arb_ptr n) {
               for (std::size_t g = 0; g < weights.size(); ++g) {
                 zero_sign_coefficient(s, facts, key.first, key.second, g, coefficient);
                 enclose_rational(term.get(), coefficient, precision);
                 arb_addmul(n, term.get(), weights[g], precision);
               }
             });
  for (const std::size_t a : pending) {
    result[s.row->active[a]] = std::copysign(0.0, signs.at(key_of(a)) * s.theta);
    done[a] = true;
  }
}

// One pass at `precision`: decides what it can into `result`, marking `done`; results that round to
// a zero of a sign the ball leaves open go to `zero_band`.
void decide_at(const LoopState& s, slong precision, const FloatFormat& target, std::vector<double>& result,
               std::vector<bool>& done, std::vector<std::size_t>& zero_band) {
  BallVector weights(s.distinct->values.size());
  Ball multiplier, sum, dot, value, term;
  enclose_inverse_temperature(multiplier.get(), s.theta, precision);
  enclose_exponentials(*s.distinct, s.row->shift, multiplier.get(), precision, weights, sum.get());
  arb_zero(dot.get());  // softmax: sum_i w_i dy_i (divided by S below); log-softmax: D
  for (std::size_t a = 0; a < s.row->active.size(); ++a) {
    arb_set_d(term.get(), s.dy[s.row->active[a]]);
    if (s.operation == Operation::softmax)
      arb_mul(term.get(), term.get(), weights[s.distinct->of_active[a]], precision);
    arb_add(dot.get(), dot.get(), term.get(), precision);
  }
  if (s.operation == Operation::softmax) arb_div(dot.get(), dot.get(), sum.get(), precision);
  for (std::size_t a = 0; a < s.row->active.size(); ++a) {
    if (done[a]) continue;
    const std::size_t j = s.row->active[a];
    arb_div(term.get(), weights[s.distinct->of_active[a]], sum.get(), precision);  // y_j
    if (s.operation == Operation::softmax) {
      arb_set_d(value.get(), s.dy[j]);
      arb_sub(value.get(), value.get(), dot.get(), precision);
      arb_mul(value.get(), value.get(), term.get(), precision);
    } else {
      arb_mul(term.get(), term.get(), dot.get(), precision);
      arb_set_d(value.get(), s.dy[j]);
      arb_sub(value.get(), value.get(), term.get(), precision);
    }
    arb_mul(value.get(), value.get(), multiplier.get(), precision);
    const BallVerdict verdict = decided_value(value.get(), precision, target);
    if (verdict.value) {
      result[j] = *verdict.value;
      done[a] = true;
    } else if (verdict.zero_of_unknown_sign) {
      zero_band.push_back(a);
    }
  }
}

// The top group G of logits, by the logits themselves (row.shift: the largest for theta > 0, the
// smallest for theta < 0; quotients e / theta in double may tie or overflow where the logits
// differ), and a lower bound on z_G - z_g = |e_G - e_g| / |theta| over the other groups, rounded
// toward zero in MPFR (a difference of doubles may overflow double while the true gap is small).
struct TopGroup {
  std::size_t index = 0;
  double gap = INFINITY;
};

TopGroup top_group(const LoopState& s) {
  const DistinctLogits& distinct = *s.distinct;
  TopGroup top;
  while (distinct.values[top.index] != s.row->shift) ++top.index;
  std::optional<double> nearest;  // every other logit lies on one side of the top: the least gap is here
  for (std::size_t v = 0; v < distinct.values.size(); ++v) {
    const double value = distinct.values[v];
    if (v != top.index && (!nearest || (s.theta > 0 ? value > *nearest : value < *nearest))) nearest = value;
  }
  if (nearest) top.gap = gap_in_z(distinct.values[top.index], *nearest, s.theta);
  return top;
}

// log_softmax_backward_j = (dy_j - y_j D) / theta where one group G of logits is far above the rest
// (a gap of z_G - z_g >= g): for j in G, y_j = 1/k_G - T / (k_G (k_G + T)) with 0 < T <= n e^-g, so
// the result is r = (dy_j - D/k_G) / theta plus a tail of sign sign(D) sign(theta); elsewhere y_j
// is at most e^-g and r = dy_j / theta with a tail of the opposite sign. |tail| <= |D| n e^-g /
// |theta|. When r is a rounding boundary (dy of few bits make that common) no enclosure decides,
// but the tail's sign does (round_near_boundary). Decides what it can; the rest go on in Ziv's loop.
void decide_by_tails(const LoopState& s, const ExactFacts& facts, const FloatFormat& target,
                     std::vector<double>& result, std::vector<bool>& done) {
  const DistinctLogits& distinct = *s.distinct;
  const int d_sign = mpq_sgn(facts.total.value), theta_sign = s.theta > 0 ? 1 : -1;
  if (s.operation != Operation::log_softmax || distinct.values.size() < 2 || d_sign == 0) return;
  const auto [top, gap] = top_group(s);
  // ln |tail| <= ln |D| + ln n + ln 4 - ln |theta| - gap; ln |D| from D's bit lengths (an upper
  // bound), ln 8 covering the factor 2 and these logarithms' own roundings.
  const auto bits = [](mpz_srcptr z) { return static_cast<double>(mpz_sizeinbase(z, 2)); };
  const double log2_d = bits(mpq_numref(facts.total.value)) - bits(mpq_denref(facts.total.value)) + 1;
  const double log_tail = (log2_d + 3) * std::numbers::ln2 +
                          std::log(static_cast<double>(s.row->active.size())) - std::log(std::abs(s.theta)) -
                          gap * (1 - 0x1p-40);
  Rational r, count, divisor(s.theta);
  mpq_set_ui(count.value, distinct.counts[top], 1);
  for (std::size_t a = 0; a < s.row->active.size(); ++a) {
    if (done[a]) continue;
    const std::size_t j = s.row->active[a];
    const bool in_top = distinct.of_active[a] == top;
    mpq_set_d(r.value, s.dy[j]);
    if (in_top) {
      Rational mean;
      mpq_div(mean.value, facts.total.value, count.value);
      mpq_sub(r.value, r.value, mean.value);
    }
    mpq_div(r.value, r.value, divisor.value);
    const int side = (in_top ? 1 : -1) * d_sign * theta_sign;
    if (const auto decided = round_near_boundary(r.value, side, log_tail, target)) {
      result[j] = *decided;
      done[a] = true;
    }
  }
}

// The signs of X_j = k_G sum_{h != G} (c_h - 2 delta_j k_h) w_h - delta_j T^2 for the entries with
// these dy (decide_softmax_by_tails; c_h = k_h dy_j - sum_h, T = sum_{h != G} k_h w_h), by enclosing
// them at growing precision. Each coefficient is exact, so a group whose coefficient is 0 adds
// nothing and only X's own cancellation costs bits (summing T and sum_h w_h first and combining
// them cancels a group of e^-1e6 against itself, hiding one of e^-1e30 for good). Entries sharing a
// dy share X: the work is groups x distinct dy per pass. X_j is not 0 (there the result is
// irrational and r rational), so the loop ends; past the cap it refuses, never guessing.
std::vector<int> tail_signs(const LoopState& s, const ExactFacts& facts, std::size_t top,
                            std::span<const double> dys) {
  const std::size_t groups = s.distinct->values.size();
  std::map<double, int> by_dy;  // 0 while unknown
  for (const double dy : dys) by_dy.emplace(dy, 0);
  Rational mean, count, delta, coefficient;
  mpq_set_ui(count.value, s.distinct->counts[top], 1);
  mpq_div(mean.value, facts.group_sums[top].value, count.value);
  Ball t, term;
  find_signs(s, by_dy, nullptr, "softmax_backward: the side of a tail",
             [&](double dy, BallVector& weights, slong precision, arb_ptr x) {
               arb_zero(t.get());
               for (std::size_t h = 0; h < groups; ++h) {
                 if (h != top) arb_addmul_ui(t.get(), weights[h], s.distinct->counts[h], precision);
               }
               arb_sqr(t.get(), t.get(), precision);  // T^2
               mpq_set_d(delta.value, dy);
               mpq_sub(delta.value, delta.value, mean.value);
               for (std::size_t h = 0; h < groups; ++h) {  // k_h (dy - 2 delta) - sum_h
                 if (h == top) continue;
                 mpq_set_d(coefficient.value, dy);
                 mpq_sub(coefficient.value, coefficient.value, delta.value);
                 mpq_sub(coefficient.value, coefficient.value, delta.value);
                 mpq_set_ui(count.value, s.distinct->counts[h], 1);
                 mpq_mul(coefficient.value, coefficient.value, count.value);
                 mpq_sub(coefficient.value, coefficient.value, facts.group_sums[h].value);
                 if (mpq_sgn(coefficient.value) == 0) continue;
                 enclose_rational(term.get(), coefficient, precision);
                 arb_addmul(x, term.get(), weights[h], precision);
               }
               arb_mul_ui(x, x, s.distinct->counts[top], precision);
               enclose_rational(term.get(), delta, precision);
               arb_submul(x, term.get(), t.get(), precision);
             });
  std::vector<int> signs;
  for (const double dy : dys) signs.push_back(by_dy.at(dy));
  return signs;
}

// softmax_backward_j for j in a top group G far above the rest (a gap of z_G - z_h >= g; w_G = 1
// at the shift): with delta = dy_j - m_G, T = sum_{h != G} k_h w_h and S = k_G + T, the result is
// r = delta / (k_G theta) plus (k_G N_j - delta S^2) / (k_G theta S^2), whose numerator is
// X = k_G sum_{h != G} (c_h - 2 delta k_h) w_h - delta T^2 (the header's c_h; the w_G^2 terms cancel
// exactly). With M = max |dy|, |X| <= 8 M n^2 e^-g and S >= k_G >= 1, so |tail| <= 8 M n^2 e^-g /
// |theta|. When r is a rounding boundary (dy of few bits, logits 1e30 apart) no enclosure decides,
// but the tail's side, sign(X) sign(theta), does (round_near_boundary). Entries outside G are
// e^-g small and decided by the balls and settle_zero_signs.
void decide_softmax_by_tails(const LoopState& s, const ExactFacts& facts, const FloatFormat& target,
                             std::vector<double>& result, std::vector<bool>& done) {
  if (s.operation != Operation::softmax || s.distinct->values.size() < 2) return;
  const auto [top, gap] = top_group(s);
  double largest = 0;
  for (const std::size_t j : s.row->active) largest = std::max(largest, std::abs(s.dy[j]));
  if (largest == 0) return;
  const double n = static_cast<double>(s.row->active.size());
  const double log_tail = std::log(largest) + 3 * std::numbers::ln2 + 2 * std::log(n) -
                          std::log(std::abs(s.theta)) - gap * (1 - 0x1p-40) +
                          std::numbers::ln2;  // ln 2: these logarithms' roundings
  Rational mean, count, delta, r, divisor(s.theta);
  mpq_set_ui(count.value, s.distinct->counts[top], 1);
  mpq_div(mean.value, facts.group_sums[top].value, count.value);
  mpq_mul(divisor.value, divisor.value, count.value);
  struct Pending {
    std::size_t a;
    double up, down;
  };
  std::vector<Pending> pending;  // on a boundary, its side to be found
  std::vector<double> dys;
  for (std::size_t a = 0; a < s.row->active.size(); ++a) {
    if (done[a] || s.distinct->of_active[a] != top) continue;
    const std::size_t j = s.row->active[a];
    mpq_set_d(delta.value, s.dy[j]);
    mpq_sub(delta.value, delta.value, mean.value);
    mpq_div(r.value, delta.value, divisor.value);
    const auto up = round_near_boundary(r.value, 1, log_tail, target);
    const auto down = round_near_boundary(r.value, -1, log_tail, target);
    if (!up || !down) continue;  // r is no boundary, or the tail is not small: Ziv's loop decides
    if (*up == *down && std::signbit(*up) == std::signbit(*down)) {
      result[j] = *up;
      done[a] = true;
    } else {
      pending.push_back({a, *up, *down});
      dys.push_back(s.dy[j]);
    }
  }
  if (pending.empty()) return;
  const std::vector<int> signs = tail_signs(s, facts, top, dys);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    result[s.row->active[pending[i].a]] = signs[i] * s.theta > 0 ? pending[i].up : pending[i].down;
    done[pending[i].a] = true;
  }
}

// The exact cases (module comment); marks them done and counts them.
void decide_exactly(const LoopState& s, const ExactFacts& facts, const FloatFormat& target,
                    std::vector<double>& result, std::vector<bool>& done, ZivStatistics* statistics) {
  const bool single = s.distinct->values.size() == 1;
  const bool zero_total = mpq_sgn(facts.total.value) == 0;
  for (std::size_t a = 0; a < s.row->active.size(); ++a) {
    const std::size_t j = s.row->active[a];
    if (single) {
      result[j] = exact_single_group(s.dy[j], facts, s.distinct->counts[0], s.theta, target, s.operation);
    } else if (s.operation == Operation::softmax && facts.common_mean && s.dy[j] == *facts.common_mean) {
      result[j] = 0.0;
    } else if (s.operation == Operation::log_softmax && zero_total) {
      Rational quotient(s.dy[j]), divisor(s.theta);
      mpq_div(quotient.value, quotient.value, divisor.value);
      result[j] = round_exact_ratio(mpq_numref(quotient.value), mpq_denref(quotient.value), target);
    } else {
      continue;
    }
    done[a] = true;
    if (statistics != nullptr) ++statistics->exact_cases;
  }
}

std::vector<double> backward(std::span<const double> logits, std::span<const double> dy,
                             const FloatFormat& target, const RowOptions& options, Operation operation) {
  const PreparedRow row =
      prepare_row(logits, options.keep, options.theta, options.fully_masked_gives_zeros, name_of(operation));
  check_gradient(dy, row, logits.size(), operation);
  std::vector<double> result(logits.size(), 0.0);  // masked entries: exactly 0
  if (options.statistics != nullptr) ++options.statistics->calls;
  if (row.active.empty()) return result;
  const DistinctLogits distinct = distinct_logits(logits, row);
  ExactFacts facts;
  gather_exact_facts(dy, row, distinct, facts);
  const LoopState state{logits, dy, &row, &distinct, options.theta, operation};
  std::vector<bool> done(row.active.size(), false);
  decide_exactly(state, facts, target, result, done, options.statistics);
  const auto all_done = [&] { return std::find(done.begin(), done.end(), false) == done.end(); };
  if (all_done()) return result;
  run_ziv_passes(
      ZivSchedule::for_format(target), 0, options.statistics,
      [&](mpfr_prec_t precision) {
        std::vector<std::size_t> zero_band;
        decide_at(state, static_cast<slong>(precision), target, result, done, zero_band);
        if (!zero_band.empty()) settle_zero_signs(state, facts, zero_band, result, done, options.statistics);
        if (!all_done()) decide_by_tails(state, facts, target, result, done);
        if (!all_done()) decide_softmax_by_tails(state, facts, target, result, done);
        return all_done();
      },
      [&] { return std::string(name_of(operation)) + ": rounding"; });
  return result;
}

}  // namespace

std::vector<double> softmax_backward(std::span<const double> logits, std::span<const double> dy,
                                     const FloatFormat& target, const RowOptions& options) {
  return backward(logits, dy, target, options, Operation::softmax);
}

std::vector<double> log_softmax_backward(std::span<const double> logits, std::span<const double> dy,
                                         const FloatFormat& target, const RowOptions& options) {
  return backward(logits, dy, target, options, Operation::log_softmax);
}

}  // namespace sharpcheck::reference
