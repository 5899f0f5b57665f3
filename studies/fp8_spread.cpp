#include "studies/fp8_spread.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "kernels/fp8_attention.hpp"
#include "reference/attention.hpp"

namespace sharpcheck::studies {
namespace {

constexpr std::size_t block_rows = 64;
constexpr double lazy_threshold = 8 * 0.6931471805599453;  // FlashAttention 4: 8 in log2 units

void check(const Fp8SpreadSettings& settings) {
  const auto refuse = [](const std::string& what) {
    throw InputError(InputProblem::out_of_range, "study: fp8-spread " + what);
  };
  for (const double sigma : settings.sigmas) {
    if (!(sigma > 0) || !std::isfinite(sigma)) refuse("sigmas must be positive and finite");
  }
  if (settings.keys == 0 || settings.keys > (std::size_t{1} << 20)) refuse("keys must be from 1 to 1048576");
  if (settings.head_dim == 0 || (settings.head_dim & (settings.head_dim - 1)) != 0)
    refuse("head dimension must be a power of two (the Hadamard rotation), got " +
           std::to_string(settings.head_dim));
  if (settings.query_rows == 0 || settings.draws == 0) refuse("query rows and draws must be positive");
}

// The standard deviation of q . k / sqrt(d) over every query-key pair, in double.
double logit_deviation(const Matrix& queries, const Matrix& keys) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(queries.cols));
  double sum = 0, squares = 0;
  for (std::size_t i = 0; i < queries.rows; ++i) {
    for (std::size_t j = 0; j < keys.rows; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < queries.cols; ++t) dot += queries(i, t) * keys(j, t);
      sum += dot * scale;
      squares += dot * scale * dot * scale;
    }
  }
  const double count = static_cast<double>(queries.rows * keys.rows);
  const double mean = sum / count;
  return std::sqrt(std::max(0.0, squares / count - mean * mean));
}

// Squared errors and saturation counts, summed over draws.
struct Fp8Tally {
  double squares = 0, max_absolute = 0;
  std::size_t outputs = 0;
  kernels::Fp8Saturation saturation;

  void add(const Matrix& expected, const std::vector<Bfloat16>& actual,
           const kernels::Fp8Saturation& counts) {
    for (std::size_t e = 0; e < actual.size(); ++e) {
      const double difference = std::fabs(static_cast<double>(actual[e].to_float()) - expected.values[e]);
      max_absolute = std::max(max_absolute, difference);
      squares += difference * difference;
    }
    outputs += actual.size();
    saturation.probabilities += counts.probabilities;
    saturation.saturated += counts.saturated;
  }
  [[nodiscard]] Fp8Error error() const {
    const auto fraction = [](std::size_t part, std::size_t whole) {
      return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
    };
    return {std::sqrt(squares / static_cast<double>(outputs)), max_absolute,
            fraction(saturation.saturated, saturation.probabilities)};
  }
};

void run_variant(Fp8Variant variant, const Matrix& queries, const Matrix& keys, const Matrix& values,
                 const Matrix& expected, std::uint64_t rotation_seed, Fp8Tally& tally) {
  const bool rotated = variant == Fp8Variant::rotated;
  const std::size_t block = variant == Fp8Variant::block || rotated ? block_rows : 0;
  const auto q =
      kernels::quantize_e4m3(rotated ? kernels::hadamard_rotate(queries, rotation_seed) : queries, block);
  const auto k =
      kernels::quantize_e4m3(rotated ? kernels::hadamard_rotate(keys, rotation_seed) : keys, block);
  const auto v = kernels::quantize_e4m3(values, block);
  kernels::Fp8AttentionOptions options;
  if (variant == Fp8Variant::lazy) options.rescale_threshold = lazy_threshold;
  kernels::Fp8Saturation saturation;
  std::vector<Bfloat16> out(queries.rows * values.cols);
  kernels::attention_fp8(q, k, v, out.data(), nullptr, tensor::HeadScores{}, options, &saturation);
  tally.add(expected, out, saturation);
}

