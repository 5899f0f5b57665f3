// sharpcheck study: a precision study over n x format x spread (and kernels), written as CSV and
// SVG plots: the largest coefficient against Lemma 2.1's bound and the tight bound, kernel error
// against n per format, and each format's precision horizons; or, with --preset dispersion, the
// same question for every escape from dispersion (studies/dispersion_study.hpp).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "bounds/bounds.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/study_presets.hpp"
#include "core/errors.hpp"
#include "inputs/rows.hpp"
#include "io/atomic_file.hpp"
#include "io/svg_plot.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "reference/softmax.hpp"
#include "studies/dispersion_study.hpp"

namespace sharpcheck::cli {
namespace {

struct StudySettings {
  std::string preset = "paper";
  std::string out = "study";
  std::vector<double> spreads;
  std::vector<std::size_t> sizes;
  std::vector<std::string> kernels{"safe3", "online2", "safe3_bf16", "safe3_fp16", "bf16acc"};
  std::uint64_t seed = 20241008;
  unsigned threads = 0;
  std::size_t tile = 64;                     // flash-deviation: keys per FlashAttention tile
  std::optional<std::uint64_t> preset_seed;  // --seed (the stall, flash-deviation and fp8-spread presets)
  bool quick = false;
};

PresetOptions preset_options(const StudySettings& s) {
  return {s.out, s.sizes, s.threads, s.preset_seed.value_or(0), s.quick, s.tile};
}

std::string spread_text(double delta) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", delta);
  return text;
}

// PNG copies of the dispersion plots through gnuplot, when it is installed (the SVGs need nothing).
void write_png_copies(const StudySettings& s) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("gnuplot is not installed: no PNG copies (the SVG plots are complete)\n");
    return;
  }
  for (const double delta : s.spreads) {
    const std::string name = s.out + "/dispersion_delta_" + spread_text(delta);
    io::OutputFile script(name + ".gp");
    script << "set terminal pngcairo size 900,560\nset output '" << name
           << ".png'\nset datafile separator ','\n"
           << "set logscale xy\nset xlabel 'n'\nset ylabel 'largest coefficient'\n"
           << "set title 'Largest coefficient, spread " << spread_text(delta) << "'\n"
           << "plot '" << s.out << "/dispersion.csv' using ($1==" << delta
           << " ? $2 : 1/0):3 with lines title "
           << "'Lemma 2.1', '' using ($1==" << delta << " ? $2 : 1/0):4 with lines title 'tight bound'\n";
    script.commit();
    if (std::system(("gnuplot '" + name + ".gp'").c_str()) != 0)
      std::printf("gnuplot failed on %s.gp\n", name.c_str());
  }
}

std::string size_text(std::optional<std::uint64_t> n, std::uint64_t largest) {
  if (!n) return "> " + std::to_string(largest);
  return std::to_string(*n);
}

// The dispersion study's CSVs: every spike weight in every format, and adaptive temperature's
// entropies.
void write_dispersion_csvs(const StudySettings& s, const studies::DispersionStudy& study) {
  io::OutputFile weights(s.out + "/escapes.csv");
  weights << "operator,delta,n,lemma_2_1_upper,tight_upper";
  for (const auto* format : studies::study_formats) weights << ",spike_weight_" << format->name;
  weights << "\n";
  for (const auto& point : study.points) {
    const auto n = static_cast<double>(point.n);
    weights << studies::escape_name(point.escape) << "," << point.delta << "," << point.n << ","
            << decimal(bounds::lemma_2_1(n, point.delta, 1.0).upper) << ","
            << decimal(bounds::tight_largest_coefficient(n, point.delta, 1.0));
    for (const double w : point.spike_weight) weights << "," << decimal(w);
    weights << "\n";
  }
  io::OutputFile entropy(s.out + "/adaptive_entropy.csv");
  entropy << "delta,n,entropy_fp64,beta,corrected\n";
  for (const auto& point : study.entropies) {
    entropy << point.delta << "," << point.n << "," << decimal(point.entropy) << "," << decimal(point.beta)
            << "," << (point.corrected ? 1 : 0) << "\n";
  }
  weights.commit();
  entropy.commit();
}

