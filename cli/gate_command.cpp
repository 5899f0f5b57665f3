// sharpcheck gate and merge: parse the options, call the gate library (gate/), print its verdicts.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "gate/report.hpp"
#include "gate/sweep.hpp"
#include "gate/verdict.hpp"
#include "io/atomic_file.hpp"
#include "ops/registry.hpp"

namespace sharpcheck::cli {
namespace {

using gate::GateSettings;

void parse_shard(const std::string& text, GateSettings& settings) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) {
    throw InputError(InputProblem::out_of_range, "gate: --shard wants i/N, got '" + text + "'");
  }
  settings.shard_index = parse_count(text.substr(0, slash), "--shard (i of i/N)", 0);
  settings.shard_count = parse_count(text.substr(slash + 1), "--shard (N of i/N)", 1);
  if (settings.shard_index >= settings.shard_count) {
    throw InputError(InputProblem::out_of_range, "gate: --shard " + text + " needs 0 <= i < N");
  }
}

void print_kernel_list() {
  std::printf("%-46s %-22s %-9s %-6s %-6s %s\n", "kernel", "operation", "in", "out", "acc", "description");
  for (const gate::Operation* operation : ops::all_operations()) {
    for (const gate::KernelRow& k : operation->kernels()) {
      std::printf("%-46s %-22s %-9s %-6s %-6s %s\n", std::string(k.name).c_str(),
                  std::string(operation->name).c_str(), std::string(k.input).c_str(),
                  std::string(k.output).c_str(), std::string(k.accumulation).c_str(),
                  std::string(k.description).c_str());
    }
  }
}

void print_verdicts(const gate::SweepVerdict& verdict, const std::vector<nlohmann::json>& cases) {
  int width = 26;  // the kernel column fits the longest name
  for (const auto& k : verdict.kernels) width = std::max(width, static_cast<int>(k.kernel.size()));
  std::printf("%-*s %-16s %6s %7s %6s %9s %12s  %s\n", width, "kernel", "format", "cases", "failed", "incon.",
              "max ulp", "bound ratio", "verdict");
  for (const auto& k : verdict.kernels) {
    std::printf("%-*s %-16s %6zu %7zu %6zu %9llu %12.3g  %s\n", width, k.kernel.c_str(), k.format.c_str(),
                k.cases, k.failed, k.inconclusive, static_cast<unsigned long long>(k.max_ulps),
                k.max_bound_ratio, gate::verdict_name(k.verdict));
  }
  std::printf("\nworst case of each kernel (bound ratio = |error| / allowed; > 1 fails):\n");
  for (const auto& k : verdict.kernels) {
    const auto& worst = *k.worst;
    std::printf("  %-*s %s seed %llu: index %zu expected %s got %s (%s ulp)\n", width, k.kernel.c_str(),
                worst["id"].get<std::string>().c_str(),
                static_cast<unsigned long long>(worst["seed"].get<std::uint64_t>()),
                worst["worst"]["index"].get<std::size_t>(),
                worst["worst"]["expected"].get<std::string>().c_str(),
                worst["worst"]["actual"].get<std::string>().c_str(), worst["worst"]["ulps"].dump().c_str());
    if (k.broken) continue;
    for (const auto& c : cases) {
      if (c["kernel"] == k.kernel && gate::is_failure_status(c["status"].get<std::string>())) {
        std::printf("    FAIL %s: %s\n      rerun: %s\n", c["id"].get<std::string>().c_str(),
                    c["failures"][0].get<std::string>().c_str(), c["rerun"].get<std::string>().c_str());
      }
    }
  }
}

gate::SweepProgress progress_printer() {
  const bool terminal = isatty(STDERR_FILENO) != 0;
  // On a terminal one line rewritten per case; in a CI log one line per kernel, not per case.
  return [terminal](std::size_t done, std::size_t total, const gate::GateCase& c, bool kernel_done) {
    if (terminal) {
      std::fprintf(stderr, "\r[%zu/%zu] %-50s%s", done, total, c.id().c_str(), done == total ? "\n" : "");
    } else if (kernel_done) {
      std::fprintf(stderr, "gate: %zu/%zu cases done (%s)\n", done, total, c.kernel.c_str());
    }
  };
}

