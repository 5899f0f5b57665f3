// The subcommands of the sharpcheck program: each adds itself to the CLI11 app and returns the
// function that runs it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace sharpcheck::cli {

// Exit codes, documented in the README: 0 pass, 1 a budget, baseline or proof failure, 2 a usage
// or input error, 3 a kernel crashed or hung.
inline constexpr int exit_pass = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_input_error = 2;
inline constexpr int exit_kernel_crash = 3;

using Command = std::function<int()>;

Command add_gate_command(CLI::App& app);  // also the default job
Command add_merge_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_bounds_command(CLI::App& app);
Command add_study_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_softmax_command(CLI::App& app);
Command add_prove_command(CLI::App& app);

}  // namespace sharpcheck::cli
