#include "cli/study_presets.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "cli/commands.hpp"
#include "io/atomic_file.hpp"
#include "io/chart_png.hpp"
#include "io/svg_plot.hpp"
#include "studies/backward_peers.hpp"
#include "studies/denominator_stall.hpp"
#include "studies/flash_deviation.hpp"
#include "studies/fp8_spread.hpp"

namespace sharpcheck::cli {
namespace {

const char* rows_name(studies::StallRows rows) {
  return rows == studies::StallRows::equal ? "equal" : "random_normal";
}

// Adds (x, y) to the chart's series `label`, starting it (the next colour) when there is none.
void add_point(io::Chart& chart, const std::string& label, double x, double y, bool dashed) {
  auto series = std::find_if(chart.series.begin(), chart.series.end(),
                             [&](const io::Series& s) { return s.label == label; });
  if (series == chart.series.end()) {
    chart.series.push_back(
        {label, {}, {}, study_palette[chart.series.size() % std::size(study_palette)], dashed});
    series = chart.series.end() - 1;
  }
  series->x.push_back(x);
  series->y.push_back(y);
}

// The stall study's summary beside the figures it answers (issue 20: 1.3% / 50% / 97% denominator
// errors at n = 64 / 1,024 / 16,384 for a bf16 accumulator; row sums of 0.898 at 4,096 and 0.865 at
// 8,192 in a shipped kernel).
std::string stall_summary(const studies::StallStudy& study) {
  std::string text = "# The denominator stall (" + std::string(study.settings.output->name) + " outputs)\n\n";
  for (std::size_t a = 0; a < study.settings.strategies.size(); ++a) {
    const auto& value = study.stall_values[a];
    const auto& horizon = study.horizons[a];
    text += "- " + study.settings.strategies[a].name() + ": a sum of ones " +
            (value ? (horizon ? "stalls at " : "first errs at ") + decimal(*value)
                   : std::string("stays exact within the sizes")) +
            (horizon ? "; bounds/ says the sum must stall at term " + std::to_string(*horizon) : "") + "\n";
  }
  text +=
      "\n| strategy | rows | n | denominator error | row sum | max relative error "
      "|\n|---|---|---|---|---|---|\n";
  for (const auto& p : study.points) {
    if (p.n != 64 && p.n != 1024 && p.n != 4096 && p.n != 8192 && p.n != 16384) continue;
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %s | %zu | %.3g | %.4g | %.3g |\n", p.strategy.name().c_str(),
                  rows_name(p.rows), p.n, p.denominator_error, p.row_sum, p.max_relative_error);
    text += line;
  }
  return text +
         "\nPublished (a bf16 accumulator): denominator errors 1.3% / 50% / 97% at n = 64 / 1,024 / 16,384; "
         "row sums 0.898 at n = 4,096 and 0.865 at 8,192 in a shipped kernel.\n";
}

// The study's table beside the figure it answers (Golden et al. 2024: about 10x more deviation for
// Flash Attention than baseline attention in bf16, measured against an fp64 golden).
std::string deviation_summary(const studies::DeviationStudy& study) {
  std::string text =
      "# FlashAttention-style (tiles of " + std::to_string(study.settings.tile) +
      " keys) against plain attention, deviation from the correctly rounded output\n\n"
      "| format | inputs | d | N | naive max abs | flash max abs | R(N) | naive max ulp | flash max ulp | "
      "naive "
      "RMSE | flash RMSE | naive exact | flash exact "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : study.points) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "| %s | %s | %zu | %zu | %.3g | %.3g | %.3g | %.0f | %.0f | %.3g | %.3g | %.3f | %.3f |\n",
                  std::string(p.format->name).c_str(), studies::deviation_inputs_name(p.inputs), p.head_dim,
                  p.n, p.naive.max_absolute, p.flash.max_absolute, p.ratio(), p.naive.max_ulps,
                  p.flash.max_ulps, p.naive.rmse, p.flash.rmse, p.naive.correctly_rounded,
                  p.flash.correctly_rounded);
    text += line;
  }
  return text +
         "\nPublished (Golden et al. 2024, bf16, against an fp64 golden): Flash Attention deviates about 10x "
         "more than baseline attention in an isolated forward pass. Exact: the fraction of outputs equal to "
         "the correctly rounded value.\n";
}