// The summary: where each operator's spike weight falls below 1/2 and 1/10, and where adaptive
// temperature switches off.
std::string dispersion_summary(const studies::DispersionStudy& study) {
  const std::uint64_t largest_size = study.settings.sizes.back();
  std::ostringstream summary;
  summary
      << "# Dispersion of the escapes\n\nSpike weight of the row (delta, 0, ..., 0) (spike last for "
         "stick-breaking's nearest key), exact and rounded to fp64; the first n of the study (powers of two "
         "up to "
      << largest_size << ") at which it falls below 1/2 and below 1/10. SSMax s = " << study.settings.ssmax_s
      << ", length-scaled L = " << study.settings.training_length << ", selective: every token selects every "
      << "earlier distractor with logit " << study.settings.selection
      << " (selective_weak: " << study.settings.weak_selection
      << "), Differential lambda = " << study.settings.differential_lambda
      << " (lambda_init of layer 12); linear and Differential up to n = " << study.settings.matrix_size_limit
      << ".\n\n| operator |";
  for (const double delta : study.settings.spreads) summary << " delta " << delta << ": < 1/2 | < 1/10 |";
  summary << "\n|---|";
  for (std::size_t i = 0; i < study.settings.spreads.size(); ++i) summary << "---:|---:|";
  summary << "\n";
  for (const auto escape : studies::all_escapes) {
    summary << "| " << studies::escape_name(escape) << " |";
    for (const double delta : study.settings.spreads) {
      std::uint64_t computed = 0;  // the matrix-level escapes stop at settings.matrix_size_limit
      for (const auto* point : studies::series_of(study, escape, delta)) {
        if (!std::isnan(point->spike_weight[0])) computed = point->n;
      }
      summary << " " << size_text(studies::first_size_below(study, escape, delta, 0.5), computed) << " | "
              << size_text(studies::first_size_below(study, escape, delta, 0.1), computed) << " |";
    }
    summary << "\n";
  }
  summary << "\nAdaptive temperature's correction (beta > 1) switches off for good at n (exact integer, "
             "closed-form entropy against the certified root of poly(H) = 1):\n\n";
  for (const double delta : study.settings.spreads) {
    const auto off = studies::adaptive_switch_off(delta);
    if (!off.integers) {
      char power[64];
      std::snprintf(power, sizeof power, "%.6Lg", off.log_switch_off / std::log(10.0L));
      summary << "- delta " << delta << ": beta = 1 from n of about 10^" << power
              << " on (beyond 2^62: the integer is not resolved)\n";
      continue;
    }
    summary << "- delta " << delta << ": beta = 1 from n = " << off.first_uncorrected
            << " on (n = " << off.last_corrected << " still corrected)"
            << (off.separated ? "" : " [not separated: check]") << "\n";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", study.seconds);
  summary << "\nComputed in " << seconds << " s.\n";
  return summary.str();
}

const char* const escape_colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                      "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000080"};

// One plot for a spread: every operator (fp64 values), Lemma 2.1 and the tight bound, and where
// softmax's spike underflows in each format.
io::Chart escapes_chart(const studies::DispersionStudy& study, double delta) {
  const std::uint64_t largest_size = study.settings.sizes.back();
  io::Chart chart{
      "Spike weight on the extremal row, spread " + spread_text(delta) + " (below 1e-7 not drawn)",
      "n",
      "weight of the spike",
      true,
      true,
      {},
      {}};
  io::Series lemma{"Lemma 2.1 (softmax)", {}, {}, "#000000", true, false};
  io::Series tight{"tight (softmax)", {}, {}, "#555555", true, false};
  for (const std::uint64_t n : study.settings.sizes) {
    const auto x = static_cast<double>(n);
    lemma.x.push_back(x);
    lemma.y.push_back(std::min(1.0, bounds::lemma_2_1(x, delta, 1.0).upper));
    tight.x.push_back(x);
    tight.y.push_back(bounds::tight_largest_coefficient(x, delta, 1.0));
  }
  chart.series.push_back(lemma);
  chart.series.push_back(tight);
  std::size_t c = 0;
  for (const auto escape : studies::all_escapes) {
    io::Series series{std::string(studies::escape_name(escape)),       {},    {},
                      escape_colours[c++ % std::size(escape_colours)], false, true};
    for (const auto* point : studies::series_of(study, escape, delta)) {
      // stick-breaking's far key (2^-(n-1), in the CSV), and sizes a matrix reference was not run at
      if (!(point->spike_weight[0] >= 1e-7)) continue;
      series.x.push_back(static_cast<double>(point->n));
      series.y.push_back(point->spike_weight[0]);
    }
    chart.series.push_back(std::move(series));
  }
  for (std::size_t f = 1; f < studies::study_format_count; ++f) {
    const auto* format = studies::study_formats[f];
    const auto horizon = bounds::underflow_horizon(delta, 1.0, *format);
    if (horizon.lower <= static_cast<double>(largest_size)) {
      chart.markers.push_back({horizon.lower, "softmax spike 0 in " + std::string(format->name), "#999999"});
    }
  }
  return chart;
}

