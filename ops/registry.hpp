// Every operation sharpcheck judges, in sweep order: the one list the gate, `sharpcheck ops`,
// `compare --op`, the Python module and the plugin host read. Adding an operation is a folder
// under ops/ and one line in registry.cpp.
#pragma once

#include <span>

#include "gate/operation.hpp"

namespace sharpcheck::ops {

[[nodiscard]] std::span<const gate::Operation* const> all_operations();

}  // namespace sharpcheck::ops