// The fp8-spread table beside the figures it answers (Shah et al. 2024: RMSE 2.4e-2 for FP8
// baseline attention, 9.1e-3 for FlashAttention 3's FP8 on outlier inputs; FlashAttention 4's
// tests: saturation once the logits' standard deviation passes about 0.8).
std::string fp8_spread_summary(const studies::Fp8SpreadStudy& study) {
  std::string text =
      "# FP8 attention against the logits' standard deviation (" + std::to_string(study.settings.keys) +
      " keys, d = " + std::to_string(study.settings.head_dim) +
      "; error against the correctly rounded bf16 attention of the unquantised inputs)\n\n"
      "| inputs | sigma | plain RMSE | block RMSE | rotated RMSE | lazy RMSE | plain / rotated | lazy "
      "saturated |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : study.points) {
    const auto& e = p.errors;
    char line[260];
    std::snprintf(line, sizeof line, "| %s | %.3g%s | %.3g | %.3g | %.3g | %.3g | %.2f | %.3g |\n",
                  studies::deviation_inputs_name(p.inputs), p.measured, p.unscaled ? " (as drawn)" : "",
                  e[0].rmse, e[1].rmse, e[2].rmse, e[3].rmse, e[2].rmse > 0 ? e[0].rmse / e[2].rmse : 0.0,
                  e[3].saturated);
    text += line;
  }
  text += "\n";
  const auto sigma_text = [](const std::optional<double>& sigma) {
    if (!sigma) return std::string("at no sigma studied");
    char line[80];
    std::snprintf(line, sizeof line, "from sigma = %.3g (%.3g in log2 units)", *sigma,
                  *sigma / std::log(2.0));
    return std::string(line);
  };
  for (std::size_t i = 0; i < study.settings.inputs.size(); ++i) {
    text += std::string("- ") + studies::deviation_inputs_name(study.settings.inputs[i]) +
            " inputs: lazy rescaling saturates some P " + sigma_text(study.first_saturation[i]) +
            "; its RMSE is twice the plain kernel's " + sigma_text(study.saturation_point[i]) + "\n";
  }
  return text +
         "\nPublished: FP8 baseline RMSE 2.4e-2, FlashAttention 3 FP8 (block quantisation + Hadamard) 9.1e-3 "
         "on "
         "outlier inputs (2.6x); FlashAttention 4's tests: FP8 rescaling saturates once the logits' standard "
         "deviation passes about 0.8 (log2(448) - 8 = 0.807).\n";
}

// Per kernel: which of the three judges fails it on which cases.
std::string backward_peers_summary(const studies::BackwardPeerStudy& study) {
  std::string text =
      "# Attention backward: sharpcheck against PyTorch's and FlashAttention's rules\n\n"
      "| kernel | broken | sharpcheck fails | PyTorch's rule fails | FlashAttention's rule fails | worst "
      "bound ratio "
      "|\n|---|---|---|---|---|---|\n";
  for (std::size_t first = 0; first < study.rows.size();) {
    std::size_t last = first;
    std::string ours, pytorch, flash;
    double worst = 0;
    for (; last < study.rows.size() && study.rows[last].kernel == study.rows[first].kernel; ++last) {
      const auto& row = study.rows[last];
      const auto add = [&](std::string& list, bool fails) {
        if (fails) list += (list.empty() ? "" : ", ") + row.case_name;
      };
      add(ours, row.sharpcheck_fails);
      add(pytorch, row.pytorch_fails);
      add(flash, row.flash_fails);
      worst = std::max(worst, row.bound_ratio);
    }
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.3g", worst);
    const auto none = [](const std::string& list) { return list.empty() ? std::string("none") : list; };
    text += "| " + study.rows[first].kernel + " | " + (study.rows[first].deliberately_broken ? "yes" : "no") +
            " | " + none(ours) + " | " + none(pytorch) + " | " + none(flash) + " | " + ratio + " |\n";
    first = last;
  }
  return text +
         "\nPyTorch's rule: max |test - gold| <= max(1e-5, fudge max |lowp_math - gold|), fudge 180 (dQ), 16 "
         "(dK), "
         "4 (dV); FlashAttention's: max |test - gold| <= 3 max |lowp_math - gold|; gold the correctly "
         "rounded fp64 "
         "gradients, lowp_math PyTorch's math path in the kernel's format.\n";
}

}  // namespace

