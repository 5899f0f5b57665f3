// sharpcheck gate: the CI regression gate over the built-in kernels.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

#include "cli/commands.hpp"
#include "cli/gate.hpp"
#include "core/errors.hpp"
#include "kernels/registry.hpp"

namespace sharpcheck::cli {
namespace {

void parse_shard(const std::string& text, GateSettings& settings) {
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    settings.shard_index = std::stoul(text.substr(0, slash));
    settings.shard_count = std::stoul(text.substr(slash + 1));
  } catch (const std::exception&) {
    throw InputError(InputProblem::out_of_range, "gate: --shard wants i/N, got '" + text + "'");
  }
  if (settings.shard_count == 0 || settings.shard_index >= settings.shard_count) {
    throw InputError(InputProblem::out_of_range, "gate: --shard " + text + " needs 0 <= i < N");
  }
}

void print_kernel_list() {
  std::printf("%-22s %-6s %-6s %-6s %s\n", "kernel", "in", "out", "acc", "description");
  for (const auto& k : kernels::softmax_kernels()) {
    std::printf("%-22s %-6s %-6s %-6s %s\n", std::string(k.name).c_str(), std::string(k.input->name).c_str(),
                std::string(k.output->name).c_str(), std::string(k.accumulation->name).c_str(),
                std::string(k.description).c_str());
  }
  for (const auto& k : kernels::attention_kernels()) {
    std::printf("%-22s %-6s %-6s %-6s %s\n", std::string(k.name).c_str(), std::string(k.input->name).c_str(),
                std::string(k.output->name).c_str(), std::string(k.accumulation->name).c_str(),
                std::string(k.description).c_str());
  }
}

struct KernelSummary {
  std::size_t cases = 0;
  std::size_t failed = 0;
  std::uint64_t max_ulps = 0;
  double max_bound_ratio = 0;
  bool broken = false;
  std::string format;
  const nlohmann::json* worst = nullptr;
};

int run_gate(GateSettings settings, bool list) {
  if (list) {
    print_kernel_list();
    return exit_pass;
  }
  if (const char* total = std::getenv("GTEST_TOTAL_SHARDS"); total != nullptr && settings.shard_count == 1) {
    const char* index = std::getenv("GTEST_SHARD_INDEX");
    parse_shard(std::string(index == nullptr ? "0" : index) + "/" + total, settings);
  }
  const nlohmann::json budget = settings.budget_path.empty() ? nlohmann::json::object()
                                                             : read_json_file(settings.budget_path, "budget");
  const nlohmann::json baseline = settings.baseline_path.empty() || settings.update_baseline
                                      ? nlohmann::json::object()
                                      : read_json_file(settings.baseline_path, "baseline");
  const auto cases = plan_cases(settings);
  const bool terminal = isatty(STDERR_FILENO) != 0;
  std::vector<nlohmann::json> results;
  const auto start = std::chrono::steady_clock::now();
  const auto write_reports = [&] {
    const nlohmann::json report{{"seed", settings.seed},
                                {"shard", std::to_string(settings.shard_index) + "/" + std::to_string(settings.shard_count)},
                                {"explicit_kernels", settings.explicit_kernels},
                                {"cases", results}};
    if (!settings.json_path.empty()) write_atomically(settings.json_path, report.dump(1) + "\n");
    if (!settings.junit_path.empty()) write_atomically(settings.junit_path, junit_xml(results));
  };
  // Cases run on a pool of threads; results are taken in sweep order, so reports and verdicts
  // are the same for any thread count. Plugin cases fork, which wants a single thread.
  const unsigned threads = settings.plugin ? 1u
                                           : (settings.threads != 0 ? settings.threads
                                                                    : std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::optional<CaseOutcome>> finished(cases.size());
  std::mutex lock;
  std::condition_variable ready;
  std::atomic<std::size_t> next{0};
  std::exception_ptr worker_error;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t j = next++; j < cases.size(); j = next++) {
        std::optional<CaseOutcome> outcome;
        try {
          outcome = run_case(cases[j], settings);
        } catch (...) {
          const std::lock_guard<std::mutex> guard(lock);
          if (!worker_error) worker_error = std::current_exception();
          next = cases.size();
        }
        const std::lock_guard<std::mutex> guard(lock);
        finished[j] = std::move(outcome);
        ready.notify_all();
      }
    });
  }
  const auto join_pool = [&] {
    for (auto& thread : pool) thread.join();
    pool.clear();
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::unique_lock<std::mutex> guard(lock);
    ready.wait(guard, [&] { return finished[i].has_value() || worker_error != nullptr; });
    if (worker_error) {
      guard.unlock();
      join_pool();
      write_reports();
      std::rethrow_exception(worker_error);
    }
    CaseOutcome outcome = std::move(*finished[i]);
    finished[i].reset();
    guard.unlock();
    apply_budget(outcome, budget);
    apply_baseline(outcome, baseline);
    results.push_back(to_json(outcome));
    if (terminal) {
      std::fprintf(stderr, "\r[%zu/%zu] %-50s", i + 1, cases.size(), cases[i].id().c_str());
    } else if (i + 1 == cases.size() || cases[i].kernel != cases[i + 1].kernel) {
      std::fprintf(stderr, "gate: %zu/%zu cases done (%s)\n", i + 1, cases.size(), cases[i].kernel.c_str());
    }
    // The report so far is never lost: rewritten (atomically) every 25 cases and at each kernel.
    if ((i + 1) % 25 == 0 || i + 1 == cases.size() || cases[i].kernel != cases[i + 1].kernel) write_reports();
  }
  join_pool();
  if (terminal) std::fprintf(stderr, "\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  bool any_crash = false;
  for (const auto& c : results) any_crash = any_crash || c["status"] == "crash";
  std::map<std::string, KernelSummary> summaries;
  std::vector<std::string> order;
  for (const auto& c : results) {
    const std::string kernel = c["kernel"];
    if (!summaries.count(kernel)) order.push_back(kernel);
    auto& summary = summaries[kernel];
    summary.format = c["format"];
    summary.broken = c["deliberately_broken"];
    ++summary.cases;
    const bool failed = c["status"] != "pass";
    if (failed) ++summary.failed;
    summary.max_ulps = std::max(summary.max_ulps, c["max_ulps"].get<std::uint64_t>());
    const double ratio = c["max_bound_ratio"].is_number() ? c["max_bound_ratio"].get<double>() : INFINITY;
    if (summary.worst == nullptr || ratio > summary.max_bound_ratio) {
      summary.max_bound_ratio = std::max(summary.max_bound_ratio, ratio);
      summary.worst = &c;
    }
  }
  std::printf("%-26s %-16s %6s %7s %9s %12s  %s\n", "kernel", "format", "cases", "failed", "max ulp", "bound ratio",
              "verdict");
  bool run_failed = false;
  for (const auto& kernel : order) {
    const auto& s = summaries[kernel];
    Verdict verdict = Verdict::pass;
    if (s.broken && !settings.explicit_kernels) {
      verdict = s.failed > 0 ? Verdict::expected_failure : Verdict::unexpected_pass;
    } else if (s.failed > 0) {
      verdict = Verdict::fail;
    }
    run_failed = run_failed || verdict == Verdict::fail || verdict == Verdict::unexpected_pass;
    std::printf("%-26s %-16s %6zu %7zu %9llu %12.3g  %s\n", kernel.c_str(), s.format.c_str(), s.cases, s.failed,
                static_cast<unsigned long long>(s.max_ulps), s.max_bound_ratio, verdict_name(verdict));
  }
  std::printf("\nworst case of each kernel (bound ratio = |error| / allowed; > 1 fails):\n");
  for (const auto& kernel : order) {
    const auto& worst = *summaries[kernel].worst;
    std::printf("  %-26s %s seed %llu: index %zu expected %s got %s (%s ulp)\n", kernel.c_str(),
                worst["id"].get<std::string>().c_str(), static_cast<unsigned long long>(worst["seed"].get<std::uint64_t>()),
                worst["worst"]["index"].get<std::size_t>(), worst["worst"]["expected"].get<std::string>().c_str(),
                worst["worst"]["actual"].get<std::string>().c_str(), worst["worst"]["ulps"].dump().c_str());
    for (const auto& c : results) {
      if (c["kernel"] == kernel && c["status"] != "pass" && !(summaries[kernel].broken && !settings.explicit_kernels)) {
        std::printf("    FAIL %s: %s\n      rerun: %s\n", c["id"].get<std::string>().c_str(),
                    c["failures"][0].get<std::string>().c_str(), c["rerun"].get<std::string>().c_str());
      }
    }
  }
  std::printf("\n%zu cases in %.1f s (seed %llu, shard %zu/%zu)\n", results.size(), seconds,
              static_cast<unsigned long long>(settings.seed), settings.shard_index, settings.shard_count);
  if (settings.update_baseline && !settings.baseline_path.empty()) {
    write_atomically(settings.baseline_path, baseline_of(results).dump(1) + "\n");
    std::printf("baseline written to %s\n", settings.baseline_path.c_str());
  }
  if (any_crash) {
    std::printf("a kernel crashed or hung: reproducers are in %s\n", settings.reproducer_directory.c_str());
    return exit_kernel_crash;
  }
  return run_failed ? exit_failure : exit_pass;
}

}  // namespace

