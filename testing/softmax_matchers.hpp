// GoogleTest matchers for users' own tests: check a kernel's output against sharpcheck's
// correctly rounded reference, e.g.
//   EXPECT_THAT(probs, sharpcheck::IsSoftmaxOf(logits).WithinUlps(2));
//   EXPECT_THAT(probs_bf16_as_double, sharpcheck::IsSoftmaxOf(logits).InFormat(sharpcheck::bf16));
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <vector>

#include "formats/float_format.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck {

class SoftmaxOfMatcher {
 public:
  using is_gtest_matcher = void;

  explicit SoftmaxOfMatcher(std::vector<double> logits) : logits_(std::move(logits)) {}
  // Largest accepted distance, in values of the format, from the correctly rounded reference.
  SoftmaxOfMatcher WithinUlps(std::uint64_t ulps) const {
    SoftmaxOfMatcher copy = *this;
    copy.ulps_ = ulps;
    return copy;
  }
  SoftmaxOfMatcher InFormat(const FloatFormat& format) const {
    SoftmaxOfMatcher copy = *this;
    copy.format_ = &format;
    return copy;
  }
  SoftmaxOfMatcher AtTemperature(double theta) const {
    SoftmaxOfMatcher copy = *this;
    copy.theta_ = theta;
    return copy;
  }

  template <typename Container>
  bool MatchAndExplain(const Container& actual, std::ostream* listener) const {
    const std::vector<double> values(std::begin(actual), std::end(actual));
    if (values.size() != logits_.size()) {
      if (listener != nullptr)
        *listener << "has " << values.size() << " values for " << logits_.size() << " logits";
      return false;
    }
    reference::RowOptions options;
    options.theta = theta_;
    const std::vector<double> expected = reference::softmax(logits_, *format_, options);
    for (std::size_t j = 0; j < values.size(); ++j) {
      const auto distance = ulp_distance(round_to_format(values[j], *format_), expected[j], *format_);
      const bool exact_value = round_to_format(values[j], *format_) == values[j] || std::isnan(values[j]);
      if (!exact_value || !distance || *distance > ulps_) {
        if (listener != nullptr) {
          *listener << "element " << j << " is " << hex_float(values[j]) << ", the correctly rounded "
                    << format_->name << " softmax is " << hex_float(expected[j]);
          if (distance && exact_value) *listener << " (" << *distance << " ulp apart)";
        }
        return false;
      }
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const {
    *os << "is within " << ulps_ << " ulp of the correctly rounded " << format_->name << " softmax of "
        << logits_.size() << " logits";
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "is not within " << ulps_ << " ulp of the correctly rounded " << format_->name << " softmax";
  }

 private:
  std::vector<double> logits_;
  const FloatFormat* format_ = &fp32;
  std::uint64_t ulps_ = 0;
  double theta_ = 1.0;
};

template <typename Container>
SoftmaxOfMatcher IsSoftmaxOf(const Container& logits) {
  return SoftmaxOfMatcher(std::vector<double>(std::begin(logits), std::end(logits)));
}
inline SoftmaxOfMatcher IsSoftmaxOf(std::initializer_list<double> logits) {
  return SoftmaxOfMatcher(std::vector<double>(logits));
}

}  // namespace sharpcheck
