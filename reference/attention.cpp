#include "reference/attention.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/mpfr_number.hpp"
#include "reference/ball_stage.hpp"
#include "reference/double_stage.hpp"
#include "reference/input_checks.hpp"

// Termination, as in reference/softmax.cpp, by Lindemann-Weierstrass. The logits are
// z_j = s a_j with a_j = Q_i . K_j rational and s = scale / theta algebraic (1/sqrt(d) is), so
// distinct a_j give distinct algebraic exponents. Group the keys by equal a_j (group g: value
// a_g, c_g keys, value sum W_g). An output element o = sum_g exp(s a_g) W_g / sum_g c_g exp(s a_g)
// equal to a rational r gives sum_g (W_g - r c_g) exp(s a_g) = 0, so W_g = r c_g for every g:
// o is rational exactly when every group has the same mean of V, and then o is that mean.
// A weight is rational only when all logits are equal (one group), and then it is 1/k.
// Those exact cases are found by comparing exact dot products and exact group sums, and
// rounded exactly; every other result is irrational, so Ziv's loop decides it.

namespace sharpcheck::reference {
namespace {

constexpr mpfr_prec_t double_precision = 53;

void validate(const Matrix& queries, const Matrix& keys, const Matrix& values,
              const AttentionOptions& options) {
  const std::string name = "attention";
  if (queries.rows == 0 || keys.rows == 0 || queries.cols == 0 || values.cols == 0) {
    throw InputError(InputProblem::empty_input, name + ": empty input (Q is " + std::to_string(queries.rows) +
                                                    "x" + std::to_string(queries.cols) + ", K has " +
                                                    std::to_string(keys.rows) + " rows, V has " +
                                                    std::to_string(values.cols) + " columns)");
  }
  if (keys.cols != queries.cols) {
    throw InputError(InputProblem::shape_mismatch, name + ": Q has " + std::to_string(queries.cols) +
                                                       " columns but K has " + std::to_string(keys.cols));
  }
  if (values.rows != keys.rows) {
    throw InputError(InputProblem::shape_mismatch, name + ": K has " + std::to_string(keys.rows) +
                                                       " rows but V has " + std::to_string(values.rows));
  }
  if (!options.keep.empty() && options.keep.size() != queries.rows * keys.rows) {
    throw InputError(InputProblem::shape_mismatch,
                     name + ": mask has " + std::to_string(options.keep.size()) + " entries, expected " +
                         std::to_string(queries.rows) + "x" + std::to_string(keys.rows));
  }
  check_temperature(options.theta, name);
  if (options.scale && !std::isfinite(*options.scale)) {
    throw InputError(InputProblem::non_finite_value, name + ": scale is not finite");
  }
  check_all_finite(queries, name, "Q");
  check_all_finite(keys, name, "K");
  check_all_finite(values, name, "V");
}

int exponent_of(double x) {
  int exponent = 0;
  std::frexp(x, &exponent);
  return exponent;
}

// Range of frexp exponents of the non-zero entries of a span (empty range: {0, 0}).
std::array<int, 2> exponent_range(std::span<const double> entries) {
  std::array<int, 2> range{INT32_MAX, INT32_MIN};
  for (const double x : entries) {
    if (x == 0.0) continue;
    range[0] = std::min(range[0], exponent_of(x));
    range[1] = std::max(range[1], exponent_of(x));
  }
  if (range[0] > range[1]) range = {0, 0};
  return range;
}

int bits_for_count(std::size_t count) { return static_cast<int>(std::bit_width(count)) + 1; }

// One query row's Ziv loop and exact-case detection.
class QueryRow {
 public:
  QueryRow(const Matrix& queries, const Matrix& keys, const Matrix& values, std::size_t query,
           std::vector<std::size_t> active, const FloatFormat& target, const AttentionOptions& options)
      : keys_(keys),
        values_(values),
        query_(queries.row(query)),
        active_(std::move(active)),
        target_(target),
        options_(options),
        query_numbers_(keys.cols, double_precision),
        key_numbers_(keys.cols, double_precision),
        z_lo_(active_.size(), 64),
        z_hi_(active_.size(), 64),
        w_lo_(active_.size(), 64),
        w_hi_(active_.size(), 64),
        terms_lo_(active_.size(), 64),
        terms_hi_(active_.size(), 64) {
    for (std::size_t t = 0; t < keys.cols; ++t) mpfr_set_d(query_numbers_[t], query_[t], MPFR_RNDN);
  }

