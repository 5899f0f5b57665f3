// The subcommands of the sharpcheck program: each adds itself to the CLI11 app and returns the
// function that runs it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <functional>

namespace sharpcheck::cli {

// Exit codes, documented in the README: 0 pass, 1 a tolerance, budget, baseline or proof failure,
// 2 a usage, input or I/O error (also an undecided rounding or an internal error, each named as
// such), 3 a kernel crashed, hung or ran out of memory, 128 + N when signal N stopped the run.
inline constexpr int exit_pass = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_input_error = 2;
inline constexpr int exit_kernel_crash = 3;

using Command = std::function<int()>;

// The program's one error path: prints what went wrong (naming its kind) and returns the exit code.
[[nodiscard]] int report_error(const std::exception_ptr& error);

Command add_gate_command(CLI::App& app);  // also the default job
Command add_merge_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_ops_command(CLI::App& app);
Command add_bounds_command(CLI::App& app);
Command add_study_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_softmax_command(CLI::App& app);
Command add_prove_command(CLI::App& app);

}  // namespace sharpcheck::cli