// Adaptive temperature's entropy of the plain row against n, per spread.
io::Chart adaptive_entropy_chart(const studies::DispersionStudy& study) {
  const std::uint64_t largest_size = study.settings.sizes.back();
  io::Chart entropy_chart{
      "Adaptive temperature: entropy of the plain row against n", "n", "entropy (nats)", true, false, {}, {}};
  const auto root = bounds::adaptive_active_interval().upper_root.lower;
  io::Series threshold{"poly(H) = 1: beta clamps to 1 above", {}, {}, "#000000", true, false};
  threshold.x = {static_cast<double>(study.settings.sizes.front()), static_cast<double>(largest_size)};
  threshold.y = {root, root};
  entropy_chart.series.push_back(threshold);
  std::size_t c = 0;
  for (const double delta : study.settings.spreads) {
    io::Series series{
        "delta " + spread_text(delta), {}, {}, escape_colours[c++ % std::size(escape_colours)], false, true};
    for (const auto& point : study.entropies) {
      if (point.delta != delta) continue;
      series.x.push_back(static_cast<double>(point.n));
      series.y.push_back(point.entropy);
    }
    entropy_chart.series.push_back(std::move(series));
  }
  return entropy_chart;
}

// `study --preset dispersion`: every escape's spike weight against n, per spread, with the
// formats' values, the adaptive entropies, a summary table and one log-log plot per spread.
int run_dispersion_preset(const StudySettings& s) {
  studies::DispersionSettings settings;
  if (!s.spreads.empty()) settings.spreads = s.spreads;
  for (const std::size_t n : s.sizes) settings.sizes.push_back(n);
  settings.threads = s.threads;
  const studies::DispersionStudy study = studies::run_dispersion_study(settings);
  io::make_writable_directory(s.out);
  write_dispersion_csvs(s, study);
  const std::string summary = dispersion_summary(study);
  io::write_file_atomically(s.out + "/summary.md", summary);
  for (const double delta : study.settings.spreads) {
    io::write_file_atomically(s.out + "/escapes_delta_" + spread_text(delta) + ".svg",
                              io::render_svg(escapes_chart(study, delta)));
  }
  io::write_file_atomically(s.out + "/adaptive_entropy.svg", io::render_svg(adaptive_entropy_chart(study)));
  std::printf(
      "dispersion study (%zu points) in %.1f s, written to %s: escapes.csv, adaptive_entropy.csv, summary.md "
      "and SVG plots\n",
      study.points.size(), study.seconds, s.out.c_str());
  std::printf("%s", summary.c_str());
  return exit_pass;
}

const std::vector<const FloatFormat*> paper_formats{&fp32, &bf16, &fp16, &fp8_e4m3, &fp8_e5m2};

