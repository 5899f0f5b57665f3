// sharpcheck compare: judges outputs produced elsewhere (a GPU kernel, PyTorch, JAX) from NumPy
// files, with the same metrics, reports and exit codes as the gate. Parse, call
// gate::compare_files, print, write the reports.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "core/text.hpp"
#include "formats/float_format.hpp"
#include "gate/compare_files.hpp"
#include "gate/report.hpp"
#include "io/atomic_file.hpp"
#include "ops/registry.hpp"

namespace sharpcheck::cli {
namespace {

struct CompareSettings {
  gate::CompareRequest request;
  bool causal = false;
  std::string align = "top-left", window, query_lengths, key_lengths, cu_q, cu_k, fully_masked = "zeros";
  std::vector<double> scale;  // empty: exactly 1/sqrt(d)
  double softcap = 0;
  std::string json_path, junit_path, budget_path, baseline_path;
  bool update_baseline = false;
  std::string op;                      // --op: an operation of the registry, judged from `pairs`
  std::vector<std::string> arguments;  // with --op: TENSOR=FILE and OPTION=VALUE
  std::vector<std::string> given;      // the options given on the command line, by name
};

// With --op, the operation's schema reads every tensor and option from KEY=VALUE: the other
// options of `compare` are refused rather than silently dropped.
void refuse_flags_beside_op(const CompareSettings& settings) {
  constexpr std::string_view allowed[] = {
      "--op",       "--bundle",          "--json",    "--junit", "--budget",
      "--baseline", "--update-baseline", "arguments", "--help"};
  for (const std::string& name : settings.given) {
    if (std::find(std::begin(allowed), std::end(allowed), name) != std::end(allowed)) continue;
    std::string key = name.substr(name.starts_with("--") ? 2 : 0);
    std::replace(key.begin(), key.end(), '-', '_');
    std::string message = "compare --op " + settings.op;
    message += ": ";
    message += name;
    message += " is not read with --op; give it as ";
    message += key;
    message += "=VALUE (sharpcheck ops lists the operation's tensors and options)";
    throw InputError(InputProblem::out_of_range, message);
  }
}

// --op's KEY=VALUE arguments as pairs; InputError for one without '='.
std::vector<std::pair<std::string, std::string>> op_pairs(const CompareSettings& settings) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const std::string& argument : settings.arguments) {
    const auto equals = argument.find('=');
    if (equals == std::string::npos || equals == 0)
      throw InputError(InputProblem::out_of_range,
                       "compare --op " + settings.op + ": '" + argument + "' is not KEY=VALUE");
    pairs.emplace_back(argument.substr(0, equals), argument.substr(equals + 1));
  }
  return pairs;
}

// compare --op: the operation's judge on the files named; no legacy file option may be mixed in.
gate::CaseOutcome compare_op(const CompareSettings& settings) {
  refuse_flags_beside_op(settings);
  const gate::Operation& operation = gate::find_operation(ops::all_operations(), settings.op);
  return gate::compare_operation(operation, op_pairs(settings), settings.request.bundle);
}

std::optional<std::size_t> window_side(const std::string& text) {
  if (text == "-1") return std::nullopt;
  return parse_count(text, "--window", 0);
}

// The scores from the options: scale, causal alignment, window ("L,R", -1 unbounded, as
// FlashAttention's window_size), soft-cap and the fully masked rule.
tensor::HeadScores scores_from(const CompareSettings& settings) {
  tensor::HeadScores scores;
  if (!settings.scale.empty()) scores.scale = settings.scale.front();
  scores.causal = settings.causal;
  if (settings.align != "top-left" && settings.align != "bottom-right") {
    throw InputError(InputProblem::out_of_range, "compare: --align must be top-left or bottom-right");
  }
  if (settings.align == "bottom-right") scores.alignment = tensor::DiagonalAlignment::bottom_right;
  if (!settings.window.empty()) {
    const auto comma = settings.window.find(',');
    if (comma == std::string::npos)
      throw InputError(InputProblem::out_of_range, "compare: --window takes L,R");
    scores.window_left = window_side(settings.window.substr(0, comma));
    scores.window_right = window_side(settings.window.substr(comma + 1));
  }
  scores.softcap = settings.softcap;
  if (settings.fully_masked != "zeros" && settings.fully_masked != "error") {
    throw InputError(InputProblem::out_of_range, "compare: --fully-masked must be zeros or error");
  }
  if (settings.fully_masked == "error") scores.fully_masked = tensor::FullyMaskedRows::error;
  return scores;
}

