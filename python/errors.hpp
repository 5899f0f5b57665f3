// How the Python room refuses what it is given: InputError naming the argument or option, which
// module.cpp turns into TypeError (a wrong type or dtype) or ValueError (anything else).
#pragma once

#include <string>

#include "core/errors.hpp"

namespace sharpcheck::python {

[[noreturn]] inline void refuse_type(const std::string& name, const std::string& what) {
  throw InputError(InputProblem::unsupported_format, name + ": " + what);
}
[[noreturn]] inline void refuse_value(const std::string& name, const std::string& what) {
  throw InputError(InputProblem::out_of_range, name + ": " + what);
}

}  // namespace sharpcheck::python
