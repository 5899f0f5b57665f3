#include "gate/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/errors.hpp"
#include "core/text.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::gate {
namespace {

[[noreturn]] void malformed(const std::string& what, const std::string& detail) {
  throw InputError(InputProblem::out_of_range, what + ": " + detail);
}

// The limits of one budget or baseline entry: max_ulps an unsigned integer, max_bound_ratio a
// number >= 0 (the string "inf" is what a report writes for an infinite ratio).
void check_limits(const nlohmann::json& entry, const std::string& where) {
  if (!entry.is_object()) malformed(where, "must be an object with max_ulps and/or max_bound_ratio");
  if (entry.contains("max_ulps") && !entry["max_ulps"].is_number_unsigned()) {
    malformed(where, "max_ulps must be a non-negative integer, got " + entry["max_ulps"].dump());
  }
  if (entry.contains("tolerance_of")) {
    const auto& model = entry["tolerance_of"];
    if (!model.is_string()) malformed(where, "tolerance_of must name a tolerance entry, got " + model.dump());
    try {
      (void)metrics::tolerance_for(model.get<std::string>());
    } catch (const InputError& error) {
      malformed(where, error.what());
    }
  }
  if (entry.contains("max_bound_ratio")) {
    const auto& ratio = entry["max_bound_ratio"];
    const bool infinite = ratio.is_string() && ratio.get<std::string>() == "inf";
    if (!infinite && (!ratio.is_number() || !(ratio.get<double>() >= 0))) {
      malformed(where, "max_bound_ratio must be a number >= 0, got " + ratio.dump());
    }
  }
}

double ratio_limit(const nlohmann::json& value) { return value.is_string() ? INFINITY : value.get<double>(); }

nlohmann::json read_limits_file(const std::string& path, const char* what, const char* key) {
  nlohmann::json file = read_json_file(path, what);
  const std::string name = std::string(what) + " file '" + path + "'";
  if (!file.is_object() || !file.contains(key) || !file[key].is_object()) {
    malformed(name, std::string("needs an object \"") + key + "\"");
  }
  for (const auto& [entry_name, entry] : file[key].items()) {
    std::string where = name;
    where += ", entry '";
    where += entry_name;
    where += "'";
    check_limits(entry, where);
  }
  return file;
}

// The keys merge and the verdicts read from each case record, with their types.
void check_case_record(const nlohmann::json& c, const std::string& where) {
  if (!c.is_object()) malformed(where, "a case is not an object");
  using Check = bool (nlohmann::json::*)() const noexcept;
  const auto need = [&](const char* key, Check is_valid) {
    if (!c.contains(key) || !(c[key].*is_valid)())
      malformed(where, std::string("a case has no valid \"") + key + "\"");
  };
  need("id", &nlohmann::json::is_string);
  need("kernel", &nlohmann::json::is_string);
  need("format", &nlohmann::json::is_string);
  need("index", &nlohmann::json::is_number_unsigned);
  need("status", &nlohmann::json::is_string);
  // Only the statuses the gate writes (CaseOutcome::status): any other ("FAIL", "error", "hang")
  // would otherwise count as a pass.
  const std::string status = c["status"].get<std::string>();
  if (status != "pass" && status != "fail" && status != "crash" && status != "inconclusive")
    malformed(where, "a case has the unknown status \"" + status + "\" (pass, fail, crash or inconclusive)");
  need("deliberately_broken", &nlohmann::json::is_boolean);
  need("max_ulps", &nlohmann::json::is_number_unsigned);
  // A number, or the text a report writes for a non-finite ratio ("inf", "-inf", "nan").
  const nlohmann::json& ratio = c.contains("max_bound_ratio") ? c["max_bound_ratio"] : nlohmann::json();
  const bool ratio_valid =
      ratio.is_number() || (ratio.is_string() && (ratio == "inf" || ratio == "-inf" || ratio == "nan"));
  if (!ratio_valid || (ratio.is_number() && !(ratio.get<double>() >= 0)))
    malformed(where,
              "a case's \"max_bound_ratio\" is " + ratio.dump() + ", not a number >= 0, \"inf\" or \"nan\"");
  // Fields merge copies into its report as they are: typed where present (n = -1 and tiers = 3
  // were copied, and a reader of the merged report met them).
  if (c.contains("n") && !c["n"].is_number_unsigned())
    malformed(where, "a case's \"n\" is " + c["n"].dump() + ", not a count");
  if (c.contains("tiers") && !c["tiers"].is_object())
    malformed(where, "a case's \"tiers\" is " + c["tiers"].dump() + ", not an object");
  need("failures", &nlohmann::json::is_array);
  need("seconds", &nlohmann::json::is_number);
  need("seed", &nlohmann::json::is_number_unsigned);
  need("rerun", &nlohmann::json::is_string);
}

// "i/N" of a report's shard field.
std::pair<std::size_t, std::size_t> shard_of(const nlohmann::json& report) {
  if (report.contains("shard") && !report["shard"].is_string())
    malformed("merge", "a report's shard is not i/N");
  const std::string text = report.value("shard", std::string("0/1"));
  const auto slash = text.find('/');
  const auto whole = [](const std::string& digits) {
    return !digits.empty() && digits.size() <= 9 &&
           digits.find_first_not_of("0123456789") == std::string::npos;  // no sign, no spaces
  };
  if (slash != std::string::npos && whole(text.substr(0, slash)) && whole(text.substr(slash + 1))) {
    const std::size_t index = std::stoul(text.substr(0, slash)), count = std::stoul(text.substr(slash + 1));
    if (count > 0 && index < count) return {index, count};
  }
  malformed("merge", "a report's shard '" + text + "' is not i/N with 0 <= i < N");
}

}  // namespace

