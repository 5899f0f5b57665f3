// sharpcheck compare: judges outputs produced elsewhere (a GPU kernel, PyTorch, JAX) from NumPy
// files, with the same metrics, reports and exit codes as the gate.
#include <cstdio>
#include <filesystem>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "core/text.hpp"
#include "gate/report.hpp"
#include "io/atomic_file.hpp"
#include "io/npy.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "reference/attention.hpp"

namespace sharpcheck::cli {
namespace {

struct CompareSettings {
  std::string logits, probabilities, q, k, v, out;
  std::string format = "fp32";
  std::string tolerance_entry;
  double theta = 1.0;
  bool causal = false;
  std::string json_path, junit_path, budget_path, baseline_path;
  std::string name;  // --name: the kernel's name in reports, budgets and baselines
  bool update_baseline = false;
};

// A matrix of values of `format`: bf16 may come as uint16 bit patterns; anything else must hold
// values of the format already.
// An array with no element cannot be judged: refused, never a vacuous pass.
void require_elements(std::size_t rows, std::size_t cols, const std::string& path) {
  if (rows * cols == 0) {
    throw InputError(InputProblem::empty_input, "compare: " + path + " holds no element (shape " +
                                                    std::to_string(rows) + "x" + std::to_string(cols) + ")");
  }
}

// Rows of a file as exact values: bf16 may come as uint16 bit patterns.
Matrix exact_rows(const io::NpyFile& file, std::size_t first, std::size_t count) {
  Matrix matrix = file.read_rows(first, count);
  if (file.layout().type == io::NpyType::uint16) {
    for (double& x : matrix.values) x = decode(static_cast<std::uint64_t>(x), bf16);  // bf16 bits
  }
  return matrix;
}

// Rows of a kernel's outputs, which must be values of `format` (bf16 may come as uint16 bits).
Matrix rows_in_format(const io::NpyFile& file, const std::string& path, std::size_t first, std::size_t count,
                      const FloatFormat& format) {
  if (file.layout().type == io::NpyType::uint16 && !(format == bf16)) {
    throw InputError(InputProblem::out_of_range, path + ": uint16 data is read as bf16 bits only");
  }
  Matrix matrix = exact_rows(file, first, count);
  for (std::size_t i = 0; i < matrix.values.size(); ++i) {
    if (!is_representable(matrix.values[i], format)) {
      throw InputError(InputProblem::out_of_range,
                       path + ": element " + std::to_string(first * file.cols() + i) + " (" +
                           hex_float(matrix.values[i]) + ") is not a " + std::string(format.name) + " value");
    }
  }
  return matrix;
}

Matrix exact_values(const std::string& path) {
  const io::NpyFile file(path);
  require_elements(file.rows(), file.cols(), path);
  return exact_rows(file, 0, file.rows());
}

Matrix values_in_format(const std::string& path, const FloatFormat& format) {
  const io::NpyFile file(path);
  require_elements(file.rows(), file.cols(), path);
  return rows_in_format(file, path, 0, file.rows(), format);
}

// Softmax outputs judged a block of rows at a time (about 4 M elements), so memory stays at the
// blocks' size whatever the files' size; the blocks' comparisons are folded into one.
metrics::Comparison judge_softmax_files(const CompareSettings& settings, const FloatFormat& format,
                                        const metrics::JudgeSpec& spec) {
  const io::NpyFile logits(settings.logits);
  const io::NpyFile probabilities(settings.probabilities);
  require_elements(logits.rows(), logits.cols(), settings.logits);
  if (logits.rows() != probabilities.rows() || logits.cols() != probabilities.cols()) {
    throw InputError(InputProblem::shape_mismatch,
                     "compare: --probs does not match --logits: " + std::to_string(logits.rows()) + "x" +
                         std::to_string(logits.cols()) + " against " + std::to_string(probabilities.rows()) +
                         "x" + std::to_string(probabilities.cols()));
  }
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{1} << 22) / logits.cols());
  metrics::Comparison total;
  for (std::size_t first = 0; first < logits.rows(); first += block) {
    const std::size_t count = std::min(block, logits.rows() - first);
    Matrix actual = rows_in_format(probabilities, settings.probabilities, first, count, format);
    const Matrix logit_rows = exact_rows(logits, first, count);
    total.merge(
        metrics::judge_softmax(spec, logit_rows, settings.theta, std::move(actual), first).comparison);
  }
  return total;
}

