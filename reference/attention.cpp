#include "reference/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/mpfr_number.hpp"
#include "core/parallel.hpp"
#include "reference/attention_double_block.hpp"
#include "reference/attention_row.hpp"
#include "reference/ball_stage.hpp"
#include "reference/double_stage.hpp"
#include "reference/enclosed_product.hpp"
#include "reference/input_checks.hpp"
#include "reference/ziv_loop.hpp"
#include "tensor/head_view.hpp"

// Each row goes through the certified double stage, the Arb ball stage and then the MPFR Ziv
// loop below; each stage decides what it can and leaves the rest (so the stages change cost,
// never results). The termination argument is in reference/attention_exact.cpp.

namespace sharpcheck::reference {

bool AttentionRowResults::all_done() const {
  const auto done = [](const std::vector<bool>& flags) {
    return std::all_of(flags.begin(), flags.end(), [](bool d) { return d; });
  };
  return done(output_done) && done(weight_done) && (lse == nullptr || lse_done);
}

long AttentionRowResults::decided_count() const {
  return std::count(output_done.begin(), output_done.end(), true) +
         std::count(weight_done.begin(), weight_done.end(), true) + (lse != nullptr && lse_done ? 1 : 0);
}

namespace {

void validate(const Matrix& queries, const Matrix& keys, const Matrix& values,
              const tensor::HeadScores& scores) {
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
  if (scores.queries > queries.rows || scores.keys > keys.rows) {
    throw InputError(InputProblem::shape_mismatch,
                     name + ": the scores cover " + std::to_string(scores.queries) + "x" +
                         std::to_string(scores.keys) + " but Q has " + std::to_string(queries.rows) +
                         " rows and K " + std::to_string(keys.rows));
  }
  scores.validate(name);
  check_all_finite(queries, name, "Q");
  check_all_finite(keys, name, "K");
  check_all_finite(values, name, "V");
}

// One query row's MPFR Ziv loop over enclosures of its logits, weights, outputs and log-sum-exp.
// The inputs are finite here (checked before any stage), so a NaN end is the enclosure's own: at a
// low precision a logit of 1e30 spans more than MPFR's exponent range, its exponential's ends
// overflow and underflow, and 0 / 0 or inf / inf follows. Such an enclosure decides nothing; the
// next precision narrows it (round_if_decided would take the NaN for a NaN input's answer).
std::optional<double> decided_enclosure(mpfr_srcptr lo, mpfr_srcptr hi, const FloatFormat& format) {
  if (mpfr_nan_p(lo) != 0 || mpfr_nan_p(hi) != 0) return std::nullopt;
  return round_if_decided(lo, hi, format);
}

class ZivRow {
 public:
  ZivRow(const AttentionRow& row, const FloatFormat& target)
      : row_(row),
        target_(target),
        query_numbers_(row.keys.cols, 53),
        key_numbers_(row.keys.cols, 53),
        z_lo_(row.entries(), 64),
        z_hi_(row.entries(), 64),
        w_lo_(row.entries(), 64),
        w_hi_(row.entries(), 64),
        terms_lo_(row.active.size(), 64),
        terms_hi_(row.active.size(), 64) {
    for (std::size_t t = 0; t < row.keys.cols; ++t) mpfr_set_d(query_numbers_[t], row.query[t], MPFR_RNDN);
  }

  void solve(AttentionRowResults& results, ZivStatistics* statistics) {
    const ZivSchedule schedule = ZivSchedule::for_format(target_);
    bool exact_cases_checked = false;
    const auto pass = [&](mpfr_prec_t precision) {
      if (!exact_cases_checked && precision >= 4 * schedule.initial) {
        // Two rounds failed to decide something: check for the rational cases.
        const long exact = apply_attention_exact_cases(row_, target_, results);
        if (statistics != nullptr) statistics->exact_cases += exact;
        exact_cases_checked = true;
        if (results.all_done()) return true;
      }
      enclose(precision);
      decide_weights(precision, results);
      decide_outputs(precision, results);
      decide_lse(precision, results);
      return results.all_done();
    };
    run_ziv_passes(schedule, 0, statistics, pass, [&] {
      return "attention (" + row_.scores.describe() + "): rounding to " + std::string(target_.name);
    });
  }

