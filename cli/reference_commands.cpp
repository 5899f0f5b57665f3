// sharpcheck demo and sharpcheck softmax: the correctly rounded reference on one row, printed in
// every format.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::cli {
namespace {

std::vector<double> parse_logits(const std::string& text) {
  std::vector<double> logits;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);  // accepts inf, -inf, nan and hex floats
    if (item.empty() || end != item.c_str() + item.size()) {
      throw InputError(
          InputProblem::out_of_range,
          "logits: cannot read item " + std::to_string(logits.size()) + " ('" + item + "') as a number");
    }
    logits.push_back(value);
  }
  return logits;
}

void print_reference_table(const std::vector<double>& logits, double theta) {
  reference::RowOptions options;
  options.theta = theta;
  std::printf("logits (%zu):", logits.size());
  for (const double logit : logits) std::printf(" %g", logit);
  std::printf("   theta = %g (%s)\n\n", theta, hex_float(theta).c_str());
  std::printf("%-10s %-12s %-12s %s\n", "format", "logsumexp", "entropy", "softmax (correctly rounded)");
  for (const FloatFormat* format : all_float_formats) {
    const auto probabilities = reference::softmax(logits, *format, options);
    const double lse = reference::logsumexp(logits, *format, options);
    const double entropy = reference::entropy(logits, *format, options);
    std::printf("%-10s %-12.9g %-12.9g", std::string(format->name).c_str(), lse, entropy);
    for (const double p : probabilities) std::printf(" %s", hex_float(p).c_str());
    std::printf("\n");
  }
}

}  // namespace

Command add_demo_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("demo", "The correctly rounded reference on a built-in demonstration row");
  return [command]() -> int {
    if (!*command) return -1;
    // A sharp row in the paper's setting: one item 5.69 above 15 others (Gemma's mean spread).
    std::vector<double> logits(16, 0.0);
    logits[3] = 5.69;
    print_reference_table(logits, 1.0);
    return exit_pass;
  };
}

Command add_softmax_command(CLI::App& app) {
  auto logits_text = std::make_shared<std::string>();
  auto theta = std::make_shared<double>(1.0);
  auto* command =
      app.add_subcommand("softmax", "The correctly rounded reference on a row given on the command line");
  command
      ->add_option("--logits", *logits_text,
                   "Comma-separated logits, e.g. 1,2.5,-3 (inf/-inf/nan/hex allowed)")
      ->required();
  add_real_option(command, "--theta", *theta, "Temperature (finite, non-zero)");
  return [command, logits_text, theta]() -> int {
    if (!*command) return -1;
    print_reference_table(parse_logits(*logits_text), *theta);
    return exit_pass;
  };
}

}  // namespace sharpcheck::cli
