// PNG copies of io::Chart plots through gnuplot, when it is installed: the SVG (io/svg_plot.hpp)
// is the complete plot; the PNG is a convenience for viewers that do not show SVG.
#pragma once

#include <string>

#include "io/svg_plot.hpp"

namespace sharpcheck::io {

enum class PngResult { written, no_gnuplot, failed };

// Writes `png_path` from the chart (log axes, dashed series and markers as the SVG has them).
// Its data and script go to png_path + ".dat"/".gp" and are removed afterwards. A path holding a
// quote character cannot be passed to gnuplot safely: failed, nothing run.
[[nodiscard]] PngResult write_png(const Chart& chart, const std::string& png_path);

// Writes stem.svg and, when gnuplot is installed, stem.png; returns a note for the user when no
// PNG was written ("" otherwise).
std::string write_chart(const Chart& chart, const std::string& stem);

}  // namespace sharpcheck::io