 private:
  // [lo, hi] encloses the exact dot product Q_i . K_key.
  void enclose_dot(std::size_t key, mpfr_ptr lo, mpfr_ptr hi) {
    for (std::size_t t = 0; t < row_.keys.cols; ++t)
      mpfr_set_d(key_numbers_[t], row_.keys(key, t), MPFR_RNDN);
    const int ternary =
        mpfr_dot(lo, query_numbers_.pointers(), key_numbers_.pointers(), row_.keys.cols, MPFR_RNDN);
    mpfr_set(hi, lo, MPFR_RNDN);
    if (ternary > 0) mpfr_nextbelow(lo);
    if (ternary < 0) mpfr_nextabove(hi);
  }

  void enclose_scale(mpfr_prec_t precision, MpfrNumber& lo, MpfrNumber& hi) const {
    if (row_.scores.scale_is_ln2) {
      mpfr_const_log2(lo.get(), MPFR_RNDD);
      mpfr_const_log2(hi.get(), MPFR_RNDU);
      return;
    }
    if (row_.scores.scale) {
      mpfr_set_d(lo.get(), *row_.scores.scale, MPFR_RNDN);  // exact
      mpfr_set_d(hi.get(), *row_.scores.scale, MPFR_RNDN);
      return;
    }
    MpfrNumber dimension(precision);
    mpfr_set_ui(dimension.get(), row_.keys.cols, MPFR_RNDN);
    mpfr_rec_sqrt(lo.get(), dimension.get(), MPFR_RNDD);
    mpfr_rec_sqrt(hi.get(), dimension.get(), MPFR_RNDU);
  }

  // [z_lo, z_hi] = [dot] x [scale] (the extremes are among the four end products), soft-capped.
  void enclose_score(std::size_t a, mpfr_prec_t precision, const MpfrNumber& s_lo, const MpfrNumber& s_hi) {
    MpfrNumber dot_lo(precision), dot_hi(precision), product(precision);
    enclose_dot(row_.active[a], dot_lo.get(), dot_hi.get());
    bool first = true;
    for (mpfr_srcptr x : {dot_lo.get(), dot_hi.get()}) {
      for (mpfr_srcptr y : {s_lo.get(), s_hi.get()}) {
        mpfr_mul(product.get(), x, y, MPFR_RNDD);
        if (first || mpfr_less_p(product.get(), z_lo_[a])) mpfr_set(z_lo_[a], product.get(), MPFR_RNDN);
        mpfr_mul(product.get(), x, y, MPFR_RNDU);
        if (first || mpfr_greater_p(product.get(), z_hi_[a])) mpfr_set(z_hi_[a], product.get(), MPFR_RNDN);
        first = false;
      }
    }
    const double cap = row_.scores.softcap;
    if (cap == 0.0) return;
    // cap tanh(t / cap) is increasing in t: each end rounded its own way.
    for (const auto& [end, mode] : {std::pair{z_lo_[a], MPFR_RNDD}, std::pair{z_hi_[a], MPFR_RNDU}}) {
      mpfr_div_d(end, end, cap, mode);
      mpfr_tanh(end, end, mode);
      mpfr_mul_d(end, end, cap, mode);
    }
  }