namespace {

nlohmann::json finite_or_string(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

// A batch-invariance case's runs and the requests whose bits changed (searchable as "invariance").
void add_invariance(const CaseOutcome::Invariance& invariance, nlohmann::json& record) {
  nlohmann::json& out = record["invariance"];
  out["requests"] = invariance.requests;
  out["near_ties"] = invariance.near_ties;
  out["invariant"] = invariance.changes.empty();
  out["runs"] = nlohmann::json::array();
  for (const CaseOutcome::InvarianceRun& run : invariance.runs) {
    nlohmann::json entry = {{"name", run.name}, {"batch", run.batch}, {"judged", run.judged}};
    if (run.judged) entry["max_bound_ratio"] = finite_or_string(run.max_bound_ratio);
    out["runs"].push_back(std::move(entry));
  }
  out["changed"] = nlohmann::json::array();
  for (const CaseOutcome::BitwiseChange& change : invariance.changes) {
    out["changed"].push_back({{"request", change.request},
                              {"run", change.run},
                              {"output", change.output},
                              {"elements", change.elements},
                              {"max_ulps", change.max_ulps},
                              {"max_abs", finite_or_string(change.max_abs)}});
  }
}

// What only some records have: the plugin's console, the worst element's full index, the judged
// gradients, an interruption, and the recipe of judged arrays.
void add_optional_fields(const CaseOutcome& outcome, nlohmann::json& record) {
  if (!outcome.console.empty()) record["console"] = to_valid_utf8(outcome.console);
  if (!outcome.worst_index.empty()) {
    record["worst"]["array"] = outcome.worst_array;
    record["worst"]["full_index"] = outcome.worst_index;
  }
  for (const CaseOutcome::TensorVerdict& t : outcome.tensors) {
    record["tensors"].push_back({{"name", t.name},
                                 {"proven_ratio", finite_or_string(t.proven_ratio)},
                                 {"statistical_ratio", finite_or_string(t.statistical_ratio)},
                                 {"violations", t.violations},
                                 {"proven_violations", t.proven_violations},
                                 {"non_finite", t.non_finite}});
  }
  if (!outcome.incomplete.empty()) record["incomplete"] = outcome.incomplete;
  if (!outcome.notes.empty()) record["notes"] = outcome.notes;
  if (outcome.invariance) add_invariance(*outcome.invariance, record);
  if (!outcome.recipe.empty()) {  // judged arrays: the recipe the verdict is under, and why
    record["recipe"] = outcome.recipe;
    record["recipe_note"] = outcome.recipe_note;
    record["max_row_scale_ratio"] = outcome.comparison.max_row_scale_ratio;
  }
}

}  // namespace

nlohmann::json to_json(const CaseOutcome& outcome) {
  const auto& c = outcome.comparison;
  const auto& gate_case = outcome.gate_case;
  nlohmann::json record = {
      {"id", gate_case.id()},
      {"kernel", gate_case.kernel},
      {"input", gate_case.input},
      {"n", gate_case.n},
      {"index", gate_case.index},
      {"seed", gate_case.seed},
      {"format", outcome.format},
      {"deliberately_broken", gate_case.deliberately_broken},
      {"status", outcome.status()},
      {"reproducer", outcome.reproducer},
      {"failures", outcome.failures},
      {"reference",
       {{"calls", outcome.reference_statistics.calls},
        {"decided_in_double", outcome.reference_statistics.decided_in_double},
        {"decided_by_balls", outcome.reference_statistics.decided_by_balls},
        {"escalations", outcome.reference_statistics.escalations},
        {"exact_cases", outcome.reference_statistics.exact_cases},
        {"highest_mpfr_precision", outcome.reference_statistics.highest_precision}}},
      {"seconds", outcome.seconds},
      {"elements", c.elements},
      {"max_ulps", c.max_ulps},
      {"mean_ulps", c.mean_ulps},
      {"max_bound_ratio", finite_or_string(c.max_bound_ratio)},
      {"max_absolute_error", finite_or_string(c.max_absolute_error)},
      {"max_relative_error", finite_or_string(c.max_relative_error)},
      {"max_sum_error", finite_or_string(c.max_sum_error)},
      {"max_kl_divergence", finite_or_string(c.max_kl_divergence)},
      {"argmax_disagreements", c.argmax_disagreements},
      {"false_zeros", c.false_zeros},
      {"non_finite", c.non_finite},
      {"informative_elements", c.informative},
      {"tiers",
       {{"proven",
         {{"violations", c.violation_count},
          {"mismatched_elements", c.element_violation_count},
          {"max_bound_ratio", finite_or_string(c.max_bound_ratio)}}},
        {"statistical",
         {{"violations", c.statistical_violation_count},
          {"max_bound_ratio", finite_or_string(c.max_statistical_ratio)},
          {"max_bias_ratio", finite_or_string(c.max_bias_ratio)},
          {"first_violation",
           c.statistical_violations.empty() ? "" : to_valid_utf8(c.statistical_violations.front())}}}}},
      {"worst",
       {{"row", c.worst.row},
        {"index", c.worst.index},
        {"expected", hex_float(c.worst.expected)},
        {"actual", hex_float(c.worst.actual)},
        {"ulps", c.worst.ulps ? nlohmann::json(*c.worst.ulps) : nlohmann::json(nullptr)},
        {"allowed", c.worst.allowed}}},
      {"rerun", "sharpcheck gate " +
                    (gate_case.plugin_path.empty() ? "--kernel " + gate_case.kernel
                                                   : "--plugin " + to_valid_utf8(gate_case.plugin_path)) +
                    " --case " + gate_case.id() + " --seed " + std::to_string(gate_case.base_seed)}};
  add_optional_fields(outcome, record);
  return record;
}

nlohmann::json read_budget(const std::string& path) { return read_limits_file(path, "budget", "kernels"); }
nlohmann::json read_baseline(const std::string& path) { return read_limits_file(path, "baseline", "cases"); }

std::string budget_tolerance(const nlohmann::json& budget, const std::string& kernel) {
  if (!budget.contains("kernels") || !budget["kernels"].contains(kernel)) return "";
  return budget["kernels"][kernel].value("tolerance_of", std::string());
}

void apply_budget(CaseOutcome& outcome, const nlohmann::json& budget) {
  if (!budget.contains("kernels") || !budget["kernels"].contains(outcome.gate_case.kernel)) return;
  const auto& entry = budget["kernels"][outcome.gate_case.kernel];
  if (entry.contains("max_ulps") && outcome.comparison.max_ulps > entry["max_ulps"].get<std::uint64_t>()) {
    outcome.failures.push_back("budget: max ulps " + std::to_string(outcome.comparison.max_ulps) + " > " +
                               std::to_string(entry["max_ulps"].get<std::uint64_t>()) + "; worst " +
                               outcome.comparison.worst.describe());
  }
  if (entry.contains("max_bound_ratio") &&
      outcome.comparison.max_bound_ratio > ratio_limit(entry["max_bound_ratio"])) {
    outcome.failures.push_back("budget: bound ratio " + std::to_string(outcome.comparison.max_bound_ratio) +
                               " > " + std::to_string(ratio_limit(entry["max_bound_ratio"])));
  }
}

void apply_baseline(CaseOutcome& outcome, const nlohmann::json& baseline) {
  const std::string id = outcome.gate_case.id();
  if (!baseline.contains("cases") || !baseline["cases"].contains(id)) return;
  const auto& entry = baseline["cases"][id];
  const auto previous_ulps = entry.value("max_ulps", std::uint64_t{0});
  const double previous_ratio =
      entry.contains("max_bound_ratio") ? ratio_limit(entry["max_bound_ratio"]) : 0.0;
  if (outcome.comparison.max_ulps > previous_ulps) {
    outcome.failures.push_back("baseline regression: max ulps grew from " + std::to_string(previous_ulps) +
                               " to " + std::to_string(outcome.comparison.max_ulps) + "; worst " +
                               outcome.comparison.worst.describe());
  }
  if (outcome.comparison.max_bound_ratio > previous_ratio) {
    outcome.failures.push_back("baseline regression: bound ratio grew from " +
                               std::to_string(previous_ratio) + " to " +
                               std::to_string(outcome.comparison.max_bound_ratio));
  }
}

nlohmann::json baseline_of(const std::vector<nlohmann::json>& cases) {
  nlohmann::json baseline{{"cases", nlohmann::json::object()}};
  for (const auto& c : cases) {
    baseline["cases"][c.at("id").get<std::string>()] = {{"max_ulps", c.at("max_ulps")},
                                                        {"max_bound_ratio", c.at("max_bound_ratio")}};
  }
  return baseline;
}

nlohmann::json report_json(const ReportHeader& header, const std::vector<nlohmann::json>& cases) {
  return {{"seed", header.seed},
          {"shard", std::to_string(header.shard_index) + "/" + std::to_string(header.shard_count)},
          {"explicit_kernels", header.explicit_kernels},
          {"cases", cases}};
}

namespace {

std::string conflict_text(const std::string& id, const std::string& status, std::size_t report,
                          const std::string& earlier) {
  return "holds '" + id + "' as " + status + " where report " + std::to_string(report + 1) + " holds it as " +
         earlier + ": merge the reports of one run";
}

}  // namespace

MergedReport merge_reports(const std::vector<nlohmann::json>& reports) {
  if (reports.empty()) throw InputError(InputProblem::empty_input, "merge: no reports given");
  MergedReport merged;
  std::vector<nlohmann::json> cases;
  struct Given {
    std::string id, status;
    std::size_t report;
  };
  std::map<std::size_t, Given> id_at;  // each sweep position's case, from the report that gave it
  std::set<std::size_t> shards;
  std::size_t shard_count = 0;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto& report = reports[r];
    const std::string where = "merge: report " + std::to_string(r + 1);
    if (!report.is_object() || !report.contains("cases") || !report["cases"].is_array() ||
        !report.contains("seed")) {
      malformed(where, "has no 'cases' array or 'seed'");
    }
    if (!report["seed"].is_number_unsigned())
      malformed(where, "has the seed " + report["seed"].dump() + ", not a non-negative integer");
    if (report["seed"] != reports.front()["seed"])
      malformed(where, "comes from a different seed than report 1");
    const auto [index, count] = shard_of(report);
    if (shard_count != 0 && count != shard_count) malformed(where, "is a shard of a sweep cut another way");
    shard_count = count;
    shards.insert(index);
    for (const auto& c : report["cases"]) {
      check_case_record(c, where);
      const auto position = c["index"].get<std::size_t>();
      const auto id = c["id"].get<std::string>();
      if (const auto given = id_at.find(position); given != id_at.end()) {
        // The same case twice (a shard given twice) is dropped; another case at the same position
        // means the reports come from different sweeps (other kernels or sizes): refused, since
        // keeping either would silently drop the other's verdicts.
        if (given->second.id != id)
          malformed(where, "holds '" + id + "' at sweep position " + std::to_string(position) +
                               " where another "
                               "report holds '" +
                               given->second.id + "': not shards of one sweep (other kernels or sizes)");
        // The same case with another verdict (a shard rerun after a fix, a flaky plugin): keeping
        // either by the order given would decide the merged verdict by the command line.
        const std::string status = c["status"].get<std::string>();
        if (given->second.status != status)
          malformed(where, conflict_text(id, status, given->second.report, given->second.status));
        ++merged.duplicates_dropped;
        continue;
      }
      id_at.emplace(position, Given{.id = id, .status = c["status"].get<std::string>(), .report = r});
      cases.push_back(c);
    }
  }
  if (cases.empty()) throw InputError(InputProblem::empty_input, "merge: the reports hold no case");
  std::sort(cases.begin(), cases.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["index"].get<std::size_t>() < b["index"].get<std::size_t>();
  });
  merged.whole_sweep = shards.size() == shard_count;
  merged.report = report_json({.seed = reports.front()["seed"].get<std::uint64_t>(),
                               .shard_index = 0,
                               .shard_count = 1,
                               .explicit_kernels = reports.front().value("explicit_kernels", false)},
                              cases);
  return merged;
}

