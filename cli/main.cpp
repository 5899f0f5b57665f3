// sharpcheck: the command-line program over the reference, formats, kernels, bounds and proofs.
#include <CLI/CLI.hpp>
#include <iostream>
#include <vector>

#include "cli/commands.hpp"
#include "core/errors.hpp"

namespace {

// The program; main() below only guarantees that no exception leaves it.
int run(int argc, char** argv) {
  CLI::App app{"sharpcheck: exact checking of softmax and attention kernels"};
  app.require_subcommand(0, 1);
  std::vector<sharpcheck::cli::Command> commands{
      sharpcheck::cli::add_demo_command(app),    sharpcheck::cli::add_gate_command(app),
      sharpcheck::cli::add_merge_command(app),   sharpcheck::cli::add_compare_command(app),
      sharpcheck::cli::add_bounds_command(app),  sharpcheck::cli::add_study_command(app),
      sharpcheck::cli::add_softmax_command(app), sharpcheck::cli::add_prove_command(app),
      sharpcheck::cli::add_ops_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : sharpcheck::cli::exit_input_error;
  }
  try {
    for (const auto& command : commands) {
      const int code = command();
      if (code >= 0) return code;
    }
    return sharpcheck::cli::exit_input_error;
  } catch (...) {
    return sharpcheck::cli::report_error(std::current_exception());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (...) {  // building the commands, or report_error itself, threw: still an exit code, never abort
    try {
      return sharpcheck::cli::report_error(std::current_exception());
    } catch (...) {
      return sharpcheck::cli::exit_input_error;
    }
  }
}
