#include "io/chart_png.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/atomic_file.hpp"

namespace sharpcheck::io {
namespace {

bool gnuplot_installed() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

std::string quoted(const std::string& text) {
  std::string result = "'";
  for (const char c : text) result += c == '\'' ? std::string("''") : std::string(1, c);
  return result + "'";
}

// One data block per series (gnuplot's "index"), points a log axis cannot show left out.
void write_data(const Chart& chart, const std::string& path) {
  OutputFile data(path);
  data.precision(17);
  for (const Series& series : chart.series) {
    for (std::size_t i = 0; i < series.x.size() && i < series.y.size(); ++i) {
      if ((chart.log_x && !(series.x[i] > 0)) || (chart.log_y && !(series.y[i] > 0)) ||
          !std::isfinite(series.y[i]))
        continue;
      data << series.x[i] << ' ' << series.y[i] << '\n';
    }
    data << "\n\n";
  }
  data.commit();
}

void write_script(const Chart& chart, const std::string& png_path, const std::string& data_path,
                  const std::string& script_path) {
  OutputFile script(script_path);
  script << "set terminal pngcairo noenhanced size 1100,640\nset output " << quoted(png_path) << '\n'
         << "set title " << quoted(chart.title) << "\nset xlabel " << quoted(chart.x_label) << "\nset ylabel "
         << quoted(chart.y_label) << "\nset key outside right\n";
  if (chart.log_x) script << "set logscale x\n";
  if (chart.log_y) script << "set logscale y\n";
  for (const VerticalMarker& marker : chart.markers) {
    script << "set arrow from " << marker.x << ", graph 0 to " << marker.x << ", graph 1 nohead lc rgb "
           << quoted(marker.colour) << " dt 3\n"
           << "set label " << quoted(marker.label) << " at " << marker.x
           << ", graph 0.95 rotate by 90 right\n";
  }
  script << "plot ";
  for (std::size_t s = 0; s < chart.series.size(); ++s) {
    const Series& series = chart.series[s];
    script << (s == 0 ? "" : ", ") << quoted(data_path) << " index " << s << " with "
           << (series.markers ? "linespoints" : "lines") << " lc rgb " << quoted(series.colour)
           << (series.dashed ? " dt 2" : "") << " title " << quoted(series.label);
  }
  script << '\n';
  script.commit();
}

}  // namespace

PngResult write_png(const Chart& chart, const std::string& png_path) {
  if (png_path.find_first_of("'\"") != std::string::npos || chart.series.empty()) return PngResult::failed;
  if (!gnuplot_installed()) return PngResult::no_gnuplot;
  const std::string data_path = png_path + ".dat", script_path = png_path + ".gp";
  write_data(chart, data_path);
  write_script(chart, png_path, data_path, script_path);
  const int status = std::system(("gnuplot " + quoted(script_path) + " > /dev/null 2>&1").c_str());
  std::remove(data_path.c_str());
  std::remove(script_path.c_str());
  return status == 0 ? PngResult::written : PngResult::failed;
}

std::string write_chart(const Chart& chart, const std::string& stem) {
  write_file_atomically(stem + ".svg", render_svg(chart));
  switch (write_png(chart, stem + ".png")) {
    case PngResult::written:
      return "";
    case PngResult::no_gnuplot:
      return "gnuplot is not installed: no PNG copy of " + stem + ".svg (the SVG is complete)\n";
    case PngResult::failed:
      break;
  }
  return "gnuplot could not draw " + stem + ".png (the SVG is complete)\n";
}

}  // namespace sharpcheck::io