struct Item {
  DeviationInputs inputs;
  double sigma;  // 0: unscaled
};

// One draw: Q scaled so the logits have standard deviation sigma (unscaled: as drawn); returns
// the measured deviation.
double add_draw(const Fp8SpreadSettings& settings, const Item& item, std::uint64_t seed,
                Fp8Tally (&tallies)[4]) {
  DeterministicRandom random(seed);
  Matrix queries = random_attention_inputs(settings.query_rows, settings.head_dim, bf16, item.inputs, random);
  const Matrix keys = random_attention_inputs(settings.keys, settings.head_dim, bf16, item.inputs, random);
  const Matrix values =
      random_attention_inputs(settings.keys, settings.head_dim, bf16, DeviationInputs::normal, random);
  if (item.sigma > 0) {
    const double factor = item.sigma / logit_deviation(queries, keys);
    for (double& x : queries.values) x *= factor;
  }
  const Matrix expected = reference::attention(queries, keys, values, bf16).output;
  for (const Fp8Variant variant : all_fp8_variants) {
    run_variant(variant, queries, keys, values, expected, seed ^ 0x9E3779B97F4A7C15ULL,
                tallies[static_cast<int>(variant)]);
  }
  return logit_deviation(queries, keys);
}

Fp8SpreadPoint measure(const Fp8SpreadSettings& settings, const Item& item) {
  Fp8Tally tallies[4];
  double measured = 0;
  // The same draws for every sigma of one inputs kind: only the scaling of Q differs.
  for (std::size_t d = 0; d < settings.draws; ++d)
    measured +=
        add_draw(settings, item, settings.seed + 1000 * static_cast<std::uint64_t>(item.inputs) + d, tallies);
  Fp8SpreadPoint point;
  point.inputs = item.inputs;
  point.unscaled = item.sigma == 0;
  point.measured = measured / static_cast<double>(settings.draws);
  point.sigma = point.unscaled ? point.measured : item.sigma;
  for (int v = 0; v < 4; ++v) point.errors[v] = tallies[v].error();
  return point;
}

}  // namespace

const char* fp8_variant_name(Fp8Variant variant) {
  switch (variant) {
    case Fp8Variant::plain:
      return "plain";
    case Fp8Variant::block:
      return "block";
    case Fp8Variant::rotated:
      return "rotated";
    case Fp8Variant::lazy:
      return "lazy";
  }
  return "?";
}

Fp8SpreadStudy run_fp8_spread_study(const Fp8SpreadSettings& given) {
  Fp8SpreadStudy study{given, {}, {}, {}};
  auto& settings = study.settings;
  if (settings.sigmas.empty())
    settings.sigmas = {0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.75, 1, 1.25, 1.5, 2, 3, 4, 6, 8};
  check(settings);
  std::vector<Item> items;
  for (const DeviationInputs inputs : settings.inputs) {
    for (const double sigma : settings.sigmas) items.push_back({inputs, sigma});
    items.push_back({inputs, 0});
  }
  study.points.resize(items.size());
  parallel_for(items.size(), settings.threads,
               [&](std::size_t k) { study.points[k] = measure(settings, items[k]); });
  for (const DeviationInputs inputs : settings.inputs) {
    std::optional<double> first, point;
    for (const Fp8SpreadPoint& p : study.points) {
      if (p.inputs != inputs || p.unscaled) continue;
      const Fp8Error& lazy = p.errors[static_cast<int>(Fp8Variant::lazy)];
      if (lazy.saturated > 0) first = std::min(first.value_or(p.sigma), p.sigma);
      if (lazy.rmse >= 2 * p.errors[static_cast<int>(Fp8Variant::plain)].rmse)
        point = std::min(point.value_or(p.sigma), p.sigma);
    }
    study.first_saturation.push_back(first);
    study.saturation_point.push_back(point);
  }
  return study;
}

}  // namespace sharpcheck::studies
