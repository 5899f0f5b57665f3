#include "cli/gate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "inputs/rows.hpp"
#include "io/npy.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"

namespace sharpcheck::cli {
namespace {

constexpr const char* attention_input = "attention_normal";
constexpr std::size_t attention_queries = 4;
constexpr std::size_t attention_dimension = 64;

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

Matrix one_row(const std::vector<double>& row) {
  Matrix matrix(1, row.size());
  std::copy(row.begin(), row.end(), matrix.values.begin());
  return matrix;
}

Matrix normal_matrix(std::size_t rows, std::size_t cols, DeterministicRandom& random, const FloatFormat& format) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = round_to_format(random.normal(0, 1), format);
  return matrix;
}

std::string xml_escape(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

}  // namespace

std::vector<GateCase> plan_cases(const GateSettings& settings) {
  std::vector<std::size_t> sizes = settings.sizes;
  if (sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) sizes.push_back(n);
  }
  const auto wanted = [&](std::string_view name) {
    for (const auto& kernel : settings.kernels) {
      if (kernel == "all" || kernel == name) return true;
    }
    return false;
  };
  for (const auto& name : settings.kernels) {
    if (name != "all" && name != "none" && kernels::find_softmax_kernel(name) == nullptr && kernels::find_attention_kernel(name) == nullptr) {
      throw InputError(InputProblem::out_of_range, "gate: no built-in kernel named '" + name +
                                                       "' (sharpcheck gate --list shows them)");
    }
  }
  std::vector<GateCase> cases;
  for (const auto& kernel : kernels::softmax_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : sizes) {
        cases.push_back({.kernel = std::string(kernel.name),
                         .input = std::string(inputs::row_kind_name(kind)),
                         .n = n,
                         .base_seed = settings.seed,
                         .deliberately_broken = kernel.deliberately_broken,
                         .plugin_format = nullptr,
                         .plugin_path = {}});
      }
    }
  }
  for (const auto& kernel : kernels::attention_kernels()) {
    if (!wanted(kernel.name)) continue;
    for (const std::size_t n : sizes) {
      cases.push_back({.kernel = std::string(kernel.name),
                       .input = attention_input,
                       .n = n,
                       .base_seed = settings.seed,
                       .deliberately_broken = kernel.deliberately_broken,
                       .plugin_format = nullptr,
                       .plugin_path = {}});
    }
  }
  if (settings.plugin) {
    for (const FloatFormat* format : settings.plugin->softmax_formats()) {
      for (const inputs::RowKind kind : inputs::all_row_kinds) {
        for (const std::size_t n : sizes) {
          cases.push_back({.kernel = "plugin:" + settings.plugin->name() + ":" + std::string(format->name),
                           .input = std::string(inputs::row_kind_name(kind)),
                           .n = n,
                           .base_seed = settings.seed,
                           .deliberately_broken = false,
                           .plugin_format = format,
                           .plugin_path = settings.plugin->path()});
        }
      }
    }
  }
  if (settings.plugin) {
    for (const FloatFormat* format : settings.plugin->attention_formats()) {
      for (const std::size_t n : sizes) {
        cases.push_back({.kernel = "plugin:" + settings.plugin->name() + ":attention_" + std::string(format->name),
                         .input = attention_input,
                         .n = n,
                         .base_seed = settings.seed,
                         .deliberately_broken = false,
                         .plugin_format = format,
                         .plugin_path = settings.plugin->path()});
      }
    }
  }
  std::vector<GateCase> selected;
  for (std::size_t index = 0; index < cases.size(); ++index) {
    GateCase& gate_case = cases[index];
    gate_case.seed = settings.seed ^ fnv1a(gate_case.id());
    gate_case.index = index;
    if (!settings.only_case.empty() && gate_case.id() != settings.only_case) continue;
    if (index % settings.shard_count != settings.shard_index) continue;
    selected.push_back(gate_case);
  }
  if (!settings.only_case.empty() && selected.empty()) {
    throw InputError(InputProblem::out_of_range, "gate: no case with id '" + settings.only_case + "' in this sweep");
  }
  return selected;
}

