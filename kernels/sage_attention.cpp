#include "kernels/sage_attention.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "formats/block_scaled.hpp"
#include "formats/storage.hpp"
#include "kernels/lazy_running_max.hpp"
#include "kernels/logit_maker.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr std::size_t mma_keys = 32;  // the FP8 MMA's K dimension: P V blocks of 32 keys
constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
constexpr IntegerFormat int8_symmetric{.codes = IntegerCodes::int8, .symmetric = true};

// A matrix in symmetric INT8 blocks of `block` rows: codes and one fp32 scale per block.
struct Int8Rows {
  std::size_t rows = 0, cols = 0, block = 1;
  std::vector<std::int32_t> codes;
  std::vector<float> scales;
  [[nodiscard]] float scale_of(std::size_t row) const { return scales[row / block]; }
};

// V in e4m3 per column: element values (codes decoded) and one fp32 scale per column.
struct Fp8Columns {
  std::vector<float> elements;
  std::vector<float> scales;
};

// What the kernel computes with: the quantised Q, K' and V and the mean k~ it subtracted.
struct SageInputs {
  Int8Rows q, k;
  Fp8Columns v;
  std::vector<float> key_mean;  // k~, zeros when not smoothed
};

void require_finite(const Matrix& m, const char* what) {
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    if (!std::isfinite(m.values[i]))
      throw InputError(InputProblem::non_finite_value, std::string("attention_sage: ") + what + " entry " +
                                                           std::to_string(i) + " is not finite");
  }
}

Int8Rows quantize_rows(const std::vector<float>& values, std::size_t rows, std::size_t cols,
                       std::size_t block) {
  Int8Rows result{rows, cols, block, std::vector<std::int32_t>(values.size()), {}};
  for (std::size_t first = 0; first < rows; first += block) {
    const std::size_t last = std::min(rows, first + block);
    const std::vector<double> group(values.begin() + static_cast<std::ptrdiff_t>(first * cols),
                                    values.begin() + static_cast<std::ptrdiff_t>(last * cols));
    const IntegerGroup quantised = quantize_integer(group, int8_symmetric);
    std::copy(quantised.codes.begin(), quantised.codes.end(),
              result.codes.begin() + static_cast<std::ptrdiff_t>(first * cols));
    result.scales.push_back(static_cast<float>(quantised.scale));
  }
  return result;
}

Fp8Columns quantize_columns(const Matrix& v) {
  Fp8Columns result{std::vector<float>(v.values.size()), std::vector<float>(v.cols)};
  for (std::size_t c = 0; c < v.cols; ++c) {
    double amax = 0;
    for (std::size_t r = 0; r < v.rows; ++r) amax = std::max(amax, std::fabs(v(r, c)));
    const float scale = amax == 0 ? 1.0F : static_cast<float>(amax / 448.0);
    result.scales[c] = scale;
    for (std::size_t r = 0; r < v.rows; ++r)
      result.elements[r * v.cols + c] =
          static_cast<float>(round_to_format(v(r, c) / static_cast<double>(scale), fp8_e4m3));
  }
  return result;
}

SageInputs quantize_inputs(const Matrix& queries, const Matrix& keys, const Matrix& values, bool smoothed,
                           const SageAttentionOptions& options) {
  require_finite(queries, "Q");
  require_finite(keys, "K");
  require_finite(values, "V");
  SageInputs in;
  const std::size_t d = keys.cols;
  in.key_mean.assign(d, 0.0F);
  if (smoothed && keys.rows > 0) {
    for (std::size_t t = 0; t < d; ++t) {
      float sum = 0.0F;
      for (std::size_t j = 0; j < keys.rows; ++j) sum += static_cast<float>(keys(j, t));
      in.key_mean[t] = sum / static_cast<float>(keys.rows);
    }
  }
  std::vector<float> q(queries.values.begin(), queries.values.end()), k(keys.values.size());
  for (std::size_t e = 0; e < k.size(); ++e) k[e] = static_cast<float>(keys.values[e]) - in.key_mean[e % d];
  in.q = quantize_rows(q, queries.rows, queries.cols, options.q_block);
  in.k = quantize_rows(k, keys.rows, keys.cols, options.k_block);
  in.v = quantize_columns(values);
  return in;
}

