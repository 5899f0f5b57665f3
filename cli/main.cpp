// sharpcheck: the command-line program over the reference, formats and (as they land) the
// kernels, bounds and proofs.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "reference/softmax.hpp"

namespace {

std::vector<double> parse_logits(const std::string& text) {
  std::vector<double> logits;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);  // accepts inf, -inf, nan and hex floats
    if (item.empty() || end != item.c_str() + item.size()) {
      throw sharpcheck::InputError(sharpcheck::InputProblem::out_of_range,
                                   "logits: cannot read item " + std::to_string(logits.size()) + " ('" + item +
                                       "') as a number");
    }
    logits.push_back(value);
  }
  return logits;
}

// The reference on one row, in every format: what `sharpcheck demo` and `sharpcheck softmax` print.
void print_reference_table(const std::vector<double>& logits, double theta) {
  sharpcheck::reference::RowOptions options;
  options.theta = theta;
  std::printf("logits (%zu):", logits.size());
  for (const double logit : logits) std::printf(" %g", logit);
  std::printf("   theta = %g\n\n", theta);
  std::printf("%-10s %-12s %-12s %s\n", "format", "logsumexp", "entropy", "softmax (correctly rounded)");
  for (const sharpcheck::FloatFormat* format : sharpcheck::all_float_formats) {
    const auto probabilities = sharpcheck::reference::softmax(logits, *format, options);
    const double lse = sharpcheck::reference::logsumexp(logits, *format, options);
    const double entropy = sharpcheck::reference::entropy(logits, *format, options);
    std::printf("%-10s %-12.9g %-12.9g", std::string(format->name).c_str(), lse, entropy);
    for (const double p : probabilities) std::printf(" %s", sharpcheck::hex_float(p).c_str());
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sharpcheck: exact checking of softmax and attention kernels"};
  app.require_subcommand(0, 1);

  auto* demo = app.add_subcommand("demo", "The correctly rounded reference on a built-in demonstration row");

  std::string logits_text;
  double theta = 1.0;
  auto* softmax = app.add_subcommand("softmax", "The correctly rounded reference on a row given on the command line");
  softmax->add_option("--logits", logits_text, "Comma-separated logits, e.g. 1,2.5,-3 (inf/-inf/nan/hex allowed)")
      ->required();
  softmax->add_option("--theta", theta, "Temperature (finite, non-zero)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*softmax) {
      print_reference_table(parse_logits(logits_text), theta);
    } else {
      (void)demo;
      // A sharp row in the paper's setting: one item 5.69 above 15 others (Gemma's mean spread).
      std::vector<double> logits(16, 0.0);
      logits[3] = 5.69;
      print_reference_table(logits, 1.0);
    }
  } catch (const sharpcheck::InputError& error) {
    std::cerr << "sharpcheck: input error: " << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "sharpcheck: error: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