std::string decimal(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// `study --preset stall`: every accumulation strategy against the exact denominator and the
// correctly rounded softmax, equal and random rows, n = 16 to 16,384 (quick: to 1,024), with the
// horizons where a sequential sum must stall marked.
int run_stall_preset(const PresetOptions& options) {
  studies::StallSettings settings;
  settings.sizes = options.sizes;
  if (settings.sizes.empty() && options.quick) settings.sizes = {16, 64, 256, 1024};
  settings.threads = options.threads;
  if (options.seed != 0) settings.seed = options.seed;
  const studies::StallStudy study = studies::run_stall_study(settings);
  io::make_writable_directory(options.out);
  io::OutputFile csv(options.out + "/stall.csv");
  csv << "strategy,rows,n,denominator_error,row_sum,max_relative_error\n";
  io::Chart sums{"Denominator error against n", "n", "|sum / exact - 1|", true, true, {}, {}};
  io::Chart coefficients{"Worst coefficient error against n", "n", "max |p / RN(p) - 1|", true, true, {}, {}};
  for (const auto& p : study.points) {
    csv << p.strategy.name() << ',' << rows_name(p.rows) << ',' << p.n << ',' << decimal(p.denominator_error)
        << ',' << decimal(p.row_sum) << ',' << decimal(p.max_relative_error) << '\n';
    const std::string label = p.strategy.name() + " " + rows_name(p.rows);
    const bool dashed = p.rows == studies::StallRows::random_normal;
    add_point(sums, label, static_cast<double>(p.n), p.denominator_error, dashed);
    add_point(coefficients, label, static_cast<double>(p.n), p.max_relative_error, dashed);
  }
  const std::size_t largest = *std::max_element(study.settings.sizes.begin(), study.settings.sizes.end());
  for (std::size_t a = 0; a < study.horizons.size(); ++a) {
    const auto& horizon = study.horizons[a];
    if (!horizon || *horizon > largest) continue;
    const io::VerticalMarker marker{
        static_cast<double>(*horizon),
        study.settings.strategies[a].name() + " horizon " + std::to_string(*horizon)};
    sums.markers.push_back(marker);
    coefficients.markers.push_back(marker);
  }
  csv.commit();
  std::string notes = io::write_chart(sums, options.out + "/stall");
  notes += io::write_chart(coefficients, options.out + "/stall_coefficients");
  const std::string summary = stall_summary(study);
  io::write_file_atomically(options.out + "/stall_summary.md", summary);
  std::printf(
      "stall study written to %s: stall.csv, stall.svg, stall_coefficients.svg, stall_summary.md\n%s%s",
      options.out.c_str(), notes.c_str(), summary.c_str());
  return exit_pass;
}

int run_flash_deviation_preset(const PresetOptions& options) {
  studies::DeviationSettings settings;
  settings.tile = options.tile;
  settings.sizes = options.sizes;
  settings.threads = options.threads;
  if (options.seed != 0) settings.seed = options.seed;
  if (options.quick) {
    if (settings.sizes.empty()) settings.sizes = {128, 512, 2048};
    settings.head_dims = {64};
    settings.query_rows = 4;
  }
  const studies::DeviationStudy study = studies::run_deviation_study(settings);
  io::make_writable_directory(options.out);
  io::OutputFile csv(options.out + "/flash_deviation.csv");
  csv << "format,inputs,head_dim,n,kernel,max_abs,max_ulps,rmse,correctly_rounded\n";
  io::Chart chart{"R(N): flash max |error| / naive max |error|", "N (keys)", "R(N)", true, true, {}, {}};
  for (const auto& p : study.points) {
    for (const auto& [kernel, d] : {std::pair{"naive", &p.naive}, {"flash", &p.flash}}) {
      csv << p.format->name << ',' << studies::deviation_inputs_name(p.inputs) << ',' << p.head_dim << ','
          << p.n << ',' << kernel << ',' << decimal(d->max_absolute) << ',' << decimal(d->max_ulps) << ','
          << decimal(d->rmse) << ',' << decimal(d->correctly_rounded) << '\n';
    }
    const std::string label = std::string(p.format->name) + " " + studies::deviation_inputs_name(p.inputs) +
                              " d=" + std::to_string(p.head_dim);
    add_point(chart, label, static_cast<double>(p.n), p.ratio(),
              p.inputs != studies::DeviationInputs::normal);
  }
  csv.commit();
  const std::string notes = io::write_chart(chart, options.out + "/flash_deviation_ratio");
  const std::string summary = deviation_summary(study);
  io::write_file_atomically(options.out + "/flash_deviation_summary.md", summary);
  std::printf(
      "flash-deviation study written to %s: flash_deviation.csv, flash_deviation_ratio.svg, "
      "flash_deviation_summary.md\n%s%s",
      options.out.c_str(), notes.c_str(), summary.c_str());
  return exit_pass;
}

// `study --preset fp8-spread`: FP8 attention's error against the logits' standard deviation.
int run_fp8_spread_preset(const PresetOptions& options) {
  studies::Fp8SpreadSettings settings;
  settings.threads = options.threads;
  if (options.seed != 0) settings.seed = options.seed;
  if (!options.sizes.empty()) settings.keys = options.sizes.front();
  if (options.quick) {
    settings.keys = options.sizes.empty() ? 256 : settings.keys;
    settings.query_rows = 8;
    settings.sigmas = {0.25, 0.5, 1, 2, 4};
  }
  const studies::Fp8SpreadStudy study = studies::run_fp8_spread_study(settings);
  io::make_writable_directory(options.out);
  io::OutputFile csv(options.out + "/fp8_spread.csv");
  csv << "inputs,sigma,measured_sigma,unscaled,variant,rmse,max_abs,saturated\n";
  io::Chart rmse{
      "FP8 attention: RMSE against the logits' standard deviation", "sigma", "RMSE", true, true, {}, {}};
  io::Chart saturation{
      "Lazy rescaling: fraction of e4m3 P saturated", "sigma", "fraction", true, true, {}, {}};
  for (const auto& p : study.points) {
    for (const studies::Fp8Variant variant : studies::all_fp8_variants) {
      const studies::Fp8Error& e = p.errors[static_cast<int>(variant)];
      csv << studies::deviation_inputs_name(p.inputs) << ',' << decimal(p.sigma) << ',' << decimal(p.measured)
          << ',' << (p.unscaled ? 1 : 0) << ',' << studies::fp8_variant_name(variant) << ','
          << decimal(e.rmse) << ',' << decimal(e.max_absolute) << ',' << decimal(e.saturated) << '\n';
      if (p.unscaled) continue;
      const bool dashed = p.inputs != studies::DeviationInputs::normal;
      const std::string label =
          std::string(studies::fp8_variant_name(variant)) + " " + studies::deviation_inputs_name(p.inputs);
      add_point(rmse, label, p.measured, e.rmse, dashed);
      if (variant == studies::Fp8Variant::lazy) add_point(saturation, label, p.measured, e.saturated, dashed);
    }
  }
  csv.commit();
  std::string notes = io::write_chart(rmse, options.out + "/fp8_spread_rmse");
  notes += io::write_chart(saturation, options.out + "/fp8_spread_saturation");
  const std::string summary = fp8_spread_summary(study);
  io::write_file_atomically(options.out + "/fp8_spread_summary.md", summary);
  std::printf(
      "fp8-spread study written to %s: fp8_spread.csv, fp8_spread_rmse.svg, fp8_spread_saturation.svg, "
      "fp8_spread_summary.md\n%s%s",
      options.out.c_str(), notes.c_str(), summary.c_str());
  return exit_pass;
}

// `study --preset backward-peers`: every attention backward kernel on the backward sweep, judged by
// sharpcheck, PyTorch's rule and FlashAttention's rule in one run.
int run_backward_peers_preset(const PresetOptions& options) {
  const studies::BackwardPeerStudy study =
      studies::run_backward_peer_study(options.seed != 0 ? options.seed : 20241008, options.threads);
  io::make_writable_directory(options.out);
  io::OutputFile csv(options.out + "/backward_peers.csv");
  csv << "kernel,case,deliberately_broken,sharpcheck_fails,bound_ratio,pytorch_fails,flash_fails,worst\n";
  for (const auto& row : study.rows) {
    csv << row.kernel << ',' << row.case_name << ',' << row.deliberately_broken << ',' << row.sharpcheck_fails
        << ',' << decimal(row.bound_ratio) << ',' << row.pytorch_fails << ',' << row.flash_fails << ",\""
        << row.worst << "\"\n";
  }
  csv.commit();
  const std::string summary = backward_peers_summary(study);
  io::write_file_atomically(options.out + "/backward_peers_summary.md", summary);
  std::printf("backward-peers study written to %s: backward_peers.csv, backward_peers_summary.md\n%s",
              options.out.c_str(), summary.c_str());
  return exit_pass;
}

}  // namespace sharpcheck::cli
