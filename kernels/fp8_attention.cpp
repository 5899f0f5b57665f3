#include "kernels/fp8_attention.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "kernels/logit_maker.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr double e4m3_largest = 448.0;
// FlashAttention 3's max offset: weights exp(s - m) scaled by 2^8, so the largest is 256.
constexpr float weight_scale = 256.0F;

Float8E4M3 to_e4m3_saturating(double value) {
  const double clipped = std::clamp(value, -e4m3_largest, e4m3_largest);
  return Float8E4M3{static_cast<std::uint8_t>(encode(round_to_format(clipped, fp8_e4m3), fp8_e4m3))};
}

double block_amax(const Matrix& values, std::size_t first, std::size_t last) {
  double amax = 0;
  for (std::size_t r = first; r < last; ++r) {
    for (const double x : values.row(r)) {
      if (!std::isfinite(x)) {
        throw InputError(InputProblem::non_finite_value,
                         "fp8 quantisation: row " + std::to_string(r) + " holds " + std::to_string(x));
      }
      amax = std::max(amax, std::fabs(x));
    }
  }
  return amax;
}

template <typename DescaleOf>
Fp8Tensor quantize_with(const Matrix& values, std::size_t block_rows, DescaleOf descale_of) {
  Fp8Tensor tensor{values.rows, values.cols, {}, {}, block_rows};
  const std::size_t block = block_rows == 0 ? std::max<std::size_t>(values.rows, 1) : block_rows;
  tensor.payload.resize(values.values.size());
  for (std::size_t first = 0; first < std::max<std::size_t>(values.rows, 1); first += block) {
    const std::size_t last = std::min(values.rows, first + block);
    const double amax = block_amax(values, first, last);
    const float descale = amax == 0 ? 1.0F : descale_of(amax);
    tensor.descales.push_back(descale);
    for (std::size_t i = first * values.cols; i < last * values.cols; ++i)
      tensor.payload[i] = to_e4m3_saturating(values.values[i] / descale);
  }
  return tensor;
}

void check_shapes(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v) {
  if (q.cols != k.cols || k.rows != v.rows || q.cols == 0 || v.cols == 0) {
    throw InputError(InputProblem::shape_mismatch,
                     "attention_fp8: Q is " + std::to_string(q.rows) + "x" + std::to_string(q.cols) + ", K " +
                         std::to_string(k.rows) + "x" + std::to_string(k.cols) + ", V " +
                         std::to_string(v.rows) + "x" + std::to_string(v.cols));
  }
}

// One query row of the kernel (the header states the arithmetic).
class Fp8Row {
 public:
  Fp8Row(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v, const tensor::HeadScores& scores,
         const Fp8AttentionOptions& options, Fp8Saturation* saturation)
      : q_(q),
        k_(k),
        v_(v),
        logit_(scores, q.cols),
        options_(options),
        saturation_(saturation),
        accumulator_(v.cols),
        tile_scores_(options.tile) {}

  void run(std::size_t query, const std::vector<std::size_t>& visible, Bfloat16* out, float* lse) {
    max_ = logit_.has_sink() ? logit_.sink() : -std::numeric_limits<float>::infinity();
    sum_ = logit_.has_sink() ? weight_scale : 0.0F;
    std::fill(accumulator_.begin(), accumulator_.end(), 0.0F);
    for (std::size_t start = 0; start < visible.size(); start += options_.tile)
      add_tile(query, visible, start, std::min(options_.tile, visible.size() - start));
    const bool empty = sum_ == 0.0F;
    for (std::size_t c = 0; c < v_.cols; ++c)
      out[c] = Bfloat16::from_float(empty ? 0.0F : accumulator_[c] / sum_);
    if (lse != nullptr)
      *lse = empty ? -std::numeric_limits<float>::infinity() : max_ + std::log(sum_ / weight_scale);
  }

 private:
  float score(std::size_t query, std::size_t key) const {
    const Float8E4M3* a = q_.payload.data() + query * q_.cols;
    const Float8E4M3* b = k_.payload.data() + key * k_.cols;
    float dot = 0.0F;
    for (std::size_t t = 0; t < q_.cols; ++t) dot += a[t].to_float() * b[t].to_float();
    return logit_(dot * (q_.descale_of(query) * k_.descale_of(key)), query, key);
  }

