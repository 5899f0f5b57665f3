// The logit arithmetic shared by the attention kernels under test (kernels/attention_kernels.hpp
// states which roundings it makes). Internal to kernels/.
#pragma once

#include <cmath>
#include <cstddef>

#include "tensor/head_scores.hpp"

namespace sharpcheck::kernels {

class LogitMaker {
 public:
  LogitMaker(const tensor::HeadScores& scores, std::size_t dimension)
      : scores_(scores), modified_(scores.softcap != 0.0 || scores.has_bias() || scores.sink) {
    const double scale = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(dimension));
    folded_ = static_cast<float>(scale / scores.theta);
    scale_ = static_cast<float>(scale);
    inverse_theta_ = static_cast<float>(1.0 / scores.theta);
    cap_ = static_cast<float>(scores.softcap);
  }
  [[nodiscard]] float operator()(float dot_product, std::size_t query, std::size_t key) const {
    if (!modified_) return dot_product * folded_;  // a sink counts as modified: see row_value
    float s = dot_product * scale_;
    if (cap_ != 0.0F) s = cap_ * std::tanh(s / cap_);
    if (scores_.has_bias()) s += static_cast<float>(scores_.bias_of(query, key));
    return s * inverse_theta_;
  }
  // The naive kernel hands safe3 the raw dot products and the folded multiplier when nothing
  // modifies them (so the multiplier is applied to differences, as before), else full logits.
  [[nodiscard]] float row_value(float dot_product, std::size_t query, std::size_t key) const {
    return modified_ ? (*this)(dot_product, query, key) : dot_product;
  }
  [[nodiscard]] float row_scale() const { return modified_ ? 1.0F : folded_; }
  [[nodiscard]] bool has_sink() const { return scores_.sink.has_value(); }
  [[nodiscard]] float sink() const { return static_cast<float>(*scores_.sink) * inverse_theta_; }

 private:
  const tensor::HeadScores& scores_;
  bool modified_;
  float folded_, scale_, inverse_theta_, cap_;
};

}  // namespace sharpcheck::kernels
