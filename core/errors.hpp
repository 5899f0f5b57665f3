// Typed errors for bad input: each names what is wrong and where, so a caller can report it
// and a test can check which rule fired.
#pragma once

#include <stdexcept>
#include <string>

namespace sharpcheck {

enum class InputProblem {
  empty_input,
  nan_value,
  positive_infinity,
  non_finite_value,
  bad_temperature,
  shape_mismatch,
  unsupported_format,
  fully_masked_row,
  out_of_range,
};

class InputError : public std::invalid_argument {
 public:
  InputError(InputProblem problem, const std::string& message)
      : std::invalid_argument(message), problem_(problem) {}
  [[nodiscard]] InputProblem problem() const { return problem_; }

 private:
  InputProblem problem_;
};

// The reference could not decide a correct rounding within its precision cap. The Ziv loops
// terminate on every input whose result is irrational or handled exactly (see reference/), so
// this signals a case outside that argument; it is reported, never silently rounded.
class UndecidedRounding : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace sharpcheck
