#include "cli/study_presets.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "cli/commands.hpp"
#include "io/atomic_file.hpp"
#include "io/svg_plot.hpp"
#include "studies/denominator_stall.hpp"
#include "studies/flash_deviation.hpp"

namespace sharpcheck::cli {
namespace {

const char* rows_name(studies::StallRows rows) {
  return rows == studies::StallRows::equal ? "equal" : "random_normal";
}

// The stall study's summary beside the figures it answers (issue 20: 1.3% / 50% / 97% denominator
// errors at n = 64 / 1,024 / 16,384 for a bf16 accumulator; row sums of 0.898 at 4,096 and 0.865 at
// 8,192 in a shipped kernel).
std::string stall_summary(const studies::StallStudy& study) {
  std::string text = "# The denominator stall (bf16 outputs)\n\n";
  for (std::size_t a = 0; a < study.settings.accumulations.size(); ++a) {
    const double value = study.stall_values[a];
    text += "- " + std::string(study.settings.accumulations[a]->name) + " running sum of ones stalls at " +
            (value == 0 ? std::string("no value within the sizes") : decimal(value)) + "\n";
  }
  text +=
      "\n| accumulation | rows | n | denominator error | row sum | max relative error "
      "|\n|---|---|---|---|---|---|\n";
  for (const auto& p : study.points) {
    if (p.n != 64 && p.n != 1024 && p.n != 4096 && p.n != 8192 && p.n != 16384) continue;
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %s | %zu | %.3g | %.4g | %.3g |\n",
                  std::string(p.accumulation->name).c_str(), rows_name(p.rows), p.n, p.denominator_error,
                  p.row_sum, p.max_relative_error);
    text += line;
  }
  return text +
         "\nPublished (a bf16 accumulator): denominator errors 1.3% / 50% / 97% at n = 64 / 1,024 / 16,384; "
         "row sums 0.898 at n = 4,096 and 0.865 at 8,192 in a shipped kernel.\n";
}

const char* inputs_name(studies::DeviationInputs inputs) {
  return inputs == studies::DeviationInputs::normal ? "normal" : "outliers";
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
                  std::string(p.format->name).c_str(), inputs_name(p.inputs), p.head_dim, p.n,
                  p.naive.max_absolute, p.flash.max_absolute, p.ratio(), p.naive.max_ulps, p.flash.max_ulps,
                  p.naive.rmse, p.flash.rmse, p.naive.correctly_rounded, p.flash.correctly_rounded);
    text += line;
  }
  return text +
         "\nPublished (Golden et al. 2024, bf16, against an fp64 golden): Flash Attention deviates about 10x "
         "more than baseline attention in an isolated forward pass. Exact: the fraction of outputs equal to "
         "the correctly rounded value.\n";
}

}  // namespace

std::string decimal(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// `study --preset denominator-stall`: a running sum kept in bf16, fp16 and fp32 against the exact
// denominator and the correctly rounded softmax, equal and random rows, n = 16 to 16,384.
int run_stall_preset(const std::string& out, const std::vector<std::size_t>& sizes) {
  studies::StallSettings settings;
  settings.sizes = sizes;
  const studies::StallStudy study = studies::run_stall_study(settings);
  io::make_writable_directory(out);
  io::OutputFile csv(out + "/stall.csv");
  csv << "accumulation,rows,n,denominator_error,row_sum,max_relative_error\n";
  io::Chart chart{
      "Running-sum softmax: denominator error against n", "n", "|sum / exact - 1|", true, true, {}, {}};
  for (const auto& p : study.points) {
    csv << p.accumulation->name << ',' << rows_name(p.rows) << ',' << p.n << ','
        << decimal(p.denominator_error) << ',' << decimal(p.row_sum) << ',' << decimal(p.max_relative_error)
        << '\n';
    const std::string label = std::string(p.accumulation->name) + " " + rows_name(p.rows);
    if (chart.series.empty() || chart.series.back().label != label) {
      chart.series.push_back({label,
                              {},
                              {},
                              study_palette[chart.series.size() % std::size(study_palette)],
                              p.rows == studies::StallRows::random_normal});
    }
    chart.series.back().x.push_back(static_cast<double>(p.n));
    chart.series.back().y.push_back(p.denominator_error);
  }
  csv.commit();
  io::write_file_atomically(out + "/stall.svg", io::render_svg(chart));
  const std::string summary = stall_summary(study);
  io::write_file_atomically(out + "/stall_summary.md", summary);
  std::printf("denominator-stall study written to %s: stall.csv, stall.svg, stall_summary.md\n%s",
              out.c_str(), summary.c_str());
  return exit_pass;
}

int run_flash_deviation_preset(const std::string& out, const std::vector<std::size_t>& sizes,
                               unsigned threads, std::size_t tile) {
  studies::DeviationSettings settings;
  settings.tile = tile;
  settings.sizes = sizes;
  settings.threads = threads;
  const studies::DeviationStudy study = studies::run_deviation_study(settings);
  io::make_writable_directory(out);
  io::OutputFile csv(out + "/flash_deviation.csv");
  csv << "format,inputs,head_dim,n,kernel,max_abs,max_ulps,rmse,correctly_rounded\n";
  io::Chart chart{"R(N): flash max |error| / naive max |error|", "N (keys)", "R(N)", true, true, {}, {}};
  for (const auto& p : study.points) {
    for (const auto& [kernel, d] : {std::pair{"naive", &p.naive}, {"flash", &p.flash}}) {
      csv << p.format->name << ',' << inputs_name(p.inputs) << ',' << p.head_dim << ',' << p.n << ','
          << kernel << ',' << decimal(d->max_absolute) << ',' << decimal(d->max_ulps) << ','
          << decimal(d->rmse) << ',' << decimal(d->correctly_rounded) << '\n';
    }
    const std::string label =
        std::string(p.format->name) + " " + inputs_name(p.inputs) + " d=" + std::to_string(p.head_dim);
    if (chart.series.empty() || chart.series.back().label != label) {
      chart.series.push_back({label,
                              {},
                              {},
                              study_palette[chart.series.size() % std::size(study_palette)],
                              p.inputs == studies::DeviationInputs::outliers});
    }
    chart.series.back().x.push_back(static_cast<double>(p.n));
    chart.series.back().y.push_back(p.ratio());
  }
  csv.commit();
  io::write_file_atomically(out + "/flash_deviation_ratio.svg", io::render_svg(chart));
  const std::string summary = deviation_summary(study);
  io::write_file_atomically(out + "/flash_deviation_summary.md", summary);
  std::printf(
      "flash-deviation study written to %s: flash_deviation.csv, flash_deviation_ratio.svg, "
      "flash_deviation_summary.md\n%s",
      out.c_str(), summary.c_str());
  return exit_pass;
}

}  // namespace sharpcheck::cli