// Prints what the sweep found and returns the exit code: the verdict's, unless the sweep was
// cut short (a signal: 128 + it; an error: rethrown for main's one error path, after printing).
int report_sweep(const GateSettings& settings, const gate::SweepOutcome& sweep) {
  const gate::JudgingScope scope{.explicit_kernels = settings.explicit_kernels,
                                 .whole_sweep = settings.whole_sweep() && sweep.complete()};
  const gate::SweepVerdict verdict = gate::judge_sweep(sweep.cases, scope);
  if (!sweep.cases.empty()) print_verdicts(verdict, sweep.cases);
  std::printf("\n%zu cases in %.1f s (seed %llu, shard %zu/%zu)\n", sweep.cases.size(), sweep.seconds,
              static_cast<unsigned long long>(settings.seed), settings.shard_index, settings.shard_count);
  if (!sweep.complete()) {
    std::printf("the sweep stopped after %zu of %zu cases; the reports hold those cases\n",
                sweep.cases.size(), sweep.planned);
  }
  if (sweep.error) std::rethrow_exception(sweep.error);
  if (sweep.interrupt_signal != 0) {
    std::fprintf(stderr, "sharpcheck: interrupted by signal %d\n", sweep.interrupt_signal);
    return 128 + sweep.interrupt_signal;
  }
  if (settings.update_baseline) {
    io::write_file_atomically(settings.baseline_path, gate::baseline_of(sweep.cases).dump(1) + "\n");
    std::printf("baseline written to %s\n", settings.baseline_path.c_str());
  }
  if (verdict.any_crash) {
    std::printf("a kernel crashed or hung: reproducers are in %s\n", settings.reproducer_directory.c_str());
  }
  return verdict.exit_code();
}

int run_gate(GateSettings settings) {
  if (const char* total = std::getenv("GTEST_TOTAL_SHARDS"); total != nullptr && settings.shard_count == 1) {
    const char* index = std::getenv("GTEST_SHARD_INDEX");
    parse_shard(std::string(index == nullptr ? "0" : index) + "/" + total, settings);
  }
  const nlohmann::json budget =
      settings.budget_path.empty() ? nlohmann::json::object() : gate::read_budget(settings.budget_path);
  const nlohmann::json baseline = settings.baseline_path.empty() || settings.update_baseline
                                      ? nlohmann::json::object()
                                      : gate::read_baseline(settings.baseline_path);
  const auto cases = gate::plan_cases(settings);
  return report_sweep(settings, gate::run_sweep(settings, cases, budget, baseline, progress_printer()));
}

struct GateOptions {
  GateSettings settings;
  std::string shard, plugin_timeout = "10", plugin_memory, threads = "0";
  std::optional<std::string> sizes;  // given but empty is an error, not the default
  std::optional<std::string> plugin_path;
  bool list = false;
};

// Turns the options' text into settings, every number checked (the gate's options, in one place).
GateSettings settings_of(const GateOptions& options, bool kernels_named) {
  GateSettings run = options.settings;
  run.operations = ops::all_operations();
  if (options.sizes) {
    run.sizes = parse_count_list(*options.sizes, "--sizes", 1, std::size_t{1} << 26);
    if (run.sizes.empty())
      throw InputError(InputProblem::empty_input, "--sizes is empty: give sizes like 16,1024");
  }
  run.threads = static_cast<unsigned>(parse_count(options.threads, "--threads", 0, 1024));
  // The limits are checked with or without a plugin: a bad value is refused, never ignored.
  const ChildLimits limits{.timeout_seconds = parse_seconds(options.plugin_timeout, "--plugin-timeout"),
                           .memory_bytes = options.plugin_memory.empty()
                                               ? default_child_memory()
                                               : parse_bytes(options.plugin_memory, "--plugin-memory")};
  if (options.plugin_path) run.plugin = kernels::Plugin::open(*options.plugin_path, limits);
  // With a plugin and no --kernel, only the plugin is judged.
  if (!kernels_named) run.kernels = {run.plugin ? "none" : "all"};
  run.explicit_kernels = std::find(run.kernels.begin(), run.kernels.end(), "all") == run.kernels.end();
  if (run.plugin && !run.json_path.empty() && run.reproducer_directory == "sharpcheck-reproducers") {
    const std::filesystem::path json(run.json_path);
    run.reproducer_directory = (json.has_parent_path() ? json.parent_path() / "sharpcheck-reproducers"
                                                       : std::filesystem::path("sharpcheck-reproducers"))
                                   .string();
  }
  if (!options.shard.empty()) parse_shard(options.shard, run);
  if (run.update_baseline && run.baseline_path.empty()) {
    throw InputError(InputProblem::out_of_range, "gate: --update-baseline needs --baseline FILE");
  }
  return run;
}

}  // namespace

