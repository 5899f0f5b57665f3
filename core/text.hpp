// Text that reports can always hold: JSON needs valid UTF-8, XML also refuses most control
// characters. Names and paths come from users and plugins, so both are made safe here, once.
#pragma once

#include <string>
#include <string_view>

namespace sharpcheck {

// `text` with every byte sequence that is not valid UTF-8 replaced by U+FFFD.
[[nodiscard]] std::string to_valid_utf8(std::string_view text);

// `text` as XML 1.0 character data: valid UTF-8, the five special characters escaped, and the
// control characters XML 1.0 cannot hold (all below 0x20 but tab, newline, carriage return)
// written as U+FFFD.
[[nodiscard]] std::string xml_escape(std::string_view text);

}  // namespace sharpcheck