  // Fills output (and weights, if non-empty) with the correctly rounded results.
  void solve(std::span<double> output, std::span<double> weights) {
    std::vector<bool> output_done(values_.cols, false);
    std::vector<bool> weight_done(weights.empty() ? 0 : active_.size(), false);
    if (!options_.mpfr_only) {
      decide_attention_row_in_double(query_, keys_, values_, active_, options_.scale, options_.theta, target_,
                                     output, weights, output_done, weight_done);
      const auto in_double = std::count(output_done.begin(), output_done.end(), true) +
                             std::count(weight_done.begin(), weight_done.end(), true);
      if (options_.statistics != nullptr) options_.statistics->decided_in_double += in_double;
      if (all_done(output_done) && all_done(weight_done)) return;
      decide_attention_row_by_balls(query_, keys_, values_, active_, options_.scale, options_.theta, target_,
                                    output, weights, output_done, weight_done);
      if (options_.statistics != nullptr) {
        options_.statistics->decided_by_balls += std::count(output_done.begin(), output_done.end(), true) +
                                                 std::count(weight_done.begin(), weight_done.end(), true) -
                                                 in_double;
      }
      if (all_done(output_done) && all_done(weight_done)) return;
    }
    const ZivSchedule schedule = ZivSchedule::for_format(target_);
    bool exact_cases_checked = false;
    for (mpfr_prec_t precision = schedule.initial;; precision = ZivSchedule::next(precision)) {
      if (precision > schedule.cap) {
        throw UndecidedRounding("attention: rounding to " + std::string(target_.name) + " undecided at " +
                                std::to_string(schedule.cap) + " bits");
      }
      if (!exact_cases_checked && precision >= 4 * schedule.initial) {
        // Two rounds failed to decide something: check for the rational cases.
        apply_exact_cases(output, weights, output_done, weight_done);
        exact_cases_checked = true;
        if (all_done(output_done) && all_done(weight_done)) return;
      }
      if (options_.statistics != nullptr) {
        options_.statistics->highest_precision = std::max(options_.statistics->highest_precision, precision);
      }
      enclose_weights(precision);
      bool decided = decide_weights(precision, weights, weight_done);
      decided = decide_outputs(precision, output, output_done) && decided;
      if (decided) return;
      if (options_.statistics != nullptr) ++options_.statistics->escalations;
    }
  }

 private:
  static bool all_done(const std::vector<bool>& done) {
    return std::all_of(done.begin(), done.end(), [](bool d) { return d; });
  }

  void load_key(std::size_t key) {
    for (std::size_t t = 0; t < keys_.cols; ++t) mpfr_set_d(key_numbers_[t], keys_(key, t), MPFR_RNDN);
  }

  // [m_lo, m_hi] encloses scale / theta.
  void enclose_multiplier(mpfr_prec_t precision, MpfrNumber& m_lo, MpfrNumber& m_hi) const {
    if (options_.scale) {
      mpfr_set_d(m_lo.get(), *options_.scale, MPFR_RNDN);  // exact
      mpfr_set_d(m_hi.get(), *options_.scale, MPFR_RNDN);
    } else {
      MpfrNumber dimension(precision);
      mpfr_set_ui(dimension.get(), keys_.cols, MPFR_RNDN);
      mpfr_rec_sqrt(m_lo.get(), dimension.get(), MPFR_RNDD);
      mpfr_rec_sqrt(m_hi.get(), dimension.get(), MPFR_RNDU);
    }
    const double theta = options_.theta;
    if (theta < 0) mpfr_swap(m_lo.get(), m_hi.get());
    mpfr_div_d(m_lo.get(), m_lo.get(), theta, MPFR_RNDD);
    mpfr_div_d(m_hi.get(), m_hi.get(), theta, MPFR_RNDU);
  }

