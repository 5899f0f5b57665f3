// libFuzzer target for the .npy and .npz readers: any bytes either parse or raise InputError;
// nothing else (no crash, no other exception, no unbounded allocation) is acceptable. Bytes that
// begin like a zip archive ("PK") are read as an .npz bundle, each member as a .npy file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/errors.hpp"
#include "io/npy.hpp"
#include "io/npz.hpp"

namespace {

void parse_array(const std::string& bytes) {
  const auto array = sharpcheck::io::parse_npy(bytes, "fuzz input");
  if (array.values.size() != array.element_count()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (bytes.starts_with("PK")) {
      for (const auto& member : sharpcheck::io::list_npz_members(bytes, "fuzz input")) {
        std::string storage;
        try {
          parse_array(std::string(sharpcheck::io::npz_member_bytes(bytes, member, storage, "fuzz input")));
        } catch (const sharpcheck::InputError&) {
        }
      }
    } else {
      parse_array(bytes);
    }
  } catch (const sharpcheck::InputError&) {
  }
  return 0;
}
