#include "tensor/head_scores.hpp"

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"

namespace sharpcheck::tensor {

std::ptrdiff_t HeadScores::diagonal() const {
  if (alignment == DiagonalAlignment::top_left) return 0;
  return static_cast<std::ptrdiff_t>(keys) - static_cast<std::ptrdiff_t>(queries);
}

bool HeadScores::sees(std::size_t query, std::size_t key) const {
  if (key >= keys || query >= queries) return false;
  const std::ptrdiff_t aligned = static_cast<std::ptrdiff_t>(query) + diagonal();
  const auto j = static_cast<std::ptrdiff_t>(key);
  if (causal && j > aligned) return false;
  if (window_left && j < aligned - static_cast<std::ptrdiff_t>(*window_left)) return false;
  if (window_right && j > aligned + static_cast<std::ptrdiff_t>(*window_right)) return false;
  return kept(query, key);
}

bool HeadScores::kept(std::size_t query, std::size_t key) const {
  const std::size_t at = query * row_stride + key;
  return (keep.empty() || keep[at] != 0) && (bias.empty() || bias[at] != -INFINITY);
}

HeadScores::BiasTerms HeadScores::bias_terms(std::size_t query, std::size_t key) const {
  BiasTerms terms;
  if (!bias.empty()) terms.additive = bias[query * row_stride + key];
  if (alibi_slope != 0.0) {
    terms.slope = alibi_slope;
    const std::ptrdiff_t offset =
        static_cast<std::ptrdiff_t>(query) + diagonal() - static_cast<std::ptrdiff_t>(key);
    terms.distance = offset < 0 ? -offset : offset;
  }
  return terms;
}

double HeadScores::bias_of(std::size_t query, std::size_t key) const {
  const BiasTerms terms = bias_terms(query, key);
  return std::fma(-terms.slope, static_cast<double>(terms.distance), terms.additive);
}

void HeadScores::visible_keys(std::size_t query, std::vector<std::size_t>& keys_seen) const {
  keys_seen.clear();
  if (query >= queries) return;
  // The causal and window limits give a contiguous range; the explicit mask thins it.
  const std::ptrdiff_t aligned = static_cast<std::ptrdiff_t>(query) + diagonal();
  std::ptrdiff_t first = 0;
  std::ptrdiff_t last = static_cast<std::ptrdiff_t>(keys) - 1;
  if (causal) last = std::min(last, aligned);
  if (window_right) last = std::min(last, aligned + static_cast<std::ptrdiff_t>(*window_right));
  if (window_left) first = std::max(first, aligned - static_cast<std::ptrdiff_t>(*window_left));
  for (std::ptrdiff_t j = first; j <= last; ++j) {
    const auto key = static_cast<std::size_t>(j);
    if (kept(query, key)) keys_seen.push_back(key);
  }
}

std::string HeadScores::describe() const {
  std::string text;
  const auto add = [&text](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  const std::string aligned = alignment == DiagonalAlignment::top_left ? "top-left" : "bottom-right";
  if (causal) add("causal " + aligned);
  if (window_left || window_right) {
    const auto side = [](const std::optional<std::size_t>& w) { return w ? std::to_string(*w) : "-1"; };
    add("window (" + side(window_left) + ", " + side(window_right) + ") " + aligned);
  }
  if (!keep.empty()) add("explicit mask");
  if (!bias.empty()) add("additive bias");
  if (alibi_slope != 0.0) add("ALiBi");
  if (softcap != 0.0) add("soft-cap");
  if (sink) add("sink");
  return text.empty() ? "no mask" : text;
}

void HeadScores::validate(const std::string& where) const {
  const auto fail = [&where](const std::string& what) {
    throw InputError(InputProblem::out_of_range, where + ": " + what);
  };
  if (!std::isfinite(theta) || theta == 0.0) {
    throw InputError(InputProblem::bad_temperature, where + ": theta must be finite and non-zero");
  }
  if (!std::isfinite(softcap) || softcap < 0.0) fail("the soft-cap must be finite and positive (0: none)");
  if (scale && !std::isfinite(*scale)) fail("the scale is not finite");
  if (!std::isfinite(alibi_slope)) fail("the ALiBi slope is not finite");
  if (sink && !std::isfinite(*sink)) fail("the sink logit is not finite");
  const std::size_t needed = queries == 0 || keys == 0 ? 0 : (queries - 1) * row_stride + keys;
  if (!keep.empty() && (row_stride < keys || keep.size() < needed)) {
    throw InputError(InputProblem::shape_mismatch, where + ": the mask does not cover the queries x keys");
  }
  if (!bias.empty() && (row_stride < keys || bias.size() < needed)) {
    throw InputError(InputProblem::shape_mismatch, where + ": the bias does not cover the queries x keys");
  }
  for (std::size_t i = 0; i < queries && !bias.empty(); ++i) {
    for (std::size_t j = 0; j < keys; ++j) {
      const double b = bias[i * row_stride + j];
      if (std::isnan(b) || b == INFINITY) {
        throw InputError(std::isnan(b) ? InputProblem::nan_value : InputProblem::positive_infinity,
                         where + ": bias[" + std::to_string(i) + "][" + std::to_string(j) + "] is " +
                             (std::isnan(b) ? "NaN" : "+inf") +
                             " (-inf masks the key; nothing else may be non-finite)");
      }
    }
  }
}

}  // namespace sharpcheck::tensor
