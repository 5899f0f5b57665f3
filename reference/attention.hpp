// The correctly rounded reference for one attention head.
//
// output_i = sum_j p_ij V_j with p_ij = softmax_j(z_ij) over the keys query i may see, and
// logits z_ij = scale * (Q_i . K_j) / theta. The dot products are exact (exact products, an
// exactly rounded sum), never a float dot product.
//
// Accuracy contract: every output element (and every weight, when asked for) is the exact real
// result rounded to nearest-even in the target format, as in reference/softmax.hpp.
//
// Scale semantics: with no scale given, the scale is exactly 1/sqrt(d) as a real number (so
// for d = 128 it is irrational and never rounded); a given scale is used exactly as the double
// it is (pass float(1/sqrt(d)) to match a kernel that rounds its scale to fp32).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "core/errors.hpp"
#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {

struct AttentionOptions {
  std::optional<double> scale;  // nullopt: exactly 1/sqrt(d)
  double theta = 1.0;           // any finite non-zero temperature
  // Optional mask, queries x keys row-major: keep[i * n + j] == 0 hides key j from query i.
  std::span<const std::uint8_t> keep = {};
  // Causal masking aligned top-left, as PyTorch's is_causal: query i sees keys j <= i.
  bool causal = false;
  // A query that sees no key is an InputError by default; with this flag its output is zeros.
  bool fully_masked_gives_zeros = false;
  bool return_weights = false;
  ZivStatistics* statistics = nullptr;
  bool mpfr_only = false;  // skip the fast Arb stage (same results, slower), for tests
};

struct AttentionResult {
  Matrix output;                  // queries x value columns
  std::optional<Matrix> weights;  // queries x keys, when asked for
};

// queries: m x d, keys: n x d, values: n x dv. All entries finite.
[[nodiscard]] AttentionResult attention(const Matrix& queries, const Matrix& keys, const Matrix& values,
                                        const FloatFormat& target, const AttentionOptions& options = {});

}  // namespace sharpcheck::reference