// fl22: an FP8 MMA accumulator keeping 22 significant bits, truncating (toward zero).
float truncate_to_22_bits(float x) {
  auto bits = std::bit_cast<std::uint32_t>(x);
  bits &= ~std::uint32_t{0x3};  // fp32 keeps 24; drop the last two
  return std::bit_cast<float>(bits);
}

// One query row of the kernel (the header states the arithmetic).
class SageRow {
 public:
  SageRow(const SageInputs& in, const tensor::HeadScores& scores, const SageAttentionOptions& options)
      : in_(in),
        logit_(scores, in.q.cols),
        options_(options),
        max_(static_cast<float>(options.rescale_threshold_log2 * std::log(2.0))),
        scale_(static_cast<float>(scores.scale ? *scores.scale
                                               : 1.0 / std::sqrt(static_cast<double>(in.q.cols)))),
        inverse_theta_(static_cast<float>(1.0 / scores.theta)),
        buffer_(in.v.scales.size()),
        block_(in.v.scales.size()),
        tile_scores_(options.tile) {}

  void run(std::size_t query, const std::vector<std::size_t>& visible, double* out, double* lse) {
    const float shift = correction(query);
    max_.start(logit_.has_sink() ? logit_.sink() : minus_infinity);
    sum_ = logit_.has_sink() ? offset : 0.0F;
    std::fill(buffer_.begin(), buffer_.end(), 0.0F);
    for_each_position_tile(visible, options_.tile, [&](std::size_t start, std::size_t length) {
      add_tile(query, visible, start, length);
    });
    const bool empty = sum_ == 0.0F;
    for (std::size_t c = 0; c < buffer_.size(); ++c)
      out[c] = Bfloat16::from_float(empty ? 0.0F : buffer_[c] * in_.v.scales[c] / sum_).to_float();
    if (lse == nullptr) return;
    const bool smoothed = options_.bug != SageAttentionBug::lse_unsmoothed;
    *lse = empty ? minus_infinity : max_.value() + std::log(sum_ / offset) + (smoothed ? shift : 0.0F);
  }

 private:
  static constexpr float offset = 256.0F;

  // c = fl(fl(q^ . k~) scale) / theta: what the smoothing took from every score of this row.
  float correction(std::size_t query) const {
    float dot = 0.0F;
    const float q_scale = in_.q.scale_of(query);
    for (std::size_t t = 0; t < in_.q.cols; ++t)
      dot += static_cast<float>(in_.q.codes[query * in_.q.cols + t]) * q_scale * in_.key_mean[t];
    const float c = dot * scale_ * inverse_theta_;
    return options_.bug == SageAttentionBug::lse_correction_bf16 ? Bfloat16::from_float(c).to_float() : c;
  }

  float score(std::size_t query, std::size_t key) const {
    const std::int32_t* a = in_.q.codes.data() + query * in_.q.cols;
    const std::int32_t* b = in_.k.codes.data() + key * in_.k.cols;
    std::int32_t dot = 0;
    for (std::size_t t = 0; t < in_.q.cols; ++t) dot += a[t] * b[t];
    const float q_scale = options_.bug == SageAttentionBug::q_scale_missing ? 1.0F : in_.q.scale_of(query);
    return logit_(static_cast<float>(dot) * (q_scale * in_.k.scale_of(key)), query, key);
  }

  void rescale_if_needed(float tile_max) {
    const float rescale = max_.rescale_for(tile_max);
    if (rescale == 1.0F) return;
    sum_ *= rescale;
    for (float& a : buffer_) a *= rescale;
  }

