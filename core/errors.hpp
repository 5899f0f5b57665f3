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

// A file could not be read or written (the path and the system's reason are in the message).
// Distinct from InputError: the input may be fine and the file system at fault.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A plugin's own code crashed, hung or ran out of memory outside a judged case (while it was
// loaded or described): the documented exit code is the crash code, 3.
class PluginCrash : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// SIGINT or SIGTERM arrived (core/interrupt.hpp): the command stops, writes what it has and exits
// 128 + the signal.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal_number)
      : std::runtime_error("interrupted by signal " + std::to_string(signal_number)),
        signal_(signal_number) {}
  [[nodiscard]] int signal_number() const { return signal_; }

 private:
  int signal_;
};

}  // namespace sharpcheck