// One spread of the paper preset: the extremal row's largest coefficient in every format against
// n (rows of dispersion.csv), the formats' horizons (rows of horizons.csv), and the chart.
void study_one_spread(const StudySettings& s, double delta, std::ostream& dispersion,
                      std::ostream& horizons) {
  const auto& formats = paper_formats;
  io::Chart chart{"Largest coefficient of any row with spread " + spread_text(delta) + " (theta = 1)",
                  "n",
                  "largest coefficient",
                  true,
                  true,
                  {},
                  {}};
  io::Series lemma{"Lemma 2.1: exp(delta)/n", {}, {}, "#000000", true, false};
  io::Series tight{"tight: 1/(1+(n-1)exp(-delta))", {}, {}, "#555555", false, false};
  std::vector<io::Series> per_format;
  for (std::size_t f = 0; f < formats.size(); ++f) {
    per_format.push_back({std::string(formats[f]->name), {}, {}, study_palette[f], false, true});
  }
  for (const std::size_t n : s.sizes) {
    const auto bound = bounds::lemma_2_1(static_cast<double>(n), delta, 1.0);
    const double largest = bounds::tight_largest_coefficient(static_cast<double>(n), delta, 1.0);
    lemma.x.push_back(static_cast<double>(n));
    lemma.y.push_back(bound.upper);
    tight.x.push_back(static_cast<double>(n));
    tight.y.push_back(largest);
    dispersion << delta << "," << n << "," << bound.upper << "," << largest;
    // The extremal row: one logit delta above the n - 1 others, correctly rounded in each format.
    std::vector<double> row(n, 0.0);
    row[0] = delta;
    for (std::size_t f = 0; f < formats.size(); ++f) {
      const double value = reference::softmax(row, *formats[f])[0];
      per_format[f].x.push_back(static_cast<double>(n));
      per_format[f].y.push_back(value);
      dispersion << "," << hex_float(value);
    }
    dispersion << "\n";
  }
  chart.series.push_back(lemma);
  chart.series.push_back(tight);
  for (auto& series : per_format) chart.series.push_back(std::move(series));
  for (std::size_t f = 0; f < formats.size(); ++f) {
    const auto horizon = bounds::underflow_horizon(delta, 1.0, *formats[f]);
    horizons << formats[f]->name << "," << delta << "," << horizon.lower << "," << horizon.upper << ","
             << bounds::accumulation_horizon(*formats[f]) << "\n";
    chart.markers.push_back({horizon.lower, std::string(formats[f]->name) + " underflows", study_palette[f]});
  }
  const auto uint8_horizon = bounds::underflow_horizon(delta, 1.0, 1.0 / 512);
  horizons << "uint8," << delta << "," << uint8_horizon.lower << "," << uint8_horizon.upper << ",\n";
  chart.markers.push_back({uint8_horizon.lower, "uint8 underflows", "#bcbd22"});
  io::write_file_atomically(s.out + "/dispersion_delta_" + spread_text(delta) + ".svg",
                            io::render_svg(chart));
}

// Kernel error against n: four random normal rows per size, as CSV and a chart.
void study_kernel_errors(const StudySettings& s) {
  // Kernel error against n: four random normal rows per size.
  io::OutputFile errors(s.out + "/kernel_error.csv");
  errors.precision(17);
  errors << "kernel,format,n,max_ulps,mean_ulps,max_bound_ratio\n";
  io::Chart error_chart{"Kernel error against the correctly rounded reference (random normal rows)",
                        "n",
                        "max ulp in the output format",
                        true,
                        false,
                        {},
                        {}};
  for (std::size_t k = 0; k < s.kernels.size(); ++k) {
    const auto* kernel = kernels::find_softmax_kernel(s.kernels[k]);
    if (kernel == nullptr)
      throw InputError(InputProblem::out_of_range, "study: no kernel '" + s.kernels[k] + "'");
    io::Series series{std::string(kernel->name) + " (" + std::string(kernel->output->name) + ")",
                      {},
                      {},
                      study_palette[k % 8],
                      kernel->deliberately_broken,
                      true};
    for (const std::size_t n : s.sizes) {
      Matrix logits(4, n);
      for (std::size_t r = 0; r < 4; ++r) {
        const auto row = inputs::make_row(inputs::RowKind::random_normal, n, *kernel->input, s.seed + r);
        std::copy(row.begin(), row.end(), logits.row(r).begin());
      }
      const auto evaluation = metrics::evaluate_softmax(*kernel, logits, 1.0);
      const auto& c = evaluation.comparison;
      errors << kernel->name << "," << kernel->output->name << "," << n << "," << c.max_ulps << ","
             << c.mean_ulps << "," << c.max_bound_ratio << "\n";
      series.x.push_back(static_cast<double>(n));
      series.y.push_back(static_cast<double>(c.max_ulps));
    }
    error_chart.series.push_back(std::move(series));
  }
  errors.commit();
  io::write_file_atomically(s.out + "/kernel_error.svg", io::render_svg(error_chart));
}