  // Adds the exact bias additive - slope * distance, rounded outward.
  void add_bias(std::size_t a, mpfr_prec_t precision) {
    const tensor::HeadScores::BiasTerms& terms = row_.bias[a];
    MpfrNumber alibi_lo(precision), alibi_hi(precision), bias(precision);
    mpfr_set_d(alibi_lo.get(), terms.slope, MPFR_RNDN);
    mpfr_set(alibi_hi.get(), alibi_lo.get(), MPFR_RNDN);
    mpfr_mul_si(alibi_lo.get(), alibi_lo.get(), static_cast<long>(terms.distance), MPFR_RNDD);
    mpfr_mul_si(alibi_hi.get(), alibi_hi.get(), static_cast<long>(terms.distance), MPFR_RNDU);
    mpfr_set_d(bias.get(), terms.additive, MPFR_RNDN);
    mpfr_add(z_lo_[a], z_lo_[a], bias.get(), MPFR_RNDD);
    mpfr_sub(z_lo_[a], z_lo_[a], alibi_hi.get(), MPFR_RNDD);
    mpfr_add(z_hi_[a], z_hi_[a], bias.get(), MPFR_RNDU);
    mpfr_sub(z_hi_[a], z_hi_[a], alibi_lo.get(), MPFR_RNDU);
  }

  // Encloses every entry's logit, its exponential against a common shift, and their sum S.
  void enclose(mpfr_prec_t precision) {
    for (MpfrArray* array : {&z_lo_, &z_hi_, &w_lo_, &w_hi_, &terms_lo_, &terms_hi_})
      array->set_precision(precision);
    MpfrNumber s_lo(precision), s_hi(precision);
    enclose_scale(precision, s_lo, s_hi);
    const std::size_t count = row_.entries();
    for (std::size_t a = 0; a < row_.active.size(); ++a) {
      enclose_score(a, precision, s_lo, s_hi);
      if (!row_.bias.empty()) add_bias(a, precision);
    }
    if (row_.has_sink()) {
      mpfr_set_d(z_lo_[count - 1], *row_.scores.sink, MPFR_RNDN);
      mpfr_set_d(z_hi_[count - 1], *row_.scores.sink, MPFR_RNDN);
    }
    const double theta = row_.scores.theta;
    for (std::size_t a = 0; a < count; ++a) {
      if (theta < 0) mpfr_swap(z_lo_[a], z_hi_[a]);
      mpfr_div_d(z_lo_[a], z_lo_[a], theta, MPFR_RNDD);
      mpfr_div_d(z_hi_[a], z_hi_[a], theta, MPFR_RNDU);
    }
    shift_ = std::make_unique<MpfrNumber>(precision);
    mpfr_set(shift_->get(), z_hi_[0], MPFR_RNDN);
    for (std::size_t a = 1; a < count; ++a) mpfr_max(shift_->get(), shift_->get(), z_hi_[a], MPFR_RNDN);
    for (std::size_t a = 0; a < count; ++a) {
      mpfr_sub(z_lo_[a], z_lo_[a], shift_->get(), MPFR_RNDD);
      mpfr_sub(z_hi_[a], z_hi_[a], shift_->get(), MPFR_RNDU);
      mpfr_exp(w_lo_[a], z_lo_[a], MPFR_RNDD);
      mpfr_exp(w_hi_[a], z_hi_[a], MPFR_RNDU);
    }
    sum_lo_ = std::make_unique<MpfrNumber>(precision);
    sum_hi_ = std::make_unique<MpfrNumber>(precision);
    mpfr_sum(sum_lo_->get(), w_lo_.pointers(), count, MPFR_RNDD);
    mpfr_sum(sum_hi_->get(), w_hi_.pointers(), count, MPFR_RNDU);
  }

  void decide_weights(mpfr_prec_t precision, AttentionRowResults& results) {
    if (results.weights.empty()) return;
    MpfrNumber lo(precision), hi(precision);
    for (std::size_t a = 0; a < row_.active.size(); ++a) {
      if (results.weight_done[a]) continue;
      mpfr_div(lo.get(), w_lo_[a], sum_hi_->get(), MPFR_RNDD);
      mpfr_div(hi.get(), w_hi_[a], sum_lo_->get(), MPFR_RNDU);
      if (const auto rounded = decided_enclosure(lo.get(), hi.get(), target_)) {
        results.weights[row_.active[a]] = *rounded;
        results.weight_done[a] = true;
      }
    }
  }

