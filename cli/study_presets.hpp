// The precision-study presets of `sharpcheck study` beyond the paper's (cli/study_command.cpp
// dispatches): each runs a study of studies/, writes its CSV, SVG and summary through io/, and
// prints the summary. Shared with study_command.cpp: how numbers and series look in its files.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace sharpcheck::cli {

inline constexpr const char* study_palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
// A double as CSV text that reads back exactly.
[[nodiscard]] std::string decimal(double value);

// `study --preset denominator-stall` (studies/denominator_stall.hpp).
int run_stall_preset(const std::string& out, const std::vector<std::size_t>& sizes);
// `study --preset flash-deviation` (studies/flash_deviation.hpp).
int run_flash_deviation_preset(const std::string& out, const std::vector<std::size_t>& sizes,
                               unsigned threads, std::size_t tile);

}  // namespace sharpcheck::cli