  void add_tile(std::size_t query, const std::vector<std::size_t>& visible, std::size_t start,
                std::size_t length) {
    float tile_max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < length; ++j) {
      tile_scores_[j] = score(query, visible[start + j]);
      tile_max = std::max(tile_max, tile_scores_[j]);
    }
    const bool first = max_ == -std::numeric_limits<float>::infinity();
    if (first || tile_max > max_ + static_cast<float>(options_.rescale_threshold)) {
      const float new_max = std::max(max_, tile_max);
      const float rescale = std::exp(max_ - new_max);  // exp(-inf) = 0 on the first tile
      sum_ *= rescale;
      for (float& a : accumulator_) a *= rescale;
      max_ = new_max;
    }
    for (std::size_t j = 0; j < length; ++j) {
      const float w = std::exp(tile_scores_[j] - max_) * weight_scale;
      sum_ += w;
      const float p = to_e4m3_saturating(w).to_float();
      if (saturation_ != nullptr) {
        ++saturation_->probabilities;
        if (w > static_cast<float>(e4m3_largest)) ++saturation_->saturated;
      }
      const std::size_t key = visible[start + j];
      const float descale = v_.descale_of(key);
      const Float8E4M3* value = v_.payload.data() + key * v_.cols;
      for (std::size_t c = 0; c < v_.cols; ++c) accumulator_[c] += p * (value[c].to_float() * descale);
    }
  }

  const Fp8Tensor &q_, &k_, &v_;
  LogitMaker logit_;
  const Fp8AttentionOptions& options_;
  Fp8Saturation* saturation_;
  std::vector<float> accumulator_, tile_scores_;
  float max_ = 0, sum_ = 0;
};

}  // namespace

Matrix Fp8Tensor::dequantized() const {
  Matrix values(rows, cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c)
      values(r, c) = static_cast<double>(payload[r * cols + c].to_float()) * descale_of(r);
  }
  return values;
}

Fp8Tensor quantize_e4m3(const Matrix& values, std::size_t block_rows) {
  return quantize_with(values, block_rows,
                       [](double amax) { return static_cast<float>(amax / e4m3_largest); });
}

Fp8Tensor quantize_e4m3_exactly(const Matrix& values, std::size_t block_rows) {
  return quantize_with(values, block_rows, [](double amax) {
    int exponent = 0;
    const double fraction = std::frexp(amax / e4m3_largest, &exponent);  // in [1/2, 1)
    // The least power of two >= amax / 448, so amax / descale lies in (224, 448].
    return static_cast<float>(std::ldexp(1.0, fraction == 0.5 ? exponent - 1 : exponent));
  });
}

Matrix hadamard_rotate(const Matrix& values, std::uint64_t seed) {
  const std::size_t d = values.cols;
  if (d == 0 || !std::has_single_bit(d)) {
    throw InputError(InputProblem::shape_mismatch,
                     "Hadamard rotation: the head dimension " + std::to_string(d) + " is not a power of two");
  }
  DeterministicRandom random(seed);
  std::vector<double> signs(d);
  for (double& s : signs) s = (random.next_u64() & 1U) != 0 ? 1.0 : -1.0;
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  Matrix rotated = values;
  for (std::size_t r = 0; r < values.rows; ++r) {
    const auto row = rotated.row(r);
    for (std::size_t c = 0; c < d; ++c) row[c] *= signs[c];
    for (std::size_t half = 1; half < d; half *= 2) {  // the fast Walsh-Hadamard transform
      for (std::size_t block = 0; block < d; block += 2 * half) {
        for (std::size_t c = block; c < block + half; ++c) {
          const double a = row[c], b = row[c + half];
          row[c] = a + b;
          row[c + half] = a - b;
        }
      }
    }
    for (double& x : row) x *= norm;
  }
  return rotated;
}

void attention_fp8(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v, Bfloat16* out, float* lse,
                   const tensor::HeadScores& scores, const Fp8AttentionOptions& options,
                   Fp8Saturation* saturation) {
  check_shapes(q, k, v);
  if (options.tile == 0) throw InputError(InputProblem::out_of_range, "attention_fp8: a tile of 0 keys");
  tensor::HeadScores head = scores;
  if (head.queries == 0) head.queries = q.rows;
  if (head.keys == 0) head.keys = k.rows;
  if (head.row_stride == 0) head.row_stride = k.rows;
  Fp8Row row(q, k, v, head, options, saturation);
  std::vector<std::size_t> visible;
  for (std::size_t i = 0; i < q.rows; ++i) {
    head.visible_keys(i, visible);
    row.run(i, visible, out + i * v.cols, lse != nullptr ? lse + i : nullptr);
  }
}

}  // namespace sharpcheck::kernels