  // Encloses z_j - c and w_j = exp(z_j - c) for a common shift c, and their sum S.
  void enclose_weights(mpfr_prec_t precision) {
    for (MpfrArray* array : {&z_lo_, &z_hi_, &w_lo_, &w_hi_, &terms_lo_, &terms_hi_})
      array->set_precision(precision);
    MpfrNumber m_lo(precision);
    MpfrNumber m_hi(precision);
    enclose_multiplier(precision, m_lo, m_hi);
    MpfrNumber dot_lo(precision);
    MpfrNumber dot_hi(precision);
    MpfrNumber product(precision);
    for (std::size_t a = 0; a < active_.size(); ++a) {
      load_key(active_[a]);
      const int ternary =
          mpfr_dot(dot_lo.get(), query_numbers_.pointers(), key_numbers_.pointers(), keys_.cols, MPFR_RNDN);
      mpfr_set(dot_hi.get(), dot_lo.get(), MPFR_RNDN);
      if (ternary > 0) mpfr_nextbelow(dot_lo.get());
      if (ternary < 0) mpfr_nextabove(dot_hi.get());
      // Interval product [dot] x [m]: the extremes are among the four end products.
      const std::array<mpfr_srcptr, 2> dot_ends{dot_lo.get(), dot_hi.get()};
      const std::array<mpfr_srcptr, 2> multiplier_ends{m_lo.get(), m_hi.get()};
      bool first = true;
      for (mpfr_srcptr x : dot_ends) {
        for (mpfr_srcptr y : multiplier_ends) {
          mpfr_mul(product.get(), x, y, MPFR_RNDD);
          if (first || mpfr_less_p(product.get(), z_lo_[a])) mpfr_set(z_lo_[a], product.get(), MPFR_RNDN);
          mpfr_mul(product.get(), x, y, MPFR_RNDU);
          if (first || mpfr_greater_p(product.get(), z_hi_[a])) mpfr_set(z_hi_[a], product.get(), MPFR_RNDN);
          first = false;
        }
      }
    }
    MpfrNumber shift(precision);
    mpfr_set(shift.get(), z_hi_[0], MPFR_RNDN);
    for (std::size_t a = 1; a < active_.size(); ++a) mpfr_max(shift.get(), shift.get(), z_hi_[a], MPFR_RNDN);
    for (std::size_t a = 0; a < active_.size(); ++a) {
      mpfr_sub(z_lo_[a], z_lo_[a], shift.get(), MPFR_RNDD);
      mpfr_sub(z_hi_[a], z_hi_[a], shift.get(), MPFR_RNDU);
      mpfr_exp(w_lo_[a], z_lo_[a], MPFR_RNDD);
      mpfr_exp(w_hi_[a], z_hi_[a], MPFR_RNDU);
    }
    sum_lo_ = std::make_unique<MpfrNumber>(precision);
    sum_hi_ = std::make_unique<MpfrNumber>(precision);
    mpfr_sum(sum_lo_->get(), w_lo_.pointers(), active_.size(), MPFR_RNDD);
    mpfr_sum(sum_hi_->get(), w_hi_.pointers(), active_.size(), MPFR_RNDU);
  }

  bool decide_weights(mpfr_prec_t precision, std::span<double> weights, std::vector<bool>& done) {
    if (weights.empty()) return true;
    MpfrNumber lo(precision);
    MpfrNumber hi(precision);
    bool all_decided = true;
    for (std::size_t a = 0; a < active_.size(); ++a) {
      if (done[a]) continue;
      mpfr_div(lo.get(), w_lo_[a], sum_hi_->get(), MPFR_RNDD);
      mpfr_div(hi.get(), w_hi_[a], sum_lo_->get(), MPFR_RNDU);
      if (const auto rounded = round_if_decided(lo.get(), hi.get(), target_)) {
        weights[active_[a]] = *rounded;
        done[a] = true;
      } else {
        all_decided = false;
      }
    }
    return all_decided;
  }