  void decide_outputs(mpfr_prec_t precision, AttentionRowResults& results) {
    MpfrNumber numerator_lo(precision), numerator_hi(precision), lo(precision), hi(precision);
    const std::size_t count = row_.active.size();  // the sink has no value
    for (std::size_t column = 0; column < row_.values.cols; ++column) {
      if (results.output_done[column]) continue;
      // w_j v_j for w_j in [w_lo, w_hi] >= 0: the ends swap when v_j < 0.
      for (std::size_t a = 0; a < count; ++a) {
        const double v = row_.values(row_.active[a], column);
        mpfr_mul_d(terms_lo_[a], v >= 0 ? w_lo_[a] : w_hi_[a], v, MPFR_RNDD);
        mpfr_mul_d(terms_hi_[a], v >= 0 ? w_hi_[a] : w_lo_[a], v, MPFR_RNDU);
      }
      mpfr_sum(numerator_lo.get(), terms_lo_.pointers(), count, MPFR_RNDD);
      mpfr_sum(numerator_hi.get(), terms_hi_.pointers(), count, MPFR_RNDU);
      // N / S with S in [sum_lo, sum_hi] > 0.
      mpfr_div(lo.get(), numerator_lo.get(),
               mpfr_sgn(numerator_lo.get()) >= 0 ? sum_hi_->get() : sum_lo_->get(), MPFR_RNDD);
      mpfr_div(hi.get(), numerator_hi.get(),
               mpfr_sgn(numerator_hi.get()) >= 0 ? sum_lo_->get() : sum_hi_->get(), MPFR_RNDU);
      if (const auto rounded = decided_enclosure(lo.get(), hi.get(), target_)) {
        results.output[column] = *rounded;
        results.output_done[column] = true;
      }
    }
  }

  // L = shift + ln S (and L / ln 2 for base 2).
  void decide_lse(mpfr_prec_t precision, AttentionRowResults& results) {
    if (results.lse == nullptr || results.lse_done) return;
    MpfrNumber lo(precision), hi(precision);
    mpfr_log(lo.get(), sum_lo_->get(), MPFR_RNDD);
    mpfr_log(hi.get(), sum_hi_->get(), MPFR_RNDU);
    mpfr_add(lo.get(), lo.get(), shift_->get(), MPFR_RNDD);
    mpfr_add(hi.get(), hi.get(), shift_->get(), MPFR_RNDU);
    if (results.lse_base2) {
      MpfrNumber ln2_lo(precision), ln2_hi(precision);
      mpfr_const_log2(ln2_lo.get(), MPFR_RNDD);
      mpfr_const_log2(ln2_hi.get(), MPFR_RNDU);
      mpfr_div(lo.get(), lo.get(), mpfr_sgn(lo.get()) >= 0 ? ln2_hi.get() : ln2_lo.get(), MPFR_RNDD);
      mpfr_div(hi.get(), hi.get(), mpfr_sgn(hi.get()) >= 0 ? ln2_lo.get() : ln2_hi.get(), MPFR_RNDU);
    }
    if (const auto rounded = decided_enclosure(lo.get(), hi.get(), *results.lse_target)) {
      *results.lse = *rounded;
      results.lse_done = true;
    }
  }

