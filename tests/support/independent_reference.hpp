// An independent second backend for the reference tests: Boost's cpp_bin_float at 320 bits
// (no MPFR inside), and a check that a format value is the nearest one to such a number.
#pragma once

#include <gtest/gtest.h>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck::testing {

using Exact = boost::multiprecision::number<
    boost::multiprecision::cpp_bin_float<320, boost::multiprecision::digit_base_2>,
    boost::multiprecision::et_off>;

// Softmax at temperature theta in 320-bit binary floating point (relative error far below 2^-300).
inline std::vector<Exact> independent_softmax(std::span<const double> logits, double theta) {
  Exact best = Exact(logits[0]) / theta;
  for (const double e : logits) best = std::max(best, Exact(e) / theta);
  std::vector<Exact> weights;
  Exact sum = 0;
  for (const double e : logits) {
    weights.push_back(exp(Exact(e) / theta - best));
    sum += weights.back();
  }
  for (auto& w : weights) w /= sum;
  return weights;
}

// True when `rounded` is a value of the format nearest to `exact` (no other format value is
// strictly nearer). `exact` must be accurate far beyond the format's precision, which 320 bits is
// unless it lies within 2^-300 (relative) of a rounding boundary: such a tie is reported as a
// failure, not guessed.
inline ::testing::AssertionResult is_nearest_in_format(double rounded, const Exact& exact,
                                                       const FloatFormat& format) {
  if (!is_representable(rounded, format) || std::isnan(rounded)) {
    return ::testing::AssertionFailure() << hex_float(rounded) << " is not a value of " << format.name;
  }
  const Exact distance = abs(exact - Exact(rounded));
  for (const double neighbour : {next_up(rounded, format), next_down(rounded, format)}) {
    if (!std::isfinite(neighbour)) continue;
    const Exact other = abs(exact - Exact(neighbour));
    if (other < distance) {
      return ::testing::AssertionFailure()
             << hex_float(rounded) << " is not nearest in " << format.name << ": " << hex_float(neighbour)
             << " is nearer to " << exact.str(40);
    }
    if (other == distance) {
      return ::testing::AssertionFailure()
             << "a tie at " << exact.str(40) << " between " << hex_float(rounded) << " and "
             << hex_float(neighbour) << ": cannot judge";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sharpcheck::testing