  bool decide_outputs(mpfr_prec_t precision, std::span<double> output, std::vector<bool>& done) {
    MpfrNumber numerator_lo(precision);
    MpfrNumber numerator_hi(precision);
    MpfrNumber lo(precision);
    MpfrNumber hi(precision);
    bool all_decided = true;
    for (std::size_t column = 0; column < values_.cols; ++column) {
      if (done[column]) continue;
      // w_j v_j for w_j in [w_lo, w_hi] >= 0: the ends swap when v_j < 0.
      for (std::size_t a = 0; a < active_.size(); ++a) {
        const double v = values_(active_[a], column);
        mpfr_mul_d(terms_lo_[a], v >= 0 ? w_lo_[a] : w_hi_[a], v, MPFR_RNDD);
        mpfr_mul_d(terms_hi_[a], v >= 0 ? w_hi_[a] : w_lo_[a], v, MPFR_RNDU);
      }
      mpfr_sum(numerator_lo.get(), terms_lo_.pointers(), active_.size(), MPFR_RNDD);
      mpfr_sum(numerator_hi.get(), terms_hi_.pointers(), active_.size(), MPFR_RNDU);
      // N / S with S in [sum_lo, sum_hi] > 0.
      mpfr_div(lo.get(), numerator_lo.get(),
               mpfr_sgn(numerator_lo.get()) >= 0 ? sum_hi_->get() : sum_lo_->get(), MPFR_RNDD);
      mpfr_div(hi.get(), numerator_hi.get(),
               mpfr_sgn(numerator_hi.get()) >= 0 ? sum_lo_->get() : sum_hi_->get(), MPFR_RNDU);
      if (const auto rounded = round_if_decided(lo.get(), hi.get(), target_)) {
        output[column] = *rounded;
        done[column] = true;
      } else {
        all_decided = false;
      }
    }
    return all_decided;
  }

  // Finds the rational results (see the comment at the top of this file) and rounds them exactly.
  void apply_exact_cases(std::span<double> output, std::span<double> weights, std::vector<bool>& output_done,
                         std::vector<bool>& weight_done) {
    const std::vector<std::vector<std::size_t>> groups = group_keys_by_exact_logit();
    if (groups.size() == 1) {
      MpfrNumber one(double_precision);
      mpfr_set_ui(one.get(), 1, MPFR_RNDN);
      const double weight = round_exact_quotient(one.get(), active_.size(), target_);
      for (std::size_t a = 0; a < weight_done.size(); ++a) {
        weights[active_[a]] = weight;
        weight_done[a] = true;
      }
    }
    for (std::size_t column = 0; column < values_.cols; ++column) {
      if (output_done[column]) continue;
      std::vector<double> column_values;
      for (const std::size_t key : active_) column_values.push_back(values_(key, column));
      const auto [low, high] = exponent_range(column_values);
      // Exact sums of up to n doubles, and their products with counts below 2^64.
      const mpfr_prec_t sum_precision = high - low + double_precision + bits_for_count(active_.size()) + 2;
      std::vector<MpfrNumber> group_sums;
      for (const auto& group : groups) {
        MpfrNumber sum(sum_precision);
        mpfr_set_zero(sum.get(), 1);
        for (const std::size_t a : group) {
          if (mpfr_add_d(sum.get(), sum.get(), column_values[a], MPFR_RNDN) != 0) {
            throw std::logic_error("attention: exact group sum was rounded");
          }
        }
        group_sums.push_back(std::move(sum));
      }
      bool equal_means = true;
      MpfrNumber left(sum_precision + 64);
      MpfrNumber right(sum_precision + 64);
      for (std::size_t g = 1; g < groups.size() && equal_means; ++g) {
        mpfr_mul_ui(left.get(), group_sums[g].get(), groups[0].size(), MPFR_RNDN);  // exact
        mpfr_mul_ui(right.get(), group_sums[0].get(), groups[g].size(), MPFR_RNDN);
        equal_means = mpfr_equal_p(left.get(), right.get()) != 0;
      }
      if (!equal_means) continue;
      output[column] = round_exact_quotient(group_sums[0].get(), groups[0].size(), target_);
      output_done[column] = true;
      if (options_.statistics != nullptr) ++options_.statistics->exact_cases;
    }
  }