int run_study(StudySettings s) {
  if (s.preset == "dispersion") return run_dispersion_preset(s);
  if (s.preset == "stall" || s.preset == "denominator-stall") return run_stall_preset(preset_options(s));
  if (s.preset == "flash-deviation") return run_flash_deviation_preset(preset_options(s));
  if (s.preset == "fp8-spread") return run_fp8_spread_preset(preset_options(s));
  if (s.preset == "backward-peers") return run_backward_peers_preset(preset_options(s));
  if (s.preset != "paper")
    throw InputError(InputProblem::out_of_range, "study: unknown preset '" + s.preset + "'");
  if (s.spreads.empty()) s.spreads = {2.28, 5.69, 14.78};  // Gemma 2B heads: min, mean, max
  if (s.sizes.empty()) {
    for (std::size_t n = 16; n <= 16384; n *= 2) s.sizes.push_back(n);
  }
  io::make_writable_directory(s.out);
  io::OutputFile dispersion(s.out + "/dispersion.csv");
  dispersion.precision(17);
  dispersion << "delta,n,lemma_2_1_upper,tight_upper";
  for (const auto* format : paper_formats) dispersion << ",largest_in_" << format->name;
  dispersion << "\n";
  io::OutputFile horizons(s.out + "/horizons.csv");
  horizons.precision(17);
  horizons << "format,delta,underflow_horizon_lower,underflow_horizon_upper,accumulation_horizon\n";
  for (const double delta : s.spreads) study_one_spread(s, delta, dispersion, horizons);
  dispersion.commit();
  horizons.commit();
  study_kernel_errors(s);
  std::printf("study written to %s: dispersion.csv, horizons.csv, kernel_error.csv and their SVG plots\n",
              s.out.c_str());
  write_png_copies(s);
  return exit_pass;
}

}  // namespace

Command add_study_command(CLI::App& app) {
  auto s = std::make_shared<StudySettings>();
  auto* command =
      app.add_subcommand("study", "A precision study: dispersion, kernel error and horizons, CSV and SVG");
  command->add_option(
      "--preset", s->preset,
      "paper: n = 16 to 16384, delta = 2.28, 5.69, 14.78 (Gemma 2B); dispersion: every escape "
      "(adaptive, SSMax, sigmoid, stick-breaking, length-scaled) at n = 16 to 1048576; denominator-stall: "
      "(also denominator-stall) every accumulation strategy (sequential bf16/fp16/fp8, pairwise, Kahan, "
      "fp32) "
      "against the exact denominator, n = 16 to 16384; flash-deviation: FlashAttention-style against plain "
      "attention in bf16, fp16 and fp32, N = 128 to 16384; fp8-spread: FP8 attention (plain, block, "
      "Hadamard, "
      "lazy rescaling) against the logits' standard deviation; backward-peers: the attention backward "
      "kernels "
      "and their broken twins judged by sharpcheck, PyTorch's rule and FlashAttention's rule");
  command->add_flag("--quick", s->quick, "stall, flash-deviation, fp8-spread: CI's size (seconds)");
  command
      ->add_option("--seed", s->preset_seed,
                   "stall, flash-deviation, fp8-spread: the inputs' seed (results are deterministic from it)")
      ->check(seed_value);
  command->add_option(
      "--threads", s->threads,
      "Threads for the dispersion, stall, flash-deviation and fp8-spread presets (0: every core)");
  command->add_option("--tile", s->tile, "flash-deviation: keys per FlashAttention tile (default 64)");
  command->add_option("--out", s->out, "Output directory (default ./study)");
  add_real_list_option(command, "--spreads", s->spreads, "Spreads delta to study, comma-separated");
  command->add_option("--sizes", s->sizes, "Sizes n to study (fp8-spread: the first is its number of keys)")
      ->delimiter(',');
  command->add_option("--kernels", s->kernels, "Kernels whose error to plot")->delimiter(',');
  return [command, s]() -> int { return *command ? run_study(*s) : -1; };
}

}  // namespace sharpcheck::cli
