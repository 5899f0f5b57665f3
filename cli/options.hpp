// Checked parsing of the numbers users type as options: every value whole, finite and in range,
// or an InputError naming the option and the text (never a wrapped negative or a NaN timeout).
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace sharpcheck::cli {

// A decimal integer in [low, high].
[[nodiscard]] std::size_t parse_count(const std::string& text, const std::string& option, std::size_t low,
                                      std::size_t high = std::numeric_limits<std::size_t>::max());
// Comma-separated integers, each in [low, high]; empty text gives an empty list only when the
// option was not given at all: "" itself is refused.
[[nodiscard]] std::vector<std::size_t> parse_count_list(const std::string& text, const std::string& option,
                                                        std::size_t low, std::size_t high);
// Seconds: finite, > 0 and at most a day.
[[nodiscard]] double parse_seconds(const std::string& text, const std::string& option);
// Bytes with an optional K, M or G suffix (powers of 1024); at least 16 MiB.
[[nodiscard]] std::size_t parse_bytes(const std::string& text, const std::string& option);

}  // namespace sharpcheck::cli