namespace {

void write_case_xml(std::ostringstream& xml, const nlohmann::json& c, const std::string& kernel,
                    JudgingScope scope) {
  xml << "    <testcase classname=\"sharpcheck." << xml_escape(kernel) << "\" name=\""
      << xml_escape(c["id"].get<std::string>()) << "\" time=\"" << c["seconds"].get<double>() << "\">\n";
  if (c["status"] == "inconclusive") {
    xml << "      <skipped message=\"inconclusive: under 1% of the expected values can discriminate (0, 1 or "
           "at the format's floor, or with an allowance reaching |expected|)\"/>\n";
  } else if (is_failure_status(c["status"].get<std::string>())) {
    std::string message;
    for (const auto& failure : c["failures"]) message += failure.get<std::string>() + "\n";
    const std::string detail = "seed " + std::to_string(c["seed"].get<std::uint64_t>()) +
                               "; rerun: " + c["rerun"].get<std::string>();
    if (is_expected_failure(c, scope)) {
      xml << "      <skipped message=\"expected failure (deliberately broken kernel)\"/>\n";
    } else {
      xml << "      <failure message=\"" << xml_escape(message) << "\">" << xml_escape(detail)
          << "</failure>\n";
    }
  }
  if (c.contains("console") && c["console"].is_string()) {
    xml << "      <system-out>" << xml_escape(c["console"].get<std::string>()) << "</system-out>\n";
  }
  xml << "    </testcase>\n";
}

}  // namespace

