#include "inputs/rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/random.hpp"

namespace sharpcheck::inputs {

std::string_view row_kind_name(RowKind kind) {
  switch (kind) {
    case RowKind::random_normal:
      return "random_normal";
    case RowKind::spread_controlled:
      return "spread_controlled";
    case RowKind::all_negative:
      return "all_negative";
    case RowKind::near_overflow:
      return "near_overflow";
    case RowKind::tied_maxima:
      return "tied_maxima";
    case RowKind::spike_over_noise:
      return "spike_over_noise";
    case RowKind::masked_entries:
      return "masked_entries";
    case RowKind::uniform:
      return "uniform";
  }
  return "unknown";
}

std::optional<RowKind> find_row_kind(std::string_view name) {
  for (const RowKind kind : all_row_kinds) {
    if (row_kind_name(kind) == name) return kind;
  }
  return std::nullopt;
}

std::vector<double> make_row(RowKind kind, std::size_t n, const FloatFormat& format, std::uint64_t seed,
                             double spread) {
  // Mix the kind and size into the seed so that rows of different kinds are independent.
  DeterministicRandom random(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(kind) * 1000003ULL +
                             n);
  std::vector<double> row(n);
  const auto in_format = [&](double x) { return round_to_format(x, format); };
  switch (kind) {
    case RowKind::random_normal:
      for (double& e : row) e = in_format(random.normal(0, 3));
      break;
    case RowKind::spread_controlled: {
      const double top = in_format(spread);
      for (double& e : row) e = in_format(random.uniform(0, top));
      row[random.below(n)] = 0.0;
      row[random.below(n)] = top;
      break;
    }
    case RowKind::all_negative:
      for (double& e : row) e = in_format(random.uniform(-80, -20));
      break;
    case RowKind::near_overflow:
      for (double& e : row) e = std::min(in_format(random.uniform(80, 88.7)), in_format(88.7));
      break;
    case RowKind::tied_maxima: {
      for (double& e : row) e = in_format(random.normal(0, 1));
      const double top = in_format(7.0);
      const std::size_t copies = std::min<std::size_t>(n, 1 + random.below(8));
      for (std::size_t c = 0; c < copies; ++c) row[random.below(n)] = top;
      break;
    }
    case RowKind::spike_over_noise:
      for (double& e : row) e = in_format(random.normal(0, 0.1));
      row[random.below(n)] = in_format(10.0);
      break;
    case RowKind::masked_entries: {
      for (double& e : row) e = in_format(random.normal(0, 3));
      for (double& e : row) {
        if (random.below(4) == 0) e = -std::numeric_limits<double>::infinity();
      }
      row[random.below(n)] = in_format(random.normal(0, 3));  // at least one entry stays
      break;
    }
    case RowKind::uniform:
      std::fill(row.begin(), row.end(), 0.0);
      break;
  }
  // A saturating (quantized) format has no -inf: masked entries clamp to its smallest value.
  if (format.overflow == OverflowBehaviour::saturate) {
    for (double& e : row) e = in_format(e);
  }
  return row;
}

}  // namespace sharpcheck::inputs
