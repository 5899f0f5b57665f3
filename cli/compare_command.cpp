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
#include "metrics/judge_tensors.hpp"
#include "reference/attention.hpp"

namespace sharpcheck::cli {
namespace {

struct CompareSettings {
  std::string logits, probabilities, q, k, v, out;
  std::string format = "fp32";
  std::string tolerance_entry;
  double theta = 1.0;
  bool causal = false;
  // Attention problems (tensor/attention_problem.hpp): layout, lengths, masks and modifiers.
  std::string layout = "bhsd", align = "top-left", window, query_lengths, key_lengths, cu_q, cu_k;
  std::string sinks_path, alibi_path, lse_path, fully_masked = "zeros";
  std::vector<double> scale;  // empty: exactly 1/sqrt(d)
  double softcap = 0;
  bool lse_base2 = false;
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

// The scores every attention comparison shares: scale, temperature, causal alignment, window,
// soft-cap and the fully masked rule, from the options.
tensor::HeadScores scores_from(const CompareSettings& settings) {
  tensor::HeadScores scores;
  if (!settings.scale.empty()) scores.scale = settings.scale.front();
  scores.theta = settings.theta;
  scores.causal = settings.causal;
  if (settings.align != "top-left" && settings.align != "bottom-right") {
    throw InputError(InputProblem::out_of_range, "compare: --align must be top-left or bottom-right");
  }
  if (settings.align == "bottom-right") scores.alignment = tensor::DiagonalAlignment::bottom_right;
  if (!settings.window.empty()) {  // "L,R" with -1 for unbounded, as FlashAttention's window_size
    const auto comma = settings.window.find(',');
    if (comma == std::string::npos)
      throw InputError(InputProblem::out_of_range, "compare: --window takes L,R");
    const auto side = [&](const std::string& text) -> std::optional<std::size_t> {
      if (text == "-1") return std::nullopt;
      return parse_count(text, "--window", 0);
    };
    scores.window_left = side(settings.window.substr(0, comma));
    scores.window_right = side(settings.window.substr(comma + 1));
  }
  scores.softcap = settings.softcap;
  if (settings.fully_masked != "zeros" && settings.fully_masked != "error") {
    throw InputError(InputProblem::out_of_range, "compare: --fully-masked must be zeros or error");
  }
  if (settings.fully_masked == "error") scores.fully_masked = tensor::FullyMaskedRows::error;
  return scores;
}

// An N-D .npy array as exact doubles (bf16 may come as uint16 bit patterns).
io::NpyArray exact_array(const std::string& path) {
  io::NpyArray array = io::read_npy(path);
  if (array.element_count() == 0)
    throw InputError(InputProblem::empty_input, "compare: " + path + " holds no element");
  if (array.type == io::NpyType::uint16) {
    for (double& x : array.values) x = decode(static_cast<std::uint64_t>(x), bf16);
  }
  return array;
}

// The problem the tensors' shapes describe: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd), or
// [total, H, D] (packed, with --cu-seqlens-q/k); KV heads from K's shape.
tensor::AttentionProblem problem_from(const CompareSettings& settings, const io::NpyArray& q,
                                      const io::NpyArray& k, const io::NpyArray& v) {
  tensor::AttentionProblem problem;
  problem.layout = tensor::parse_layout(settings.layout);
  const std::size_t dims = problem.layout == tensor::Layout::packed ? 3 : 4;
  for (const auto* array : {&q, &k, &v}) {
    if (array->shape.size() != dims) {
      throw InputError(InputProblem::shape_mismatch, "compare: layout " + settings.layout + " needs " +
                                                         std::to_string(dims) + "-D --q, --k and --v");
    }
  }
  const bool bshd = problem.layout == tensor::Layout::bshd;
  auto& shape = problem.shape;
  if (problem.layout == tensor::Layout::packed) {
    problem.cu_seqlens_q = parse_count_list(settings.cu_q, "--cu-seqlens-q", 0, q.shape[0]);
    problem.cu_seqlens_k = parse_count_list(settings.cu_k, "--cu-seqlens-k", 0, k.shape[0]);
    shape = {problem.cu_seqlens_q.empty() ? 0 : problem.cu_seqlens_q.size() - 1,
             q.shape[1],
             k.shape[1],
             0,
             0,
             q.shape[2],
             v.shape[2]};
  } else {
    shape = {q.shape[0],
             q.shape[bshd ? 2 : 1],
             k.shape[bshd ? 2 : 1],
             q.shape[bshd ? 1 : 2],
             k.shape[bshd ? 1 : 2],
             q.shape[3],
             v.shape[3]};
    problem.query_lengths = parse_count_list(settings.query_lengths, "--query-lengths", 0, shape.queries);
    problem.key_lengths = parse_count_list(settings.key_lengths, "--key-lengths", 0, shape.keys);
  }
  problem.scores = scores_from(settings);
  if (!settings.sinks_path.empty()) problem.sinks = exact_array(settings.sinks_path).values;
  if (!settings.alibi_path.empty()) problem.alibi_slopes = exact_array(settings.alibi_path).values;
  return problem;
}

// Attention tensors of a whole layer, judged per head (metrics/judge_tensors.hpp).
void judge_attention_tensors(const CompareSettings& settings, const FloatFormat& format,
                             const io::NpyArray& q, gate::CaseOutcome& outcome) {
  const io::NpyArray k = exact_array(settings.k), v = exact_array(settings.v);
  const tensor::AttentionProblem problem = problem_from(settings, q, k, v);
  io::NpyArray out = exact_array(settings.out);
  for (std::size_t i = 0; i < out.values.size(); ++i) {
    if (!is_representable(out.values[i], format)) {
      throw InputError(InputProblem::out_of_range, settings.out + ": element " + std::to_string(i) + " (" +
                                                       hex_float(out.values[i]) + ") is not a " +
                                                       std::string(format.name) + " value");
    }
  }
  std::vector<double> lse;
  if (!settings.lse_path.empty()) lse = exact_array(settings.lse_path).values;
  const auto& tolerance =
      metrics::tolerance_for(settings.tolerance_entry.empty() ? "attention_flash" : settings.tolerance_entry);
  metrics::JudgeSpec spec{kernels::Operation::attention, &format, &tolerance};
  spec.lse_base2 = settings.lse_base2;
  const metrics::TensorJudgement judgement =
      metrics::judge_attention_tensors(spec, problem, q.values, k.values, v.values, out.values, lse);
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  outcome.gate_case.n = problem.layout == tensor::Layout::packed ? problem.stored_keys() : problem.shape.keys;
  std::printf("%s\n%s\n", problem.describe().c_str(), judgement.describe_worst().c_str());
  if (!judgement.passed()) outcome.failures.push_back(judgement.describe_worst());
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
  const tensor::HeadScores scores = scores_from(settings);
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
  io::NpyArray queries;
  if (attention) queries = exact_array(settings.q);
  if (attention && queries.shape.size() >= 3) {
    outcome.gate_case.kernel = settings.name.empty()
                                   ? "compare:" + std::filesystem::path(settings.out).filename().string()
                                   : settings.name;
    judge_attention_tensors(settings, format, queries, outcome);
  } else if (attention) {
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
  command->add_flag("--causal", settings->causal, "Causal mask (aligned as --align says)");
  command->add_option("--layout", settings->layout,
                      "Attention tensors: bhsd ([B,H,S,D], default), bshd ([B,S,H,D]) or packed ([T,H,D])");
  command->add_option("--align", settings->align,
                      "Causal and window diagonal: top-left (default) or bottom-right");
  command->add_option("--window", settings->window,
                      "Sliding window L,R (-1: unbounded), FlashAttention's window_size");
  add_real_list_option(command, "--scale", settings->scale, "Softmax scale (default exactly 1/sqrt(d))");
  add_real_option(command, "--softcap", settings->softcap, "Soft-cap: logits become cap tanh(s / cap)");
  command->add_option("--sinks", settings->sinks_path, "One sink logit per query head (.npy)");
  command->add_option("--alibi-slopes", settings->alibi_path, "One ALiBi slope per query head (.npy)");
  command->add_option("--lse", settings->lse_path,
                      "The kernel's log-sum-exp ([B,H,S] or [H,T]), judged in fp32");
  command->add_flag("--lse-base2", settings->lse_base2, "The log-sum-exp is base 2 (log2 of the sum)");
  command->add_option("--query-lengths", settings->query_lengths,
                      "Valid query rows per batch (padding after)");
  command->add_option("--key-lengths", settings->key_lengths, "Valid keys per batch (key padding mask)");
  command->add_option("--cu-seqlens-q", settings->cu_q, "Packed layout: cumulative query lengths 0,...");
  command->add_option("--cu-seqlens-k", settings->cu_k, "Packed layout: cumulative key lengths 0,...");
  command->add_option("--fully-masked", settings->fully_masked,
                      "A row that sees no key: zeros (default) or error");
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