  void add_tile(std::size_t query, const std::vector<std::size_t>& visible, std::size_t start,
                std::size_t length) {
    float tile_max = minus_infinity;
    for (std::size_t j = 0; j < length; ++j) {
      tile_scores_[j] = score(query, visible[start + j]);
      tile_max = std::max(tile_max, tile_scores_[j]);
    }
    rescale_if_needed(tile_max);
    const std::size_t columns = buffer_.size();
    for (std::size_t j0 = 0; j0 < length; j0 += mma_keys) {
      std::fill(block_.begin(), block_.end(), 0.0F);
      for (std::size_t j = j0; j < std::min(length, j0 + mma_keys); ++j) {
        const float w = std::exp(tile_scores_[j] - max_.value()) * offset;
        const auto p = static_cast<float>(round_to_format(std::min(w, 448.0F), fp8_e4m3));
        sum_ += options_.bug == SageAttentionBug::row_sum_rounded ? p : w;
        const float* v = in_.v.elements.data() + visible[start + j] * columns;
        for (std::size_t c = 0; c < columns; ++c) block_[c] = truncate_to_22_bits(block_[c] + p * v[c]);
      }
      for (std::size_t c = 0; c < columns; ++c) buffer_[c] += block_[c];
    }
  }

  const SageInputs& in_;
  LogitMaker logit_;
  const SageAttentionOptions& options_;
  LazyRunningMax max_;
  float scale_, inverse_theta_;
  std::vector<float> buffer_, block_, tile_scores_;
  float sum_ = 0;
};

void check_shapes(const Matrix& queries, const Matrix& keys, const Matrix& values,
                  const SageAttentionOptions& options) {
  if (queries.cols != keys.cols || keys.rows != values.rows || queries.cols == 0 || values.cols == 0)
    throw InputError(InputProblem::shape_mismatch, "attention_sage: Q, K and V do not fit together");
  if (options.tile == 0 || options.q_block == 0 || options.k_block == 0)
    throw InputError(InputProblem::out_of_range, "attention_sage: a tile or quantisation block of 0 rows");
}

}  // namespace

bool smooths_keys(const tensor::HeadScores& scores) { return scores.softcap == 0.0 && !scores.sink; }

void declared_sage_inputs(Matrix& queries, Matrix& keys, Matrix& values, bool smoothed,
                          const SageAttentionOptions& options) {
  check_shapes(queries, keys, values, options);
  const SageInputs in = quantize_inputs(queries, keys, values, smoothed, options);
  for (std::size_t i = 0; i < queries.values.size(); ++i)
    queries.values[i] = static_cast<double>(in.q.codes[i]) * in.q.scale_of(i / queries.cols);
  for (std::size_t i = 0; i < keys.values.size(); ++i)
    keys.values[i] = static_cast<double>(in.k.codes[i]) * in.k.scale_of(i / keys.cols) +
                     static_cast<double>(in.key_mean[i % keys.cols]);
  for (std::size_t i = 0; i < values.values.size(); ++i)
    values.values[i] =
        static_cast<double>(in.v.elements[i]) * static_cast<double>(in.v.scales[i % values.cols]);
}

void attention_sage(const Matrix& queries, const Matrix& keys, const Matrix& values,
                    const tensor::HeadScores& scores, const SageAttentionOptions& options, Matrix& out,
                    std::vector<double>* lse) {
  check_shapes(queries, keys, values, options);
  tensor::HeadScores head = scores;
  if (head.queries == 0) head.queries = queries.rows;
  if (head.keys == 0) head.keys = keys.rows;
  if (head.row_stride == 0) head.row_stride = keys.rows;
  const SageInputs in = quantize_inputs(queries, keys, values, smooths_keys(head), options);
  SageRow row(in, head, options);
  out = Matrix(queries.rows, values.cols);
  if (lse != nullptr) lse->assign(queries.rows, 0.0);
  std::vector<std::size_t> visible;
  for (std::size_t i = 0; i < queries.rows; ++i) {
    head.visible_keys(i, visible);
    row.run(i, visible, out.row(i).data(), lse != nullptr ? &(*lse)[i] : nullptr);
  }
}

}  // namespace sharpcheck::kernels