gate::CompareRequest request_from(const CompareSettings& settings) {
  gate::CompareRequest request = settings.request;
  request.scores = scores_from(settings);
  const auto list = [](const std::string& text, const char* option) {
    return parse_count_list(text, option, 0, std::numeric_limits<std::size_t>::max());
  };
  request.query_lengths = list(settings.query_lengths, "--query-lengths");
  request.key_lengths = list(settings.key_lengths, "--key-lengths");
  request.cu_seqlens_q = list(settings.cu_q, "--cu-seqlens-q");
  request.cu_seqlens_k = list(settings.cu_k, "--cu-seqlens-k");
  return request;
}

// The command that reruns this comparison (what a report's "rerun" says), reals in hex so
// that they are read back exactly.
std::string rerun_command(const CompareSettings& s) {
  const auto& r = s.request;
  std::string command = "sharpcheck compare";
  if (!s.op.empty()) {
    command += " --op " + s.op;
    if (!r.bundle.empty()) command += " --bundle " + r.bundle;
    for (const std::string& argument : s.arguments) command += " " + argument;
    return command;
  }
  const auto add = [&](const char* option, const std::string& value) {
    if (!value.empty()) command += std::string(" ") + option + " " + value;
  };
  const auto flag = [&](const char* option, bool on) {
    if (on) command += std::string(" ") + option;
  };
  const auto real = [&](const char* option, double value, double plain) {
    if (value != plain) add(option, hex_float(value));
  };
  for (const auto& [option, value] : {std::pair{"--bundle", r.bundle},
                                      {"--logits", r.logits},
                                      {"--probs", r.probabilities},
                                      {"--q", r.q},
                                      {"--k", r.k},
                                      {"--v", r.v},
                                      {"--out", r.out},
                                      {"--lse", r.lse},
                                      {"--format", r.format},
                                      {"--input-format", r.input_format},
                                      {"--lse-format", r.lse_format == "fp32" ? std::string() : r.lse_format},
                                      {"--layout", r.layout},
                                      {"--align", s.align},
                                      {"--window", s.window},
                                      {"--sinks", r.sinks},
                                      {"--alibi-slopes", r.alibi_slopes},
                                      {"--query-lengths", s.query_lengths},
                                      {"--key-lengths", s.key_lengths},
                                      {"--cu-seqlens-q", s.cu_q},
                                      {"--cu-seqlens-k", s.cu_k},
                                      {"--fully-masked", s.fully_masked},
                                      {"--tolerance-of", r.tolerance_entry},
                                      {"--budget", s.budget_path},
                                      {"--baseline", s.baseline_path},
                                      {"--name", r.name}})
    add(option, value);
  if (r.dim != -1) add("--dim", std::to_string(r.dim));
  flag("--log-softmax", r.log_softmax);
  flag("--proven-only", r.strictest == metrics::Tier::proven);
  flag("--lse-base2", r.lse_base2);
  flag("--causal", s.causal);
  add("--theta", hex_float(r.theta));
  if (!s.scale.empty()) add("--scale", hex_float(s.scale.front()));
  real("--softcap", s.softcap, 0);
  real("--q-descale", r.q_descale, 1);
  real("--k-descale", r.k_descale, 1);
  real("--v-descale", r.v_descale, 1);
  return command;
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
  std::printf("statistical tier: bound ratio %.3g, bias ratio %.3g, row-scale ratio %.3g, %zu violations%s\n",
              c.max_statistical_ratio, c.max_bias_ratio, c.max_row_scale_ratio, c.statistical_violation_count,
              outcome.passed() || c.violation_count > 0 || c.statistical_violation_count == 0
                  ? ""
                  : " (within the proven bound; outside the statistical tier)");
  for (const auto& failure : outcome.failures) std::printf("FAIL %s\n", failure.c_str());
  if (outcome.passed() && !outcome.recipe_note.empty()) std::printf("%s\n", outcome.recipe_note.c_str());
  if (outcome.inconclusive()) {
    std::printf(
        "inconclusive: only %zu of %zu expected values can discriminate (the rest are 0, 1, at the "
        "format's floor, or have no finite allowance)\n",
        c.informative, c.elements);
    return;
  }
  std::printf("%s\n", outcome.passed() ? "pass" : "FAIL");
}

