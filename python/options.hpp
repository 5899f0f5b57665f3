// The keyword options the Python layer hands to _sharpcheck, read into the judge's and the
// reference's own types. Each is checked (a wrong type or value is a ValueError naming the
// option) and an option nobody reads is refused, so a misspelt keyword never passes silently.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gate/judge_arrays.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::python {

class HostArray;

// Per-head values and masks of an attention problem, owned here for the spans of AttentionArrays.
struct AttentionExtras {
  std::vector<double> sinks, alibi_slopes;
  std::vector<std::uint8_t> keep;
  tensor::Broadcast keep_extent;
  std::vector<double> bias;
  tensor::Broadcast bias_extent;
  [[nodiscard]] gate::AttentionArrays arrays(const gate::Array* q, const gate::Array* k, const gate::Array* v,
                                             const gate::Array* out, const gate::Array* lse) const;
};

class Options {
 public:
  explicit Options(const pybind11::dict& given);
  [[nodiscard]] std::string text(const char* key, const std::string& otherwise) const;
  [[nodiscard]] double real(const char* key, double otherwise) const;
  [[nodiscard]] bool flag(const char* key, bool otherwise) const;
  [[nodiscard]] long long integer(const char* key, long long otherwise) const;
  [[nodiscard]] unsigned count(const char* key, unsigned otherwise) const;
  [[nodiscard]] std::vector<std::size_t> counts(const char* key) const;
  [[nodiscard]] std::vector<double> reals(const char* key) const;
  // "input_format" (how integer inputs are read), else "format".
  [[nodiscard]] gate::StoredFormat input_format() const;
  // "dim" (default -1); ValueError beyond any plausible rank (so no cast wraps it into range).
  [[nodiscard]] int dim() const;
  // The lanes of `array` along "dim" (negative from the end); ValueError outside its axes.
  [[nodiscard]] io::NpyLanes lanes(const gate::Array& array) const;
  [[nodiscard]] gate::JudgeOptions judge_options() const;
  [[nodiscard]] AttentionExtras attention_extras() const;
  // ValueError naming every given option that was not read.
  void require_all_used() const;

 private:
  [[nodiscard]] pybind11::object get(const char* key) const;
  [[nodiscard]] tensor::HeadScores scores() const;
  pybind11::dict given_;
  mutable std::set<std::string> used_;
};

// The log-sum-exp's shape: [B, H, S] (bhsd, bshd), [H, total_q] (packed), [S] (2-D one head).
[[nodiscard]] std::vector<std::size_t> lse_shape(const tensor::AttentionProblem& problem,
                                                 const std::vector<std::size_t>& query_shape);

}  // namespace sharpcheck::python
