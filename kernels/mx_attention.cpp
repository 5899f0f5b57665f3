#include "kernels/mx_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "formats/storage.hpp"
#include "kernels/lazy_running_max.hpp"
#include "kernels/logit_maker.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr std::size_t mx_block = 32;
constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
constexpr float log2e = 1.44269504F;

// A matrix quantised to MXFP8 e4m3: element values (codes decoded, without their scale) and each
// block's scale exponent. Blocks run along rows (Q, K) or down columns (V).
struct MxMatrix {
  std::size_t rows = 0, cols = 0;
  bool blocks_down_columns = false;
  std::vector<float> elements;  // rows x cols, e4m3 values
  std::vector<double> scales;   // along rows: rows x ceil(cols/32); down columns: ceil(rows/32) x cols
  [[nodiscard]] std::size_t blocks_per_row() const { return (cols + mx_block - 1) / mx_block; }
  [[nodiscard]] double scale(std::size_t r, std::size_t c) const {
    return blocks_down_columns ? scales[(r / mx_block) * cols + c]
                               : scales[r * blocks_per_row() + c / mx_block];
  }
};

void require_finite(const Matrix& m, const char* what) {
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    if (!std::isfinite(m.values[i]))
      throw InputError(InputProblem::non_finite_value, std::string("attention_mxfp8: ") + what + " entry " +
                                                           std::to_string(i) + " is not finite");
  }
}

// One block (a strided run of `length` entries from `first`) quantised under `rule`.
void quantize_block(const Matrix& m, std::size_t first, std::size_t stride, std::size_t length,
                    ScaleRule rule, MxMatrix& into) {
  std::vector<double> block(length);
  for (std::size_t i = 0; i < length; ++i) block[i] = m.values[first + i * stride];
  const BlockScaledTensor q = quantize(block, mxfp8_e4m3, {.rule = rule, .e8m0_zero_is_zero = false});
  into.scales.push_back(q.block_scale(0));
  for (std::size_t i = 0; i < length; ++i)
    into.elements[first + i * stride] = static_cast<float>(decode(q.codes[i], fp8_e4m3));
}

MxMatrix quantize_matrix(const Matrix& m, bool down_columns, ScaleRule rule) {
  MxMatrix result{m.rows, m.cols, down_columns, std::vector<float>(m.values.size()), {}};
  if (!down_columns) {
    for (std::size_t r = 0; r < m.rows; ++r) {
      for (std::size_t c = 0; c < m.cols; c += mx_block)
        quantize_block(m, r * m.cols + c, 1, std::min(mx_block, m.cols - c), rule, result);
    }
    return result;
  }
  for (std::size_t r = 0; r < m.rows; r += mx_block) {
    for (std::size_t c = 0; c < m.cols; ++c)
      quantize_block(m, r * m.cols + c, m.cols, std::min(mx_block, m.rows - r), rule, result);
  }
  return result;
}

// One query row of the kernel (the header states the arithmetic).
class MxRow {
 public:
  MxRow(const MxMatrix& q, const MxMatrix& k, const MxMatrix& v, const tensor::HeadScores& scores,
        const MxAttentionOptions& options)
      : q_(q),
        k_(k),
        v_(v),
        logit_(scores, q.cols),
        options_(options),
        offset_(std::ldexp(1.0F, options.p_offset_log2)),
        max_(static_cast<float>(options.rescale_threshold_log2 * std::log(2.0))),
        accumulator_(v.cols),
        block_sums_(v.cols),
        tile_scores_(options.tile) {}

  void run(std::size_t query, const std::vector<std::size_t>& visible, double* out, double* lse) {
    max_.start(logit_.has_sink() ? logit_.sink() : minus_infinity);
    sum_ = logit_.has_sink() ? offset_ : 0.0F;
    std::fill(accumulator_.begin(), accumulator_.end(), 0.0F);
    for_each_position_tile(visible, options_.tile, [&](std::size_t start, std::size_t length) {
      add_tile(query, visible, start, length);
    });
    const bool empty = sum_ == 0.0F;
    for (std::size_t c = 0; c < v_.cols; ++c)
      out[c] = Bfloat16::from_float(empty ? 0.0F : accumulator_[c] / sum_).to_float();
    if (lse != nullptr) *lse = empty ? minus_infinity : max_.value() + std::log(sum_ / offset_);
  }

 private:
  float score(std::size_t query, std::size_t key) const {
    const float* a = q_.elements.data() + query * q_.cols;
    const float* b = k_.elements.data() + key * k_.cols;
    float dot = 0.0F;
    const std::size_t blocks = (q_.cols + mx_block - 1) / mx_block;
    for (std::size_t n = 0; n < blocks; ++n) {
      const std::size_t t0 = (options_.reordered_arithmetic ? blocks - 1 - n : n) * mx_block;
      float block = 0.0F;
      for (std::size_t t = t0; t < std::min(q_.cols, t0 + mx_block); ++t) block += a[t] * b[t];
      const double q_scale = options_.bug == MxAttentionBug::q_scale_missing ? 1.0 : q_.scale(query, t0);
      dot += static_cast<float>(block * (q_scale * k_.scale(key, t0)));
    }
    return logit_(dot, query, key);
  }