namespace {
std::string file_name_of(const std::string& id) {
  std::string name = id;
  for (char& c : name) {
    if (c == '/' || c == ':' || c == '=') c = '_';
  }
  return name;
}

// Saves a crashed case's input next to the others, as the plugin saw it (bf16 as bit patterns).
std::string save_reproducer(const GateSettings& settings, const std::string& name, const Matrix& input,
                            const FloatFormat& format) {
  std::filesystem::create_directories(settings.reproducer_directory);
  std::string path = settings.reproducer_directory + "/" + name + ".npy";
  std::vector<double> stored = input.values;
  io::NpyType type = io::NpyType::float32;
  if (format == bf16) {
    type = io::NpyType::uint16;
    for (double& x : stored) x = static_cast<double>(encode(x, bf16));
  } else if (format == fp16) {
    type = io::NpyType::float16;
  }
  io::write_npy(path, type, {input.rows, input.cols}, stored);
  return path;
}

// A plugin's case: run in a child process; a crash or hang is recorded with a reproducer.
void run_plugin_case(const GateCase& gate_case, const GateSettings& settings, CaseOutcome& outcome) {
  const FloatFormat& format = *gate_case.plugin_format;
  outcome.format = std::string(format.name);
  const std::string base_name = file_name_of(gate_case.id());
  if (gate_case.input == attention_input) {
    DeterministicRandom random(gate_case.seed);
    const Matrix q = normal_matrix(attention_queries, attention_dimension, random, format);
    const Matrix k = normal_matrix(gate_case.n, attention_dimension, random, format);
    const Matrix v = normal_matrix(gate_case.n, attention_dimension, random, format);
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(attention_dimension)));
    const kernels::PluginRun run =
        settings.plugin->run_attention(format, q, k, v, scale, false, settings.plugin_timeout_seconds);
    if (run.status != kernels::PluginRun::Status::ok) {
      outcome.crashed = true;
      outcome.reproducer = save_reproducer(settings, base_name + "_q", q, format);
      (void)save_reproducer(settings, base_name + "_k", k, format);
      (void)save_reproducer(settings, base_name + "_v", v, format);
      outcome.failures.push_back(std::string("plugin ") + kernels::plugin_status_name(run.status) + ": " + run.detail +
                                 "; inputs saved to " + outcome.reproducer + " and its _k, _v siblings");
      return;
    }
    const kernels::AttentionKernel description{gate_case.kernel, "plugin", &format, &format, &fp32, false, nullptr};
    const auto evaluation = metrics::judge_attention(description, metrics::tolerance_for("attention_flash"), q, k, v,
                                                     false, 1.0, run.out);
    outcome.comparison = evaluation.comparison;
    outcome.reference_statistics = evaluation.reference_statistics;
    return;
  }
  const auto kind = inputs::find_row_kind(gate_case.input).value();
  const Matrix logits = one_row(inputs::make_row(kind, gate_case.n, format, gate_case.seed));
  const kernels::PluginRun run =
      settings.plugin->run_softmax(format, logits, 1.0F, settings.plugin_timeout_seconds);
  if (run.status != kernels::PluginRun::Status::ok) {
    outcome.crashed = true;
    outcome.reproducer = save_reproducer(settings, base_name, logits, format);
    outcome.failures.push_back(std::string("plugin ") + kernels::plugin_status_name(run.status) + ": " + run.detail +
                               "; input saved to " + outcome.reproducer);
    return;
  }
  const kernels::SoftmaxKernel description{gate_case.kernel, "plugin", kernels::Operation::softmax, &format, &format,
                                           &fp32, false, nullptr};
  const auto evaluation =
      metrics::judge_softmax(description, metrics::tolerance_for("plugin_softmax"), logits, 1.0, run.out);
  outcome.comparison = evaluation.comparison;
  outcome.reference_statistics = evaluation.reference_statistics;
}
}  // namespace