int run_compare(const CompareSettings& settings) {
  if (settings.update_baseline && settings.baseline_path.empty()) {
    throw InputError(InputProblem::out_of_range, "compare: --update-baseline needs --baseline FILE");
  }
  if (settings.op.empty() && !settings.arguments.empty())
    throw InputError(InputProblem::out_of_range, "compare: '" + settings.arguments.front() +
                                                     "' is not an option (KEY=VALUE pairs need --op NAME)");
  // An unwritable report path is refused before the work, not after it.
  for (const std::string* path : {&settings.json_path, &settings.junit_path}) {
    if (!path->empty()) io::check_writable(*path);
  }
  if (settings.update_baseline) io::check_writable(settings.baseline_path);
  const nlohmann::json budget =
      settings.budget_path.empty() ? nlohmann::json::object() : gate::read_budget(settings.budget_path);
  gate::CaseOutcome outcome;
  // SIGINT/SIGTERM stop the judgement between heads (core/parallel.hpp); the report then says the
  // run is incomplete instead of being absent.
  catch_interrupts();
  try {
    if (!settings.op.empty()) {
      outcome = compare_op(settings);
    } else {
      gate::CompareRequest request = request_from(settings);
      if (request.tolerance_entry.empty())  // the budget's precision model, unless --tolerance-of names one
        request.tolerance_entry = gate::budget_tolerance(budget, gate::kernel_name_of(request));
      outcome = gate::compare_files(request);
    }
  } catch (const Interrupted& interrupted) {
    // The heads judged before the signal are kept (attention: InterruptedJudgement carries them).
    nlohmann::json cases = nlohmann::json::array();
    if (const auto* partial = dynamic_cast<const gate::InterruptedJudgement*>(&interrupted)) {
      std::printf("%s\n", partial->partial().incomplete.c_str());
      nlohmann::json record = gate::to_json(partial->partial());
      record["rerun"] = to_valid_utf8(rerun_command(settings));
      cases.push_back(std::move(record));
    }
    if (!settings.json_path.empty()) {
      const nlohmann::json report{{"cases", cases},
                                  {"complete", false},
                                  {"interrupted_by_signal", interrupted.signal_number()},
                                  {"rerun", to_valid_utf8(rerun_command(settings))}};
      io::write_file_atomically(settings.json_path, report.dump(1) + "\n");
    }
    throw;
  }
  gate::apply_budget(outcome, budget);
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

void add_file_options(CLI::App* command, CompareSettings& s) {
  auto& r = s.request;
  command->add_option(
      "--bundle", r.bundle,
      "An .npz file whose members named logits, probs, q, k, v, out, lse, sinks, alibi_slopes, "
      "and for the attention backward dout, dq, dk, dv, d_lse, d, stand for the options not given");
  command->add_option(
      "--logits", r.logits,
      "Logits (.npy or FILE.npz:NAME, any rank, softmax along --dim; bf16 as uint16 or int16 bits)");
  command->add_option("--dim", r.dim,
                      "The softmax axis of --logits (negative counts from the end; default -1)");
  command->add_option("--probs", r.probabilities,
                      "The kernel's probabilities (or log-probabilities), same shape");
  command->add_flag("--log-softmax", r.log_softmax, "--probs holds log-probabilities (log_softmax)");
  command->add_flag_callback(
      "--proven-only", [&r] { r.strictest = metrics::Tier::proven; },
      "Judge by the proven worst-case tier alone (default: fail on the proven or the statistical tier)");
  command->add_option("--q", r.q, "Attention queries: one head (m x d) or a layer (see --layout)");
  command->add_option("--k", r.k, "Attention keys (n x d, or a layer)");
  command->add_option("--v", r.v, "Attention values (n x dv, or a layer)");
  command->add_option("--out", r.out, "The kernel's attention output");
  command->add_option("--lse", r.lse,
                      "The kernel's log-sum-exp ([B,H,S] or [H,T]), judged in --lse-format (default fp32)");
  command->add_option("--lse-format", r.lse_format,
                      "The log-sum-exp's format: fp32 (default), bf16 or fp16 (bit patterns or values)");
  command->add_option(
      "--dout", r.dout,
      "Attention backward: the gradient reaching the output (q's layout); with --dq --dk --dv");
  command->add_option("--dq", r.dq, "Attention backward: the kernel's dQ (q's layout)");
  command->add_option("--dk", r.dk, "Attention backward: the kernel's dK (k's layout)");
  command->add_option("--dv", r.dv, "Attention backward: the kernel's dV (v's layout)");
  command->add_option("--d-lse", r.d_lse,
                      "Attention backward: the gradient reaching the log-sum-exp, if any");
  command->add_option("--d", r.d,
                      "Attention backward: the kernel's D = rowsum(dO * O) in fp32, laid out as the "
                      "log-sum-exp, if it exposes it (judged too)");
  command->add_flag("--lse-base2", r.lse_base2, "The log-sum-exp is base 2 (log2 of the sum)");
  command->add_option("--format", r.format,
                      "The outputs' format: fp64, fp32, tf32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, uint8");
  command->add_option("--input-format", r.input_format,
                      "How bit patterns in the inputs are read (default --format)");
  command->add_option(
      "--tolerance-of", r.tolerance_entry,
      "Judge by this recipe or tolerance entry: an attention recipe (attention_fp32, flash_bf16, flash_fp16, "
      "math_bf16, math_fp16, attention_p_rounded, attention_math_lowp; backward: attention_backward_flash, "
      "backward_flash_bf16, backward_flash_fp16, backward_math_bf16, backward_math_fp16), a kernel's name or "
      "plugin_softmax. Attention default: every recipe the formats allow, the first that fits");
  command->add_option("--name", r.name,
                      "The kernel's name in reports, budgets and baselines (default compare:<file name>)");
  add_real_option(command, "--theta", r.theta, "Temperature");
}

void add_attention_options(CLI::App* command, CompareSettings& s) {
  auto& r = s.request;
  command->add_flag("--causal", s.causal, "Causal mask (aligned as --align says)");
  command->add_option("--layout", r.layout,
                      "Attention tensors: bhsd ([B,H,S,D], default), bshd ([B,S,H,D]) or packed ([T,H,D])");
  command->add_option("--align", s.align, "Causal and window diagonal: top-left (default) or bottom-right");
  command->add_option("--window", s.window,
                      "Sliding window L,R (-1: unbounded), FlashAttention's window_size");
  add_real_list_option(command, "--scale", s.scale, "Softmax scale (default exactly 1/sqrt(d))");
  add_real_option(command, "--softcap", s.softcap, "Soft-cap: scores become cap tanh(s / cap)");
  command->add_option("--sinks", r.sinks, "One sink logit per query head (.npy)");
  command->add_option("--alibi-slopes", r.alibi_slopes, "One ALiBi slope per query head (.npy)");
  command->add_option("--query-lengths", s.query_lengths, "Valid query rows per batch (padding after)");
  command->add_option("--key-lengths", s.key_lengths, "Valid keys per batch (key padding mask)");
  command->add_option("--cu-seqlens-q", s.cu_q, "Packed layout: cumulative query lengths 0,...");
  command->add_option("--cu-seqlens-k", s.cu_k, "Packed layout: cumulative key lengths 0,...");
  command->add_option("--fully-masked", s.fully_masked, "A row that sees no key: zeros (default) or error");
  add_real_option(command, "--q-descale", r.q_descale, "fp8 inputs: Q's per-tensor descale factor");
  add_real_option(command, "--k-descale", r.k_descale, "fp8 inputs: K's per-tensor descale factor");
  add_real_option(command, "--v-descale", r.v_descale, "fp8 inputs: V's per-tensor descale factor");
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto settings = std::make_shared<CompareSettings>();
  auto* command = app.add_subcommand("compare", "Judge softmax or attention outputs saved as .npy files");
  add_file_options(command, *settings);
  add_attention_options(command, *settings);
  command->add_option(
      "--op", settings->op,
      "Judge this operation (sharpcheck ops lists them) from KEY=VALUE arguments: its tensors "
      "as files (TENSOR=FILE.npy or FILE.npz:NAME) and its options (OPTION=VALUE)");
  command->add_option("arguments", settings->arguments, "With --op: TENSOR=FILE and OPTION=VALUE pairs");
  command->add_option("--budget", settings->budget_path, "JSON budget (see gate)");
  command->add_option("--baseline", settings->baseline_path,
                      "JSON baseline from an earlier run: fail on any growth");
  command->add_flag("--update-baseline", settings->update_baseline,
                    "Write this comparison's figures to --baseline");
  command->add_option("--json", settings->json_path, "Write the report as JSON")->check(report_path);
  command->add_option("--junit", settings->junit_path, "Write JUnit XML")->check(report_path);
  return [command, settings]() -> int {
    if (!*command) return -1;
    for (const CLI::Option* option : command->get_options()) {
      if (option->count() > 0) settings->given.push_back(option->get_name());
    }
    return run_compare(*settings);
  };
}

}  // namespace sharpcheck::cli
