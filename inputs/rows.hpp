// Deterministic rows of logits that stress softmax kernels (in the spirit of oneDNN benchdnn's
// fills): every row is a function of (kind, n, format, seed) alone, its values already values
// of the input format.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "formats/float_format.hpp"

namespace sharpcheck::inputs {

enum class RowKind {
  random_normal,      // N(0, 3^2)
  spread_controlled,  // min 0 and max delta present, the rest uniform in between
  all_negative,       // uniform in [-80, -20]: every exp argument is far below 0 before the shift
  near_overflow,      // uniform in [80, 88.7]: exp overflows fp32 without a max shift
  tied_maxima,        // up to 8 copies of the maximum over N(0, 1) below it
  spike_over_noise,   // N(0, 0.1^2) with one logit 10 above
  masked_entries,     // N(0, 3^2) with about a quarter set to -inf (never all)
  uniform,            // every logit 0: the exact answer is 1/n
};

inline constexpr RowKind all_row_kinds[] = {
    RowKind::random_normal, RowKind::spread_controlled, RowKind::all_negative,   RowKind::near_overflow,
    RowKind::tied_maxima,   RowKind::spike_over_noise,  RowKind::masked_entries, RowKind::uniform};

[[nodiscard]] std::string_view row_kind_name(RowKind kind);
[[nodiscard]] std::optional<RowKind> find_row_kind(std::string_view name);

// The default spread is the paper's mean measured spread of Gemma 2B heads.
[[nodiscard]] std::vector<double> make_row(RowKind kind, std::size_t n, const FloatFormat& format,
                                           std::uint64_t seed, double spread = 5.69);

}  // namespace sharpcheck::inputs