// The command that reruns this comparison (what a report's "rerun" says).
std::string rerun_command(const CompareSettings& s) {
  std::string command = "sharpcheck compare";
  const auto add = [&](const char* option, const std::string& value) {
    if (!value.empty()) command += std::string(" ") + option + " " + value;
  };
  add("--logits", s.logits);
  add("--probs", s.probabilities);
  add("--q", s.q);
  add("--k", s.k);
  add("--v", s.v);
  add("--out", s.out);
  add("--format", s.format);
  add("--theta", hex_float(s.theta));
  if (s.causal) command += " --causal";
  add("--tolerance-of", s.tolerance_entry);
  add("--budget", s.budget_path);
  add("--baseline", s.baseline_path);
  add("--name", s.name);
  return command;
}

const FloatFormat& output_format(const std::string& name) {
  const auto lookup = find_float_format(name);
  if (!lookup || !(**lookup == fp32 || **lookup == bf16 || **lookup == fp16 || **lookup == fp64)) {
    throw InputError(InputProblem::unsupported_format,
                     "compare: --format must be fp64, fp32, bf16 or fp16, got '" + name + "'");
  }
  return **lookup;
}

// Softmax outputs from files, judged under the named tolerance entry (plugin_softmax by default).
void judge_softmax_outputs(const CompareSettings& settings, const FloatFormat& format,
                           gate::CaseOutcome& outcome) {
  if (settings.probabilities.empty())
    throw InputError(InputProblem::out_of_range, "compare: --probs is required");
  outcome.gate_case.kernel =
      settings.name.empty() ? "compare:" + std::filesystem::path(settings.probabilities).filename().string()
                            : settings.name;
  const auto& tolerance =
      metrics::tolerance_for(settings.tolerance_entry.empty() ? "plugin_softmax" : settings.tolerance_entry);
  outcome.comparison =
      judge_softmax_files(settings, format, {kernels::Operation::softmax, &format, &tolerance});
  outcome.gate_case.n =
      outcome.comparison.rows == 0 ? 0 : outcome.comparison.elements / outcome.comparison.rows;
}

// Attention outputs from files, judged under the named entry (attention_flash by default).
void judge_attention_outputs(const CompareSettings& settings, const FloatFormat& format,
                             gate::CaseOutcome& outcome) {
  if (settings.k.empty() || settings.v.empty() || settings.out.empty()) {
    throw InputError(InputProblem::out_of_range, "compare: attention needs --q, --k, --v and --out");
  }
  const Matrix q = exact_values(settings.q);
  const Matrix k = exact_values(settings.k);
  const Matrix v = exact_values(settings.v);
  const Matrix out = values_in_format(settings.out, format);
  outcome.gate_case.kernel = settings.name.empty()
                                 ? "compare:" + std::filesystem::path(settings.out).filename().string()
                                 : settings.name;
  outcome.gate_case.n = k.rows;
  if (out.rows != q.rows || out.cols != v.cols) {
    throw InputError(InputProblem::shape_mismatch, "compare: --out is " + std::to_string(out.rows) + "x" +
                                                       std::to_string(out.cols) + ", expected " +
                                                       std::to_string(q.rows) + "x" + std::to_string(v.cols));
  }
  const auto& tolerance =
      metrics::tolerance_for(settings.tolerance_entry.empty() ? "attention_flash" : settings.tolerance_entry);
  tensor::HeadScores scores;
  scores.theta = settings.theta;
  scores.causal = settings.causal;
  outcome.comparison =
      metrics::judge_attention({kernels::Operation::attention, &format, &tolerance}, q, k, v, scores, out)
          .comparison;
}

