// Checked parsing of the numbers users type as options: every value whole, finite and in range,
// or an InputError naming the option and the text (never a wrapped negative or a NaN timeout).
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <exception>
#include <limits>
#include <string>
#include <vector>

namespace sharpcheck::cli {

// A report path (--json, --junit): an empty one is refused, never silently ignored.
inline const CLI::Validator report_path(
    [](const std::string& path) {
      return path.empty() ? std::string("the report path is empty") : std::string();
    },
    "PATH");

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

// A decimal or hexadecimal real, rounded once to the nearest double (strtod; CLI11's own parsing
// goes through long double and rounds twice). "inf", "-inf" and "nan" are read too; the caller
// checks the range.
[[nodiscard]] double parse_real(const std::string& text, const std::string& option);

// A seed (--seed): a decimal integer in [0, 2^64 - 1], refused (not wrapped or saturated) otherwise.
inline const CLI::Validator seed_value(
    [](const std::string& text) {
      try {
        (void)parse_count(text, "--seed", 0);
        return std::string();
      } catch (const std::exception& error) {
        return std::string(error.what());
      }
    },
    "SEED");

// --name VALUE read with parse_real into `target`; the list form takes comma-separated values.
CLI::Option* add_real_option(CLI::App* command, const std::string& name, double& target,
                             const std::string& help);
CLI::Option* add_real_list_option(CLI::App* command, const std::string& name, std::vector<double>& target,
                                  const std::string& help);

}  // namespace sharpcheck::cli
