// Minimal SVG line charts with log or linear axes: what `sharpcheck study` draws, with no
// plotting dependency (PNG copies come from gnuplot when it is installed).
#pragma once

#include <string>
#include <vector>

namespace sharpcheck::io {

struct Series {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;  // points with y <= 0 are skipped on a log axis (they have no place there)
  std::string colour = "#1f77b4";
  bool dashed = false;
  bool markers = true;
};

struct VerticalMarker {
  double x = 0;
  std::string label;
  std::string colour = "#888888";
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = true;
  bool log_y = true;
  std::vector<Series> series;
  std::vector<VerticalMarker> markers;
};

[[nodiscard]] std::string render_svg(const Chart& chart);

}  // namespace sharpcheck::io