Command add_gate_command(CLI::App& app) {
  auto options = std::make_shared<GateOptions>();
  GateSettings& s = options->settings;
  auto* command = app.add_subcommand("gate", "Run kernels over a sweep and judge them against the reference");
  auto* kernel_option =
      command->add_option("--kernel", s.kernels, "Kernel names, or 'all' (default)")->delimiter(',');
  command->add_option("--sizes", options->sizes,
                      "Row sizes, comma-separated (default 16 to 16384 in powers of two)");
  command->add_option("--seed", s.seed, "Base seed; each case mixes in its id")->check(seed_value);
  command->add_option("--case", s.only_case, "Run only this case id, e.g. safe3/random_normal/n=1024");
  command->add_option("--shard", options->shard,
                      "Run shard i of N (i/N); GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS also work");
  command->add_option("--json", s.json_path, "Write the report as JSON (rewritten as cases finish)")
      ->check(report_path);
  command->add_option("--junit", s.junit_path, "Write JUnit XML for CI systems")->check(report_path);
  command->add_option("--budget", s.budget_path,
                      "JSON budget: {\"kernels\": {name: {max_ulps, max_bound_ratio}}}");
  command->add_option("--baseline", s.baseline_path, "JSON baseline from an earlier run: fail on any growth");
  command->add_flag("--update-baseline", s.update_baseline, "Write this run's figures to --baseline");
  command->add_flag("--list", options->list, "List the built-in kernels and exit");
  command->add_flag_callback(
      "--proven-only", [&s] { s.strictest = metrics::Tier::proven; },
      "Judge by the proven worst-case tier alone (default: a case fails on the proven or the statistical "
      "tier)");
  command->add_option("--tolerance-of", s.plugin_attention_model,
                      "The precision model a plugin's attention is judged by: attention_fp32 (default, as "
                      "attention_flash), attention_p_rounded (FlashAttention 2/3: P in the output format), "
                      "attention_math_lowp (PyTorch's math path: scores and P in the output format)");
  command->add_option("--plugin", options->plugin_path,
                      "A kernel plugin (kernels/plugin_abi.h), run only in child processes");
  command->add_option("--plugin-timeout", options->plugin_timeout,
                      "Seconds a plugin call may take (default 10)");
  command->add_option(
      "--plugin-memory", options->plugin_memory,
      "Address-space limit of a plugin's process, e.g. 4G or 512M (default: half the machine's memory)");
  command->add_option("--reproducers", s.reproducer_directory, "Where inputs of crashed cases are saved");
  command->add_option("--threads", options->threads,
                      "Worker threads, 1-1024 (default: every core; results do not depend on it)");
  return [command, kernel_option, options, &app]() -> int {
    // The built-in default job when no subcommand is named.
    if (!*command && !app.get_subcommands().empty()) return -1;
    if (options->list) {
      print_kernel_list();
      return exit_pass;
    }
    catch_interrupts();
    return run_gate(settings_of(*options, kernel_option->count() > 0));
  };
}

Command add_merge_command(CLI::App& app) {
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  auto junit = std::make_shared<std::string>();
  auto* command = app.add_subcommand("merge", "Join the JSON reports of gate shards into one report");
  command->add_option("reports", *inputs, "Shard reports (gate --json)")->required();
  command->add_option("--json", *output, "Where to write the merged report")->check(report_path)->required();
  command->add_option("--junit", *junit, "Also write the merged JUnit XML")->check(report_path);
  return [command, inputs, output, junit]() -> int {
    if (!*command) return -1;
    std::vector<nlohmann::json> reports;
    for (const auto& path : *inputs) reports.push_back(gate::read_json_file(path, "report"));
    const gate::MergedReport merged = gate::merge_reports(reports);
    const auto cases = merged.report["cases"].get<std::vector<nlohmann::json>>();
    const gate::JudgingScope scope{.explicit_kernels = merged.report["explicit_kernels"].get<bool>(),
                                   .whole_sweep = merged.whole_sweep};
    const gate::SweepVerdict verdict = gate::judge_sweep(cases, scope);
    io::write_file_atomically(*output, merged.report.dump(1) + "\n");
    if (!junit->empty()) io::write_file_atomically(*junit, gate::junit_xml(cases, scope));
    std::size_t failed = 0, crashed = 0;
    for (const auto& k : verdict.kernels) {
      failed += k.broken ? 0 : k.failed;
      crashed += k.crashed;
      if (k.verdict == gate::Verdict::unexpected_pass)
        std::printf("UNEXPECTED PASS %s: a deliberately broken kernel passed the whole sweep\n",
                    k.kernel.c_str());
    }
    std::printf("merged %zu reports: %zu cases, %zu failed, %zu crashed", reports.size(), cases.size(),
                failed, crashed);
    if (merged.duplicates_dropped > 0)
      std::printf(", %zu duplicate cases dropped", merged.duplicates_dropped);
    std::printf("%s\n",
                merged.whole_sweep ? "" : " (not every shard given: expected failures are not judged)");
    return verdict.exit_code();
  };
}

}  // namespace sharpcheck::cli
