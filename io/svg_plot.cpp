#include "io/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/text.hpp"

namespace sharpcheck::io {
namespace {

constexpr double width = 900;
constexpr double height = 560;
constexpr double left = 90;
constexpr double right = 250;
constexpr double top = 50;
constexpr double bottom = 70;

std::string number_label(double value, bool logarithmic) {
  char text[32];
  if (logarithmic) {
    std::snprintf(text, sizeof text, "1e%d", static_cast<int>(std::lround(std::log10(value))));
  } else {
    std::snprintf(text, sizeof text, "%g", value);
  }
  return text;
}

struct Axis {
  double low = 0;
  double high = 1;
  bool logarithmic = true;
  [[nodiscard]] double fraction(double value) const {
    if (logarithmic) return (std::log10(value) - std::log10(low)) / (std::log10(high) - std::log10(low));
    return (value - low) / (high - low);
  }
};

Axis make_axis(const std::vector<double>& values, bool logarithmic) {
  Axis axis{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), logarithmic};
  for (const double v : values) {
    if (!std::isfinite(v) || (logarithmic && v <= 0)) continue;
    axis.low = std::min(axis.low, v);
    axis.high = std::max(axis.high, v);
  }
  if (!std::isfinite(axis.low)) return {1, 10, logarithmic};
  if (logarithmic) {
    axis.low = std::pow(10.0, std::floor(std::log10(axis.low)));
    axis.high = std::pow(10.0, std::ceil(std::log10(axis.high)));
    if (axis.low == axis.high) axis.high = axis.low * 10;
  } else if (axis.low == axis.high) {
    axis.high = axis.low + 1;
  }
  return axis;
}

// The plot area and its axes: data coordinates to pixels.
struct Plot {
  Axis x_axis, y_axis;
  double plot_width = width - left - right;
  double plot_height = height - top - bottom;
  [[nodiscard]] double px(double x) const { return left + plot_width * x_axis.fraction(x); }
  [[nodiscard]] double py(double y) const { return top + plot_height * (1 - y_axis.fraction(y)); }
};

// Grid and tick labels: decades on log axes, ten steps on linear ones.
std::vector<double> ticks(const Axis& axis) {
  std::vector<double> values;
  if (axis.logarithmic) {
    for (double v = axis.low; v <= axis.high * 1.0001; v *= 10) values.push_back(v);
  } else {
    for (int i = 0; i <= 10; ++i) values.push_back(axis.low + (axis.high - axis.low) * i / 10);
  }
  return values;
}

void draw_frame(std::ostringstream& svg, const Chart& chart, const Plot& plot) {
  for (const double v : ticks(plot.x_axis)) {
    svg << "<line x1=\"" << plot.px(v) << "\" y1=\"" << top << "\" x2=\"" << plot.px(v) << "\" y2=\""
        << top + plot.plot_height << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << plot.px(v) << "\" y=\""
        << top + plot.plot_height + 18 << "\" text-anchor=\"middle\">"
        << number_label(v, plot.x_axis.logarithmic) << "</text>\n";
  }
  for (const double v : ticks(plot.y_axis)) {
    svg << "<line x1=\"" << left << "\" y1=\"" << plot.py(v) << "\" x2=\"" << left + plot.plot_width
        << "\" y2=\"" << plot.py(v) << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << left - 8 << "\" y=\""
        << plot.py(v) + 4 << "\" text-anchor=\"end\">" << number_label(v, plot.y_axis.logarithmic)
        << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot.plot_width << "\" height=\""
      << plot.plot_height << "\" fill=\"none\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << left + plot.plot_width / 2 << "\" y=\"" << height - 25
      << "\" text-anchor=\"middle\">" << xml_escape(chart.x_label) << "</text>\n";
  svg << "<text transform=\"translate(22," << top + plot.plot_height / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(chart.y_label) << "</text>\n";
}

void draw_markers(std::ostringstream& svg, const Chart& chart, const Plot& plot) {
  double marker_label_y = top + 12;
  for (const auto& marker : chart.markers) {
    if (marker.x < plot.x_axis.low || marker.x > plot.x_axis.high) continue;
    marker_label_y += 12;  // staggered, so labels of nearby markers do not overlap
    svg << "<line x1=\"" << plot.px(marker.x) << "\" y1=\"" << top << "\" x2=\"" << plot.px(marker.x)
        << "\" y2=\"" << top + plot.plot_height << "\" stroke=\"" << marker.colour
        << "\" stroke-dasharray=\"2,3\"/>\n<text x=\"" << plot.px(marker.x) + 3 << "\" y=\"" << marker_label_y
        << "\" fill=\"" << marker.colour << "\" font-size=\"10\">" << xml_escape(marker.label) << "</text>\n";
  }
}

void draw_series(std::ostringstream& svg, const Chart& chart, const Plot& plot) {
  double legend_y = top + 10;
  for (const auto& s : chart.series) {
    std::ostringstream path;
    bool pen_down = false;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const bool plottable = std::isfinite(s.y[i]) && std::isfinite(s.x[i]) && (!chart.log_y || s.y[i] > 0) &&
                             (!chart.log_x || s.x[i] > 0);
      if (!plottable) {
        pen_down = false;
        continue;
      }
      path << (pen_down ? " L" : " M") << plot.px(s.x[i]) << "," << plot.py(s.y[i]);
      pen_down = true;
      if (s.markers) {
        svg << "<circle cx=\"" << plot.px(s.x[i]) << "\" cy=\"" << plot.py(s.y[i]) << "\" r=\"2.5\" fill=\""
            << s.colour << "\"/>\n";
      }
    }
    svg << "<path d=\"" << path.str() << "\" fill=\"none\" stroke=\"" << s.colour << "\" stroke-width=\"1.6\""
        << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>\n";
    svg << "<line x1=\"" << width - right + 15 << "\" y1=\"" << legend_y << "\" x2=\"" << width - right + 40
        << "\" y2=\"" << legend_y << "\" stroke=\"" << s.colour << "\" stroke-width=\"2\""
        << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>\n<text x=\"" << width - right + 45
        << "\" y=\"" << legend_y + 4 << "\">" << xml_escape(s.label) << "</text>\n";
    legend_y += 18;
  }
}

}  // namespace

std::string render_svg(const Chart& chart) {
  std::vector<double> xs;
  std::vector<double> ys;
  for (const auto& s : chart.series) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
  }
  const Plot plot{make_axis(xs, chart.log_x), make_axis(ys, chart.log_y)};
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n";
  svg << "<text x=\"" << width / 2 << "\" y=\"25\" text-anchor=\"middle\" font-size=\"15\">"
      << xml_escape(chart.title) << "</text>\n";
  draw_frame(svg, chart, plot);
  draw_markers(svg, chart, plot);
  draw_series(svg, chart, plot);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace sharpcheck::io