  // Groups of positions in active_ whose exact dot products Q_i . K_j are equal (all keys form
  // one group when the scale is exactly 0).
  std::vector<std::vector<std::size_t>> group_keys_by_exact_logit() {
    if (options_.scale && *options_.scale == 0.0) {
      std::vector<std::size_t> all(active_.size());
      for (std::size_t a = 0; a < all.size(); ++a) all[a] = a;
      return {all};
    }
    const auto [query_low, query_high] = exponent_range(query_);
    const auto [key_low, key_high] = exponent_range(keys_.values);
    // Each product q_t k_t is exact in 106 bits; their sum is exact in a fixed-point span from
    // the largest product's top bit (plus carries) to the smallest product's last bit.
    const mpfr_prec_t exact_precision = (query_high + key_high) - (query_low + key_low) +
                                        2 * double_precision + bits_for_count(keys_.cols) + 2;
    std::vector<MpfrNumber> dots;
    dots.reserve(active_.size());
    for (const std::size_t key : active_) {
      load_key(key);
      MpfrNumber dot(exact_precision);
      if (mpfr_dot(dot.get(), query_numbers_.pointers(), key_numbers_.pointers(), keys_.cols, MPFR_RNDN) !=
          0) {
        throw std::logic_error("attention: exact dot product was rounded");
      }
      dots.push_back(std::move(dot));
    }
    std::vector<std::size_t> order(active_.size());
    for (std::size_t a = 0; a < order.size(); ++a) order[a] = a;
    std::sort(order.begin(), order.end(),
              [&](std::size_t x, std::size_t y) { return mpfr_less_p(dots[x].get(), dots[y].get()) != 0; });
    std::vector<std::vector<std::size_t>> groups;
    for (std::size_t position = 0; position < order.size(); ++position) {
      if (position == 0 || !mpfr_equal_p(dots[order[position]].get(), dots[order[position - 1]].get())) {
        groups.emplace_back();
      }
      groups.back().push_back(order[position]);
    }
    return groups;
  }

  const Matrix& keys_;
  const Matrix& values_;
  std::span<const double> query_;
  std::vector<std::size_t> active_;
  const FloatFormat& target_;
  const AttentionOptions& options_;
  MpfrArray query_numbers_, key_numbers_;
  MpfrArray z_lo_, z_hi_, w_lo_, w_hi_, terms_lo_, terms_hi_;
  std::unique_ptr<MpfrNumber> sum_lo_, sum_hi_;
};

}  // namespace

AttentionResult attention(const Matrix& queries, const Matrix& keys, const Matrix& values,
                          const FloatFormat& target, const AttentionOptions& options) {
  validate(queries, keys, values, options);
  AttentionResult result{Matrix(queries.rows, values.cols), std::nullopt};
  if (options.return_weights) result.weights = Matrix(queries.rows, keys.rows);
  for (std::size_t query = 0; query < queries.rows; ++query) {
    std::vector<std::size_t> active;
    for (std::size_t key = 0; key < keys.rows; ++key) {
      const bool hidden = (options.causal && key > query) ||
                          (!options.keep.empty() && options.keep[query * keys.rows + key] == 0);
      if (!hidden) active.push_back(key);
    }
    if (options.statistics != nullptr) ++options.statistics->calls;
    if (active.empty()) {
      if (options.fully_masked_gives_zeros) continue;
      throw InputError(InputProblem::fully_masked_row,
                       "attention: query " + std::to_string(query) + " sees no key (every key is masked)");
    }
    std::span<double> weights;
    if (result.weights) weights = result.weights->row(query);
    QueryRow(queries, keys, values, query, std::move(active), target, options)
        .solve(result.output.row(query), weights);
  }
  return result;
}

}  // namespace sharpcheck::reference
