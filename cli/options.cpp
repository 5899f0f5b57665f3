#include "cli/options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/errors.hpp"

namespace sharpcheck::cli {
namespace {

[[noreturn]] void refuse(const std::string& option, const std::string& text, const std::string& wanted) {
  throw InputError(InputProblem::out_of_range, option + " wants " + wanted + ", got '" + text + "'");
}

}  // namespace

std::size_t parse_count(const std::string& text, const std::string& option, std::size_t low,
                        std::size_t high) {
  const std::string range = "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) refuse(option, text, range);
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || value < low || value > high) refuse(option, text, range);
  return static_cast<std::size_t>(value);
}

std::vector<std::size_t> parse_count_list(const std::string& text, const std::string& option, std::size_t low,
                                          std::size_t high) {
  std::vector<std::size_t> values;
  if (text.empty()) return values;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    values.push_back(parse_count(text.substr(start, comma - start), option, low, high));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

double parse_seconds(const std::string& text, const std::string& option) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || !(value > 0) ||
      value > 86400) {
    refuse(option, text, "a number of seconds in (0, 86400]");
  }
  return value;
}

std::size_t parse_bytes(const std::string& text, const std::string& option) {
  const std::string wanted = "a size of at least 16M, like 512M or 4G";
  if (text.empty()) refuse(option, text, wanted);
  std::size_t shift = 0;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      shift = 10;
      break;
    case 'M':
    case 'm':
      shift = 20;
      break;
    case 'G':
    case 'g':
      shift = 30;
      break;
    default:
      break;
  }
  if (shift != 0) digits.pop_back();
  const std::size_t value = parse_count(digits, option, 1, std::numeric_limits<std::size_t>::max() >> shift);
  const std::size_t bytes = value << shift;
  if (bytes < (std::size_t{16} << 20)) refuse(option, text, wanted);
  return bytes;
}

double parse_real(const std::string& text, const std::string& option) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) refuse(option, text, "a number");
  return value;
}

CLI::Option* add_real_option(CLI::App* command, const std::string& name, double& target,
                             const std::string& help) {
  return command->add_option_function<std::string>(
      name, [&target, name](const std::string& text) { target = parse_real(text, name); }, help);
}

CLI::Option* add_real_list_option(CLI::App* command, const std::string& name, std::vector<double>& target,
                                  const std::string& help) {
  return command->add_option_function<std::string>(
      name,
      [&target, name](const std::string& text) {
        target.clear();
        std::size_t start = 0;
        while (true) {
          const std::size_t comma = text.find(',', start);
          target.push_back(parse_real(text.substr(start, comma - start), name));
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
      },
      help);
}

}  // namespace sharpcheck::cli
