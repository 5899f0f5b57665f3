// The precision-study presets of `sharpcheck study` beyond the paper's (cli/study_command.cpp
// dispatches): each runs a study of studies/, writes its CSV, SVG (+ PNG where gnuplot is
// installed) and summary through io/, and prints the summary. Shared with study_command.cpp: how
// numbers and series look in its files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sharpcheck::cli {

inline constexpr const char* study_palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
// A double as CSV text that reads back exactly.
[[nodiscard]] std::string decimal(double value);

// What the command line gives every preset.
struct PresetOptions {
  std::string out;
  std::vector<std::size_t> sizes;  // empty: the preset's own
  unsigned threads = 0;            // 0: every core
  std::uint64_t seed = 0;          // 0: the preset's own
  bool quick = false;              // CI's size: seconds, not minutes
  std::size_t tile = 64;           // flash-deviation: keys per FlashAttention tile
};

// `study --preset stall` (also `denominator-stall`; studies/denominator_stall.hpp).
int run_stall_preset(const PresetOptions& options);
// `study --preset flash-deviation` (studies/flash_deviation.hpp).
int run_flash_deviation_preset(const PresetOptions& options);
// `study --preset fp8-spread` (studies/fp8_spread.hpp).
int run_fp8_spread_preset(const PresetOptions& options);
// `study --preset backward-peers` (studies/backward_peers.hpp).
int run_backward_peers_preset(const PresetOptions& options);

}  // namespace sharpcheck::cli
