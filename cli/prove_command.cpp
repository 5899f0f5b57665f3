// sharpcheck prove: every Z3 obligation, one row each, with its axioms; non-zero exit if any is
// not proved, is vacuous, or has a false twin that is not refuted.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "io/atomic_file.hpp"
#include "proofs/runner.hpp"

namespace sharpcheck::cli {
namespace {

struct ProveSettings {
  std::string json_path;
  unsigned timeout_ms = 10000;
  std::string filter;
  bool brief = false;
};

nlohmann::json to_json(const proofs::ObligationReport& report) {
  return {{"name", report.name},
          {"paper_step", report.paper_step},
          {"theory", report.theory == proofs::Theory::nonlinear_reals ? "nonlinear real arithmetic (nlsat)"
                                                                      : "floating point (bit-precise)"},
          {"status", proofs::verdict_name(report.proof.verdict)},
          {"seconds", report.proof.seconds},
          {"detail", report.proof.verdict == proofs::Verdict::proved ? "" : report.proof.detail},
          {"premises", report.premises},
          {"axioms", report.axioms},
          {"non_vacuous", report.non_vacuous()},
          {"premises_witness", report.premises_check.detail},
          {"mutation", report.mutation},
          {"mutant_status", proofs::verdict_name(report.mutant.verdict)},
          {"mutant_counterexample", report.mutant.detail},
          {"passed", report.passed()}};
}

int run_prove(const ProveSettings& settings) {
  proofs::RunOptions options;
  options.timeout_ms = settings.timeout_ms;
  nlohmann::json reports = nlohmann::json::array();
  int failures = 0;
  int checked = 0;
  std::printf("%-8s %7s  %-9s %-9s  %s\n", "status", "seconds", "premises", "twin",
              "obligation  [paper step]");
  for (const auto& obligation : proofs::all_obligations()) {
    if (!settings.filter.empty() && obligation.name.find(settings.filter) == std::string::npos &&
        obligation.paper_step.find(settings.filter) == std::string::npos) {
      continue;
    }
    const auto report = proofs::check_obligation(obligation, options);
    ++checked;
    if (!report.passed()) ++failures;
    std::printf("%-8s %7.3f  %-9s %-9s  %s  [%s]\n", proofs::verdict_name(report.proof.verdict),
                report.proof.seconds, report.non_vacuous() ? "sat" : "VACUOUS",
                report.mutant.verdict == proofs::Verdict::refuted ? "refuted" : "NOT-REFUTED",
                report.name.c_str(), report.paper_step.c_str());
    if (report.proof.verdict != proofs::Verdict::proved)
      std::printf("         %s\n", report.proof.detail.c_str());
    if (!settings.brief || !report.passed()) {
      for (const auto& axiom : report.axioms) std::printf("         axiom: %s\n", axiom.c_str());
    }
    reports.push_back(to_json(report));
    std::fflush(stdout);
  }
  std::printf("\n%d passed, %d failed\n", checked - failures, failures);
  if (checked == 0) {
    throw InputError(InputProblem::out_of_range,
                     "--filter '" + settings.filter +
                         "' matches no proof obligation (see `sharpcheck prove` for the names)");
  }
  if (!settings.json_path.empty()) {
    io::write_file_atomically(
        settings.json_path,
        nlohmann::json{{"obligations", reports}, {"passed", checked - failures}, {"failed", failures}}.dump(
            2) +
            "\n");
  }
  return failures == 0 && checked > 0 ? exit_pass : exit_failure;
}

}  // namespace

Command add_prove_command(CLI::App& app) {
  auto settings = std::make_shared<ProveSettings>();
  auto* command =
      app.add_subcommand("prove", "Check every Z3 proof obligation of the bounds and kernel steps");
  command->add_option("--json", settings->json_path, "Also write the results as JSON to this file")
      ->check(report_path);
  command
      ->add_option("--timeout-ms", settings->timeout_ms,
                   "Per-check solver time limit (a watchdog enforces it)")
      ->check(CLI::Range(1u, 600000u));
  command->add_option("--filter", settings->filter,
                      "Only obligations whose name or paper step contains this text");
  command->add_flag("--brief", settings->brief, "One row per obligation; list axioms only for failing ones");
  return [command, settings]() -> int { return *command ? run_prove(*settings) : -1; };
}

}  // namespace sharpcheck::cli
