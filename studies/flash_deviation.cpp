#include "studies/flash_deviation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "reference/attention.hpp"

namespace sharpcheck::studies {
namespace {

// q . k summed left to right in fp32 (each product and partial sum rounded to float).
float fp32_dot(std::span<const double> q, std::span<const double> k) {
  float sum = 0;
  for (std::size_t t = 0; t < q.size(); ++t) sum += static_cast<float>(q[t]) * static_cast<float>(k[t]);
  return sum;
}

double scale_of(std::size_t head_dim) { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

void check(const DeviationSettings& settings) {
  const auto refuse = [](const std::string& what) {
    throw InputError(InputProblem::out_of_range, "study: flash-deviation " + what);
  };
  for (const std::size_t n : settings.sizes) {
    if (n == 0 || n > (std::size_t{1} << 20))
      refuse("sizes must be from 1 to 1048576, got " + std::to_string(n));
  }
  for (const std::size_t d : settings.head_dims) {
    if (d == 0) refuse("head dimensions must be positive");
  }
  if (settings.tile == 0 || settings.query_rows == 0) refuse("tile and query rows must be positive");
}

DeviationPoint measure(const DeviationSettings& settings, const FloatFormat& format, DeviationInputs inputs,
                       std::size_t head_dim, std::size_t n, std::uint64_t seed) {
  DeterministicRandom random(seed);
  const Matrix queries = random_attention_inputs(settings.query_rows, head_dim, format, inputs, random);
  const Matrix keys = random_attention_inputs(n, head_dim, format, inputs, random);
  const Matrix values = random_attention_inputs(n, head_dim, format, DeviationInputs::normal, random);
  const Matrix expected = reference::attention(queries, keys, values, format).output;
  DeviationPoint point{&format, inputs, head_dim, n, {}, {}};
  point.naive = deviation_of(naive_attention_in(format, queries, keys, values), expected, format);
  point.flash =
      deviation_of(flash_attention_in(format, queries, keys, values, settings.tile), expected, format);
  return point;
}

}  // namespace

const char* deviation_inputs_name(DeviationInputs inputs) {
  switch (inputs) {
    case DeviationInputs::normal:
      return "normal";
    case DeviationInputs::outliers:
      return "outliers";
    case DeviationInputs::large_outliers:
      return "large_outliers";
  }
  return "?";
}

Matrix random_attention_inputs(std::size_t rows, std::size_t cols, const FloatFormat& format,
                               DeviationInputs inputs, DeterministicRandom& random) {
  const bool outliers = inputs != DeviationInputs::normal;
  const double low = inputs == DeviationInputs::large_outliers ? 1000 : 10;
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) {
    double value = random.normal();
    if (outliers && random.uniform() < 1e-3) value *= low + 9 * low * random.uniform();
    x = round_to_format(value, format);
  }
  return matrix;
}

double DeviationPoint::ratio() const {
  if (naive.max_absolute == 0) return flash.max_absolute == 0 ? 1.0 : std::numeric_limits<double>::infinity();
  return flash.max_absolute / naive.max_absolute;
}

Matrix naive_attention_in(const FloatFormat& format, const Matrix& queries, const Matrix& keys,
                          const Matrix& values) {
  const double scale = round_to_format(scale_of(queries.cols), format);
  Matrix out(queries.rows, values.cols);
  std::vector<float> p(keys.rows);
  for (std::size_t i = 0; i < queries.rows; ++i) {
    float top = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < keys.rows; ++j) {
      const double s =
          round_to_format(round_to_format(fp32_dot(queries.row(i), keys.row(j)), format) * scale, format);
      p[j] = static_cast<float>(s);
      top = std::max(top, p[j]);
    }
    float sum = 0;
    for (float& x : p) sum += x = std::exp(x - top);
    for (float& x : p) x = static_cast<float>(round_to_format(x / sum, format));
    for (std::size_t c = 0; c < values.cols; ++c) {
      float acc = 0;
      for (std::size_t j = 0; j < keys.rows; ++j) acc += p[j] * static_cast<float>(values(j, c));
      out(i, c) = round_to_format(acc, format);
    }
  }
  return out;
}

Matrix flash_attention_in(const FloatFormat& format, const Matrix& queries, const Matrix& keys,
                          const Matrix& values, std::size_t tile) {
  const auto scale = static_cast<float>(scale_of(queries.cols));
  Matrix out(queries.rows, values.cols);
  std::vector<float> acc(values.cols), s(tile);
  for (std::size_t i = 0; i < queries.rows; ++i) {
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    std::fill(acc.begin(), acc.end(), 0.0F);
    for (std::size_t first = 0; first < keys.rows; first += tile) {
      const std::size_t count = std::min(tile, keys.rows - first);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < count; ++j)
        tile_max = std::max(tile_max, s[j] = fp32_dot(queries.row(i), keys.row(first + j)) * scale);
      const float m_new = std::max(m, tile_max);
      const float rescale = std::exp(m - m_new);  // 0 on the first tile
      l *= rescale;
      for (float& a : acc) a *= rescale;
      for (std::size_t j = 0; j < count; ++j) {
        const float p = std::exp(s[j] - m_new);
        l += p;
        const auto p_rounded = static_cast<float>(round_to_format(p, format));  // P in the format before P V
        for (std::size_t c = 0; c < values.cols; ++c)
          acc[c] += p_rounded * static_cast<float>(values(first + j, c));
      }
      m = m_new;
    }
    for (std::size_t c = 0; c < values.cols; ++c) out(i, c) = round_to_format(acc[c] / l, format);
  }
  return out;
}

Deviation deviation_of(const Matrix& actual, const Matrix& expected, const FloatFormat& format) {
  Deviation deviation;
  double squares = 0;
  std::size_t equal = 0;
  for (std::size_t e = 0; e < actual.values.size(); ++e) {
    const double error = std::fabs(actual.values[e] - expected.values[e]);
    deviation.max_absolute = std::max(deviation.max_absolute, error);
    const auto ulps = ulp_distance(actual.values[e], expected.values[e], format);
    deviation.max_ulps = std::max(deviation.max_ulps, ulps ? static_cast<double>(*ulps) : INFINITY);
    squares += error * error;
    equal += error == 0 ? 1 : 0;
  }
  const auto count = static_cast<double>(actual.values.size());
  deviation.rmse = std::sqrt(squares / count);
  deviation.correctly_rounded = static_cast<double>(equal) / count;
  return deviation;
}

DeviationStudy run_deviation_study(const DeviationSettings& given) {
  DeviationStudy study{given, {}};
  auto& settings = study.settings;
  if (settings.sizes.empty()) {
    for (std::size_t n = 128; n <= 16384; n *= 2) settings.sizes.push_back(n);
  }
  check(settings);
  struct Item {
    const FloatFormat* format;
    DeviationInputs inputs;
    std::size_t head_dim, n;
  };
  std::vector<Item> items;
  for (const FloatFormat* format : settings.formats) {
    for (const DeviationInputs inputs : settings.inputs) {
      for (const std::size_t d : settings.head_dims) {
        for (const std::size_t n : settings.sizes) items.push_back({format, inputs, d, n});
      }
    }
  }
  study.points.resize(items.size());
  parallel_for(items.size(), settings.threads, [&](std::size_t k) {
    const Item& item = items[k];
    study.points[k] = measure(settings, *item.format, item.inputs, item.head_dim, item.n, settings.seed + k);
  });
  return study;
}

}  // namespace sharpcheck::studies
