// libFuzzer target for the .npy reader: any bytes either parse or raise InputError; nothing else
// (no crash, no other exception, no unbounded allocation) is acceptable.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/errors.hpp"
#include "io/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto array =
        sharpcheck::io::parse_npy(std::string(reinterpret_cast<const char*>(data), size), "fuzz input");
    if (array.values.size() != array.element_count()) __builtin_trap();
  } catch (const sharpcheck::InputError&) {
  }
  return 0;
}