std::string junit_xml(const std::vector<nlohmann::json>& cases, JudgingScope scope) {
  const SweepVerdict sweep = judge_sweep(cases, scope);
  std::map<std::string, std::vector<const nlohmann::json*>> by_kernel;
  for (const auto& c : cases) by_kernel[c["kernel"].get<std::string>()].push_back(&c);
  std::map<std::string, Verdict> verdicts;
  for (const auto& k : sweep.kernels) verdicts[k.kernel] = k.verdict;
  std::ostringstream xml;
  xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"sharpcheck gate\">\n";
  for (const auto& [kernel, list] : by_kernel) {
    const bool unexpected_pass = verdicts[kernel] == Verdict::unexpected_pass;
    std::size_t failures = unexpected_pass ? 1 : 0;
    std::size_t skipped = 0;
    for (const auto* c : list) {
      const std::string status = (*c)["status"].get<std::string>();
      if (status == "inconclusive") ++skipped;
      if (is_failure_status(status)) ++(is_expected_failure(*c, scope) ? skipped : failures);
    }
    xml << "  <testsuite name=\"sharpcheck." << xml_escape(kernel) << "\" tests=\""
        << list.size() + (unexpected_pass ? 1 : 0) << "\" failures=\"" << failures << "\" skipped=\""
        << skipped << "\">\n";
    for (const auto* c : list) write_case_xml(xml, *c, kernel, scope);
    if (unexpected_pass) {
      xml << "    <testcase classname=\"sharpcheck." << xml_escape(kernel) << "\" name=\""
          << xml_escape(kernel)
          << "/expected_failure\" time=\"0\">\n      <failure message=\"UNEXPECTED PASS: a deliberately "
             "broken "
          << "kernel passed every case of the sweep\"/>\n    </testcase>\n";
    }
    xml << "  </testsuite>\n";
  }
  xml << "</testsuites>\n";
  return xml.str();
}