CaseOutcome run_case(const GateCase& gate_case, const GateSettings& settings) {
  const auto start = std::chrono::steady_clock::now();
  CaseOutcome outcome;
  outcome.gate_case = gate_case;
  if (gate_case.plugin_format != nullptr) {
    run_plugin_case(gate_case, settings, outcome);
  } else if (const auto* kernel = kernels::find_softmax_kernel(gate_case.kernel)) {
    outcome.format = std::string(kernel->output->name);
    const auto kind = inputs::find_row_kind(gate_case.input).value();
    const auto row = inputs::make_row(kind, gate_case.n, *kernel->input, gate_case.seed);
    const auto evaluation = metrics::evaluate_softmax(*kernel, one_row(row), 1.0);
    outcome.comparison = evaluation.comparison;
    outcome.reference_statistics = evaluation.reference_statistics;
  } else {
    const auto* attention = kernels::find_attention_kernel(gate_case.kernel);
    outcome.format = std::string(attention->output->name);
    DeterministicRandom random(gate_case.seed);
    const Matrix q = normal_matrix(attention_queries, attention_dimension, random, *attention->input);
    const Matrix k = normal_matrix(gate_case.n, attention_dimension, random, *attention->input);
    const Matrix v = normal_matrix(gate_case.n, attention_dimension, random, *attention->input);
    const auto evaluation = metrics::evaluate_attention(*attention, q, k, v, false);
    outcome.comparison = evaluation.comparison;
    outcome.reference_statistics = evaluation.reference_statistics;
  }
  if (!outcome.crashed && !outcome.comparison.passed()) {
    outcome.failures.push_back("tolerance table: " + std::to_string(outcome.comparison.violation_count) +
                               " violations; worst " + outcome.comparison.worst.describe());
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

void apply_budget(CaseOutcome& outcome, const nlohmann::json& budget) {
  if (!budget.contains("kernels") || !budget["kernels"].contains(outcome.gate_case.kernel)) return;
  const auto& entry = budget["kernels"][outcome.gate_case.kernel];
  if (entry.contains("max_ulps") && outcome.comparison.max_ulps > entry["max_ulps"].get<std::uint64_t>()) {
    outcome.failures.push_back("budget: max ulps " + std::to_string(outcome.comparison.max_ulps) + " > " +
                               std::to_string(entry["max_ulps"].get<std::uint64_t>()) + "; worst " +
                               outcome.comparison.worst.describe());
  }
  if (entry.contains("max_bound_ratio") && outcome.comparison.max_bound_ratio > entry["max_bound_ratio"].get<double>()) {
    outcome.failures.push_back("budget: bound ratio " + std::to_string(outcome.comparison.max_bound_ratio) + " > " +
                               std::to_string(entry["max_bound_ratio"].get<double>()));
  }
}

void apply_baseline(CaseOutcome& outcome, const nlohmann::json& baseline) {
  const std::string id = outcome.gate_case.id();
  if (!baseline.contains("cases") || !baseline["cases"].contains(id)) return;
  const auto& entry = baseline["cases"][id];
  const auto previous_ulps = entry.value("max_ulps", std::uint64_t{0});
  const double previous_ratio = entry.value("max_bound_ratio", 0.0);
  if (outcome.comparison.max_ulps > previous_ulps) {
    outcome.failures.push_back("baseline regression: max ulps grew from " + std::to_string(previous_ulps) + " to " +
                               std::to_string(outcome.comparison.max_ulps) + "; worst " +
                               outcome.comparison.worst.describe());
  }
  if (outcome.comparison.max_bound_ratio > previous_ratio) {
    outcome.failures.push_back("baseline regression: bound ratio grew from " + std::to_string(previous_ratio) +
                               " to " + std::to_string(outcome.comparison.max_bound_ratio));
  }
}

nlohmann::json to_json(const CaseOutcome& outcome) {
  const auto& c = outcome.comparison;
  const auto finite_or_string = [](double x) -> nlohmann::json {
    if (std::isfinite(x)) return x;
    return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  };
  const auto& gate_case = outcome.gate_case;
  return {{"id", gate_case.id()},
          {"kernel", gate_case.kernel},
          {"input", gate_case.input},
          {"n", gate_case.n},
          {"index", gate_case.index},
          {"seed", gate_case.seed},
          {"format", outcome.format},
          {"deliberately_broken", gate_case.deliberately_broken},
          {"status", outcome.crashed ? "crash" : (outcome.passed() ? "pass" : "fail")},
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
          {"worst",
           {{"row", c.worst.row},
            {"index", c.worst.index},
            {"expected", hex_float(c.worst.expected)},
            {"actual", hex_float(c.worst.actual)},
            {"ulps", c.worst.ulps ? nlohmann::json(*c.worst.ulps) : nlohmann::json(nullptr)},
            {"allowed", c.worst.allowed}}},
          {"rerun", "sharpcheck gate " +
                        (gate_case.plugin_path.empty() ? "--kernel " + gate_case.kernel
                                                       : "--plugin " + gate_case.plugin_path) +
                        " --case " + gate_case.id() + " --seed " + std::to_string(gate_case.base_seed)}};
}

nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports) {
  if (reports.empty()) throw InputError(InputProblem::empty_input, "merge: no reports given");
  std::vector<nlohmann::json> cases;
  for (const auto& report : reports) {
    if (!report.contains("cases") || !report["cases"].is_array() || !report.contains("seed")) {
      throw InputError(InputProblem::out_of_range, "merge: a report has no 'cases' array or 'seed'");
    }
    if (report["seed"] != reports.front()["seed"]) {
      throw InputError(InputProblem::out_of_range, "merge: the reports come from different seeds");
    }
    for (const auto& c : report["cases"]) cases.push_back(c);
  }
  std::sort(cases.begin(), cases.end(),
            [](const nlohmann::json& a, const nlohmann::json& b) { return a["index"] < b["index"]; });
  return {{"seed", reports.front()["seed"]},
          {"shard", "0/1"},
          {"explicit_kernels", reports.front().value("explicit_kernels", false)},
          {"cases", cases}};
}

nlohmann::json baseline_of(const std::vector<nlohmann::json>& cases) {
  nlohmann::json baseline{{"cases", nlohmann::json::object()}};
  for (const auto& c : cases) {
    baseline["cases"][c["id"].get<std::string>()] = {{"max_ulps", c["max_ulps"]},
                                                     {"max_bound_ratio", c["max_bound_ratio"]}};
  }
  return baseline;
}

Verdict verdict_of(const nlohmann::json& case_json, bool explicit_kernels) {
  const bool passed = case_json["status"] == "pass";
  if (case_json["status"] == "crash") return Verdict::fail;
  if (!case_json["deliberately_broken"].get<bool>() || explicit_kernels) return passed ? Verdict::pass : Verdict::fail;
  return passed ? Verdict::unexpected_pass : Verdict::expected_failure;
}

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::pass: return "pass";
    case Verdict::fail: return "FAIL";
    case Verdict::expected_failure: return "expected failure";
    case Verdict::unexpected_pass: return "UNEXPECTED PASS";
  }
  return "?";
}