Command add_gate_command(CLI::App& app) {
  auto settings = std::make_shared<GateSettings>();
  auto shard = std::make_shared<std::string>();
  auto sizes = std::make_shared<std::vector<std::size_t>>();
  auto list = std::make_shared<bool>(false);
  auto* command = app.add_subcommand("gate", "Run kernels over a sweep and judge them against the reference");
  auto* kernel_option =
      command->add_option("--kernel", settings->kernels, "Kernel names, or 'all' (default)")->delimiter(',');
  command->add_option("--sizes", *sizes, "Row sizes (default 16 to 16384 in powers of two)")->delimiter(',');
  command->add_option("--seed", settings->seed, "Base seed; each case mixes in its id");
  command->add_option("--case", settings->only_case, "Run only this case id, e.g. safe3/random_normal/n=1024");
  command->add_option("--shard", *shard, "Run shard i of N (i/N); GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS also work");
  command->add_option("--json", settings->json_path, "Write the report as JSON (rewritten as cases finish)");
  command->add_option("--junit", settings->junit_path, "Write JUnit XML for CI systems");
  command->add_option("--budget", settings->budget_path, "JSON budget: {\"kernels\": {name: {max_ulps, max_bound_ratio}}}");
  command->add_option("--baseline", settings->baseline_path, "JSON baseline from an earlier run: fail on any growth");
  command->add_flag("--update-baseline", settings->update_baseline, "Write this run's figures to --baseline");
  command->add_flag("--list", *list, "List the built-in kernels and exit");
  auto plugin_path = std::make_shared<std::string>();
  command->add_option("--plugin", *plugin_path, "A kernel plugin (kernels/plugin_abi.h) to judge, run in a child process");
  command->add_option("--plugin-timeout", settings->plugin_timeout_seconds, "Seconds a plugin call may take")
      ->check(CLI::PositiveNumber);
  command->add_option("--reproducers", settings->reproducer_directory, "Where inputs of crashed cases are saved");
  command->add_option("--threads", settings->threads, "Worker threads (default: every core; results do not depend on it)");
  return [command, kernel_option, settings, shard, sizes, list, plugin_path, &app]() -> int {
    // The built-in default job when no subcommand is named.
    if (!*command && !app.get_subcommands().empty()) return -1;
    GateSettings run = *settings;
    run.sizes = *sizes;
    if (!plugin_path->empty()) run.plugin = kernels::Plugin::open(*plugin_path);
    // With a plugin and no --kernel, only the plugin is judged.
    if (kernel_option->count() == 0) run.kernels = {run.plugin ? "none" : "all"};
    run.explicit_kernels = std::find(run.kernels.begin(), run.kernels.end(), "all") == run.kernels.end();
    if (run.plugin && !settings->json_path.empty() && run.reproducer_directory == "sharpcheck-reproducers") {
      run.reproducer_directory = std::filesystem::path(settings->json_path).parent_path().string() +
                                 (std::filesystem::path(settings->json_path).has_parent_path() ? "/" : "") +
                                 "sharpcheck-reproducers";
    }
    if (!shard->empty()) parse_shard(*shard, run);
    if (run.update_baseline && run.baseline_path.empty()) {
      throw InputError(InputProblem::out_of_range, "gate: --update-baseline needs --baseline FILE");
    }
    return run_gate(run, *list);
  };
}