nlohmann::json read_json_file(const std::string& path, const char* what) {
  // Only a regular file (or a link to one): a directory made reading throw an internal error, and a
  // FIFO with no writer blocked merge forever.
  std::error_code error_code;
  if (!std::filesystem::is_regular_file(path, error_code) && std::filesystem::exists(path, error_code))
    throw InputError(InputProblem::out_of_range, std::string(what) + " file '" + path +
                                                     "' is not a regular file (a directory, FIFO or device)");
  std::ifstream in(path);
  if (!in)
    throw InputError(InputProblem::out_of_range, std::string(what) + " file '" + path + "' cannot be read");
  // Reports, budgets and baselines nest a few levels: past 64 a file is hostile (100,000 levels
  // once crashed merge, and copying one grew with the square of its depth), refused while parsing.
  constexpr int deepest = 64;
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > deepest)
      throw InputError(InputProblem::out_of_range, std::string(what) + " file '" + path +
                                                       "' nests deeper than " + std::to_string(deepest) +
                                                       " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(in, limit_depth);
  } catch (const nlohmann::json::exception& error) {
    throw InputError(InputProblem::out_of_range,
                     std::string(what) + " file '" + path + "' is not valid JSON: " + error.what());
  }
}

}  // namespace sharpcheck::gate