std::string junit_xml(const std::vector<nlohmann::json>& cases) {
  // One <testsuite> per kernel, one <testcase> per case. A broken kernel's expected failures are
  // <skipped> with the reason, so CI shows them without failing.
  std::map<std::string, std::vector<const nlohmann::json*>> by_kernel;
  for (const auto& c : cases) by_kernel[c["kernel"].get<std::string>()].push_back(&c);
  std::ostringstream xml;
  xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"sharpcheck gate\">\n";
  for (const auto& [kernel, list] : by_kernel) {
    std::size_t failures = 0;
    std::size_t skipped = 0;
    for (const auto* c : list) {
      if ((*c)["status"] != "pass") ++((*c)["deliberately_broken"].get<bool>() ? skipped : failures);
    }
    xml << "  <testsuite name=\"sharpcheck." << xml_escape(kernel) << "\" tests=\"" << list.size() << "\" failures=\""
        << failures << "\" skipped=\"" << skipped << "\">\n";
    for (const auto* c : list) {
      xml << "    <testcase classname=\"sharpcheck." << xml_escape(kernel) << "\" name=\""
          << xml_escape((*c)["id"].get<std::string>()) << "\" time=\"" << (*c)["seconds"].get<double>() << "\">\n";
      if ((*c)["status"] != "pass") {
        std::string message;
        for (const auto& failure : (*c)["failures"]) message += failure.get<std::string>() + "\n";
        const std::string detail = "seed " + std::to_string((*c)["seed"].get<std::uint64_t>()) + "; rerun: " +
                                   (*c)["rerun"].get<std::string>();
        if ((*c)["deliberately_broken"].get<bool>()) {
          xml << "      <skipped message=\"expected failure (deliberately broken kernel)\"/>\n";
        } else {
          xml << "      <failure message=\"" << xml_escape(message) << "\">" << xml_escape(detail) << "</failure>\n";
        }
      }
      xml << "    </testcase>\n";
    }
    xml << "  </testsuite>\n";
  }
  xml << "</testsuites>\n";
  return xml.str();
}

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw InputError(InputProblem::out_of_range, std::string(what) + " file '" + path + "' cannot be read");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw InputError(InputProblem::out_of_range,
                     std::string(what) + " file '" + path + "' is not valid JSON: " + error.what());
  }
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream out(temporary, std::ios::trunc);
    if (!out) throw InputError(InputProblem::out_of_range, "cannot write " + temporary);
    out << text;
    if (!out.flush()) throw InputError(InputProblem::out_of_range, "cannot write " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace sharpcheck::cli