void print_outcome(const gate::CaseOutcome& outcome) {
  const auto& c = outcome.comparison;
  std::printf(
      "%s: %zu elements in %s, max %llu ulp, mean %.3g ulp, bound ratio %.3g, max |sum - 1| %.3g, %zu false "
      "zeros, %zu non-finite\n",
      outcome.gate_case.kernel.c_str(), c.elements, outcome.format.c_str(),
      static_cast<unsigned long long>(c.max_ulps), c.mean_ulps, c.max_bound_ratio, c.max_sum_error,
      c.false_zeros, c.non_finite);
  std::printf("worst: %s\n", c.worst.describe().c_str());
  for (const auto& failure : outcome.failures) std::printf("FAIL %s\n", failure.c_str());
  std::printf("%s\n", outcome.passed() ? "pass" : "FAIL");
}

int run_compare(const CompareSettings& settings) {
  if (settings.update_baseline && settings.baseline_path.empty()) {
    throw InputError(InputProblem::out_of_range, "compare: --update-baseline needs --baseline FILE");
  }
  const FloatFormat& format = output_format(settings.format);
  const bool attention = !settings.q.empty();
  if (attention == !settings.logits.empty()) {
    throw InputError(InputProblem::out_of_range,
                     "compare: give either --logits and --probs, or --q --k --v --out");
  }
  gate::CaseOutcome outcome;
  outcome.format = std::string(format.name);
  outcome.gate_case.input = "npy";
  if (attention) {
    judge_attention_outputs(settings, format, outcome);
  } else {
    judge_softmax_outputs(settings, format, outcome);
  }
  if (!outcome.comparison.passed()) {
    outcome.failures.push_back("tolerance table: " + std::to_string(outcome.comparison.violation_count) +
                               " violations; worst " + outcome.comparison.worst.describe());
  }
  if (!settings.budget_path.empty()) gate::apply_budget(outcome, gate::read_budget(settings.budget_path));
  if (!settings.baseline_path.empty() && !settings.update_baseline) {
    gate::apply_baseline(outcome, gate::read_baseline(settings.baseline_path));
  }
  print_outcome(outcome);
  nlohmann::json record = gate::to_json(outcome);
  record["rerun"] = to_valid_utf8(rerun_command(settings));
  const std::vector<nlohmann::json> cases{record};
  if (!settings.json_path.empty()) {
    io::write_file_atomically(settings.json_path, nlohmann::json{{"cases", cases}}.dump(1) + "\n");
  }
  if (!settings.junit_path.empty())
    io::write_file_atomically(settings.junit_path, gate::junit_xml(cases, {}));
  if (settings.update_baseline) {
    io::write_file_atomically(settings.baseline_path, gate::baseline_of(cases).dump(1) + "\n");
    std::printf("baseline written to %s\n", settings.baseline_path.c_str());
  }
  return outcome.passed() ? exit_pass : exit_failure;
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto settings = std::make_shared<CompareSettings>();
  auto* command = app.add_subcommand("compare", "Judge softmax or attention outputs saved as .npy files");
  command->add_option("--logits", settings->logits, "Logits (.npy, 1-D or 2-D; bf16 as uint16 bits)");
  command->add_option("--probs", settings->probabilities, "The kernel's probabilities, same shape");
  command->add_option("--q", settings->q, "Attention queries (m x d)");
  command->add_option("--k", settings->k, "Attention keys (n x d)");
  command->add_option("--v", settings->v, "Attention values (n x dv)");
  command->add_option("--out", settings->out, "The kernel's attention output (m x dv)");
  command->add_flag("--causal", settings->causal, "Top-left causal mask");
  command->add_option("--format", settings->format, "The outputs' format: fp32, bf16, fp16 or fp64");
  add_real_option(command, "--theta", settings->theta, "Temperature");
  command->add_option("--tolerance-of", settings->tolerance_entry,
                      "Judge by this kernel's tolerance-table entry");
  command->add_option("--budget", settings->budget_path, "JSON budget (see gate)");
  command->add_option("--name", settings->name,
                      "The kernel's name in reports, budgets and baselines (default compare:<file name>)");
  command->add_option("--baseline", settings->baseline_path,
                      "JSON baseline from an earlier run: fail on any growth");
  command->add_flag("--update-baseline", settings->update_baseline,
                    "Write this comparison's figures to --baseline");
  command->add_option("--json", settings->json_path, "Write the report as JSON");
  command->add_option("--junit", settings->junit_path, "Write JUnit XML");
  return [command, settings]() -> int { return *command ? run_compare(*settings) : -1; };
}

}  // namespace sharpcheck::cli