  const AttentionRow& row_;
  const FloatFormat& target_;
  MpfrArray query_numbers_, key_numbers_;
  MpfrArray z_lo_, z_hi_, w_lo_, w_hi_, terms_lo_, terms_hi_;
  std::unique_ptr<MpfrNumber> shift_, sum_lo_, sum_hi_;
};

// After the double stage: the ball stage, then the Ziv loop, for one row.
void solve_row(const AttentionRow& row, const FloatFormat& target, bool mpfr_only,
               AttentionRowResults& results, ZivStatistics* statistics) {
  if (!mpfr_only) {
    const long in_double = results.decided_count();
    if (statistics != nullptr) statistics->decided_in_double += in_double;
    if (results.all_done()) return;
    decide_attention_row_by_balls(row, target, results);
    if (statistics != nullptr) statistics->decided_by_balls += results.decided_count() - in_double;
    if (results.all_done()) return;
  }
  ZivRow(row, target).solve(results, statistics);
}

struct RowRequest {
  std::span<double> output;
  std::span<double> weights;  // empty: not asked for
  double* lse = nullptr;
  bool lse_base2 = false;
  bool mpfr_only = false;
  ZivStatistics* statistics = nullptr;
  const FloatFormat* lse_target = nullptr;  // null: the outputs' format
};

// Queries [first, first + requests.size()) of a head: their keys, bias terms and sink, the fully
// masked rule, the double stage for the rows together, then each row's later stages.
void attention_rows(const Matrix& queries, const Matrix& keys, const Matrix& values,
                    const tensor::HeadScores& scores, std::size_t first, const FloatFormat& target,
                    std::span<const RowRequest> requests) {
  const std::size_t count = requests.size();
  std::vector<std::vector<std::size_t>> active(count);
  std::vector<std::vector<tensor::HeadScores::BiasTerms>> bias(count);
  std::vector<AttentionRow> rows;
  std::vector<AttentionRowResults> results;
  std::vector<std::size_t> which;
  for (std::size_t r = 0; r < count; ++r) {
    const std::size_t query = first + r;
    const RowRequest& request = requests[r];
    scores.visible_keys(query, active[r]);
    if (scores.has_bias()) {
      for (const std::size_t key : active[r]) bias[r].push_back(scores.bias_terms(query, key));
    }
    if (request.statistics != nullptr) ++request.statistics->calls;
    const AttentionRow row{queries.row(query), keys, values, active[r], bias[r], scores};
    if (row.entries() == 0) {
      if (scores.fully_masked == tensor::FullyMaskedRows::error) {
        throw InputError(InputProblem::fully_masked_row,
                         "attention: query " + std::to_string(query) + " sees no key (every key is masked)");
      }
      if (request.lse != nullptr) *request.lse = -INFINITY;
      continue;  // outputs and weights stay 0
    }
    rows.push_back(row);
    results.push_back({request.output, request.weights, request.lse, request.lse_base2,
                       request.lse_target != nullptr ? request.lse_target : &target,
                       std::vector<bool>(values.cols, false),
                       std::vector<bool>(request.weights.empty() ? 0 : active[r].size(), false)});
    which.push_back(r);
  }
  if (!rows.empty() && !requests.front().mpfr_only) decide_attention_block_in_double(rows, target, results);
  for (std::size_t k = 0; k < rows.size(); ++k)
    solve_row(rows[k], target, requests[which[k]].mpfr_only, results[k], requests[which[k]].statistics);
}

tensor::HeadScores completed_scores(const AttentionOptions& options, const Matrix& queries,
                                    const Matrix& keys) {
  tensor::HeadScores scores = options.scores;
  if (scores.queries == 0) scores.queries = queries.rows;
  if (scores.keys == 0) scores.keys = keys.rows;
  if (scores.row_stride == 0) scores.row_stride = keys.rows;
  return scores;
}

}  // namespace

AttentionResult attention(const Matrix& queries, const Matrix& keys, const Matrix& values,
                          const FloatFormat& target, const AttentionOptions& options) {
  const tensor::HeadScores scores = completed_scores(options, queries, keys);
  validate(queries, keys, values, scores);
  AttentionResult result{Matrix(queries.rows, values.cols), std::nullopt, {}};
  if (options.return_weights) result.weights = Matrix(queries.rows, keys.rows);
  if (options.return_lse) result.lse.assign(queries.rows, 0.0);
  const std::size_t block_rows = rows_per_block(keys.rows, 32);
  const SingleThreadedBlas single_threaded;  // the products are small; heads may run in parallel
  std::vector<RowRequest> requests;
  for (std::size_t first = 0; first < scores.queries; first += block_rows) {
    requests.clear();
    for (std::size_t query = first; query < std::min(scores.queries, first + block_rows); ++query) {
      RowRequest request{
          result.output.row(query), {}, nullptr, options.lse_base2, options.mpfr_only, options.statistics,
          options.lse_format};
      if (result.weights) request.weights = result.weights->row(query);
      if (options.return_lse) request.lse = &result.lse[query];
      requests.push_back(request);
    }
    attention_rows(queries, keys, values, scores, first, target, requests);
  }
  return result;
}

AttentionTensorResult attention(const tensor::AttentionProblem& problem, std::span<const double> q,
                                std::span<const double> k, std::span<const double> v,
                                const FloatFormat& target, const AttentionTensorOptions& options) {
  problem.validate();
  check_tensor_sizes(problem, q, k, v);
  const tensor::AttentionShape& shape = problem.shape;
  AttentionTensorResult result;
  result.output.assign(problem.output_elements(), 0.0);
  if (options.return_lse) result.lse.assign(problem.lse_elements(), 0.0);
  if (options.return_weights) {
    result.weight_queries = problem.layout == tensor::Layout::packed ? 0 : shape.queries;
    result.weight_keys = problem.layout == tensor::Layout::packed ? 0 : shape.keys;
    for (std::size_t b = 0; b < shape.batch; ++b) {
      result.weight_queries = std::max(result.weight_queries, problem.query_length(b));
      result.weight_keys = std::max(result.weight_keys, problem.key_length(b));
    }
    result.weights.assign(shape.batch * shape.heads * result.weight_queries * result.weight_keys, 0.0);
  }
  const auto weights_of = [&](std::size_t b, std::size_t h, std::size_t s,
                              std::size_t keys) -> std::span<double> {
    if (!options.return_weights) return {};
    return {result.weights.data() + ((b * shape.heads + h) * result.weight_queries + s) * result.weight_keys,
            keys};
  };
  const tensor::SpanSource q_source(q), k_source(k), v_source(v);
  std::mutex statistics_mutex;
  const SingleThreadedBlas single_threaded;  // the blocks run in parallel already
  for (std::size_t b = 0; b < shape.batch; ++b) {
    const std::size_t query_rows = problem.query_length(b);
    const std::size_t key_rows = problem.key_length(b);
    if (query_rows == 0) continue;
    for (std::size_t kv = 0; kv < shape.kv_heads; ++kv) {
      const Matrix keys = tensor::gather_head(problem, tensor::HeadTensor::key, k_source, b, kv);
      const Matrix values = tensor::gather_head(problem, tensor::HeadTensor::value, v_source, b, kv);
      std::vector<Matrix> queries;
      std::vector<tensor::HeadScores> scores;
      for (std::size_t g = 0; g < problem.group_size(); ++g) {
        const std::size_t h = kv * problem.group_size() + g;
        queries.push_back(tensor::gather_head(problem, tensor::HeadTensor::query, q_source, b, h));
        scores.push_back(problem.head(b, h));
        if (key_rows == 0) scores.back().keys = 0;
      }
      const std::size_t rows_per_item = rows_per_block(key_rows, 32);
      const std::size_t chunks = (query_rows + rows_per_item - 1) / rows_per_item;
      parallel_for(problem.group_size() * chunks, options.threads, [&](std::size_t item) {
        const std::size_t g = item / chunks;
        const std::size_t h = kv * problem.group_size() + g;
        ZivStatistics local;
        const std::size_t first = (item % chunks) * rows_per_item;
        std::vector<RowRequest> requests;
        for (std::size_t s = first; s < std::min(query_rows, first + rows_per_item); ++s) {
          RowRequest request{{result.output.data() + problem.output_offset(b, h, s, 0), shape.value_dim},
                             weights_of(b, h, s, key_rows),
                             nullptr,
                             options.lse_base2,
                             options.mpfr_only,
                             &local,
                             options.lse_format};
          if (options.return_lse) request.lse = &result.lse[problem.lse_offset(b, h, s)];
          requests.push_back(request);
        }
        attention_rows(queries[g], keys, values, scores[g], first, target, requests);
        if (options.statistics != nullptr) {
          const std::lock_guard lock(statistics_mutex);
          options.statistics->merge(local);
        }
      });
    }
  }
  return result;
}

}  // namespace sharpcheck::reference