Command add_merge_command(CLI::App& app) {
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  auto junit = std::make_shared<std::string>();
  auto* command = app.add_subcommand("merge", "Join the JSON reports of gate shards into one report");
  command->add_option("reports", *inputs, "Shard reports (gate --json)")->required();
  command->add_option("--json", *output, "Where to write the merged report")->required();
  command->add_option("--junit", *junit, "Also write the merged JUnit XML");
  return [command, inputs, output, junit]() -> int {
    if (!*command) return -1;
    std::vector<nlohmann::json> reports;
    for (const auto& path : *inputs) reports.push_back(read_json_file(path, "report"));
    const nlohmann::json merged = merge_reports(reports);
    write_atomically(*output, merged.dump(1) + "\n");
    if (!junit->empty()) write_atomically(*junit, junit_xml(merged["cases"].get<std::vector<nlohmann::json>>()));
    std::size_t failed = 0;
    const bool explicit_kernels = merged["explicit_kernels"].get<bool>();
    for (const auto& c : merged["cases"]) failed += verdict_of(c, explicit_kernels) == Verdict::fail ? 1 : 0;
    std::printf("merged %zu reports: %zu cases, %zu failed\n", reports.size(), merged["cases"].size(), failed);
    return failed == 0 ? exit_pass : exit_failure;
  };
}

}  // namespace sharpcheck::cli