  void rescale_if_needed(float tile_max) {
    const float rescale = max_.rescale_for(tile_max);
    if (rescale == 1.0F) return;
    sum_ *= rescale;
    for (float& a : accumulator_) a *= rescale;
  }

  void add_tile(std::size_t query, const std::vector<std::size_t>& visible, std::size_t start,
                std::size_t length) {
    float tile_max = minus_infinity;
    for (std::size_t j = 0; j < length; ++j) {
      tile_scores_[j] = score(query, visible[start + j]);
      tile_max = std::max(tile_max, tile_scores_[j]);
    }
    rescale_if_needed(tile_max);
    // P V in runs of keys that share V's block (the MMA's K dimension): exact e4m3 products summed
    // in fp32, then the block's scale.
    std::size_t j = 0;
    while (j < length) {
      const std::size_t block = visible[start + j] / mx_block;
      std::fill(block_sums_.begin(), block_sums_.end(), 0.0F);
      for (; j < length && visible[start + j] / mx_block == block; ++j) {
        const float w = (options_.reordered_arithmetic ? std::exp2((tile_scores_[j] - max_.value()) * log2e)
                                                       : std::exp(tile_scores_[j] - max_.value())) *
                        offset_;
        const float p = static_cast<float>(round_to_format(std::min<double>(w, 448.0), fp8_e4m3));
        sum_ += options_.bug == MxAttentionBug::row_sum_unrounded ? std::min(w, 448.0F) : p;
        const float* value = v_.elements.data() + visible[start + j] * v_.cols;
        for (std::size_t c = 0; c < v_.cols; ++c) block_sums_[c] += p * value[c];
      }
      for (std::size_t c = 0; c < v_.cols; ++c) {
        const double scale =
            options_.bug == MxAttentionBug::v_scale_dropped ? 1.0 : v_.scale(block * mx_block, c);
        accumulator_[c] += static_cast<float>(block_sums_[c] * scale);
      }
    }
  }

  const MxMatrix &q_, &k_, &v_;
  LogitMaker logit_;
  const MxAttentionOptions& options_;
  float offset_;
  LazyRunningMax max_;
  std::vector<float> accumulator_, block_sums_, tile_scores_;
  float sum_ = 0;
};

}  // namespace

void declared_mx_inputs(Matrix& queries, Matrix& keys, Matrix& values, ScaleRule rule) {
  const auto decoded = [](const MxMatrix& mx, Matrix& into) {
    for (std::size_t r = 0; r < mx.rows; ++r) {
      for (std::size_t c = 0; c < mx.cols; ++c)
        into(r, c) = static_cast<double>(mx.elements[r * mx.cols + c]) * mx.scale(r, c);
    }
  };
  require_finite(queries, "Q");
  require_finite(keys, "K");
  require_finite(values, "V");
  decoded(quantize_matrix(queries, false, rule), queries);
  decoded(quantize_matrix(keys, false, rule), keys);
  decoded(quantize_matrix(values, true, rule), values);
}

void attention_mxfp8(const Matrix& queries, const Matrix& keys, const Matrix& values,
                     const tensor::HeadScores& scores, const MxAttentionOptions& options, Matrix& out,
                     std::vector<double>* lse) {
  if (queries.cols != keys.cols || keys.rows != values.rows || queries.cols == 0 || values.cols == 0)
    throw InputError(InputProblem::shape_mismatch, "attention_mxfp8: Q, K and V do not fit together");
  if (options.tile == 0) throw InputError(InputProblem::out_of_range, "attention_mxfp8: a tile of 0 keys");
  require_finite(queries, "Q");
  require_finite(keys, "K");
  require_finite(values, "V");
  const ScaleRule rule = options.bug == MxAttentionBug::ceil_rule ? ScaleRule::ceil : options.rule;
  const MxMatrix q = quantize_matrix(queries, false, rule), k = quantize_matrix(keys, false, rule),
                 v = quantize_matrix(values, true, rule);
  tensor::HeadScores head = scores;
  if (head.queries == 0) head.queries = queries.rows;
  if (head.keys == 0) head.keys = keys.rows;
  if (head.row_stride == 0) head.row_stride = keys.rows;
  MxRow row(q, k, v, head, options);
  out = Matrix(queries.rows, values.cols);
  if (lse != nullptr) lse->assign(queries.rows, 0.0);
  std::vector<std::size_t> visible;
  for (std::size_t i = 0; i < queries.rows; ++i) {
    head.visible_keys(i, visible);
    row.run(i, visible, out.row(i).data(), lse != nullptr ? &(*lse)[i] : nullptr);
  }
}

}  // namespace sharpcheck::kernels
