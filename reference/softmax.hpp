// The correctly rounded reference for one row of logits: softmax, log-softmax, logsumexp and
// entropy at temperature theta.
//
// Accuracy contract: every returned value is the exact real result rounded to nearest-even in
// the target format (subnormals included, overflow as the format states), computed by Ziv's
// strategy on rigorous MPFR enclosures. Inputs are taken as exact reals (a float or any format
// value converts to double exactly).
//
// Definitions, with z_j = e_j / theta over the unmasked entries:
//   softmax_j     = exp(z_j) / sum_i exp(z_i)          (exactly 0 where masked)
//   log_softmax_j = z_j - log sum_i exp(z_i)           (-inf where masked)
//   logsumexp     = theta * log sum_i exp(z_i)         (so that it tends to max e as theta -> 0+)
//   entropy       = -sum_j p_j log p_j, in nats        (masked entries contribute 0)
// Masked entries are logits equal to -inf or entries whose keep flag is 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {

struct RowOptions {
  double theta = 1.0;  // any finite non-zero value; negative theta favours the smallest logit
  // Optional mask: keep[j] == 0 masks entry j. Empty means every entry is kept.
  std::span<const std::uint8_t> keep = {};
  // A row with every entry masked is an InputError by default; with this flag softmax returns
  // zeros, log_softmax -inf, logsumexp -inf and entropy 0 (as FlashAttention does).
  bool fully_masked_gives_zeros = false;
  ZivStatistics* statistics = nullptr;  // optional: filled with what the Ziv loop did
  // Skip the fast Arb stage and decide everything with the MPFR loop (same results, slower):
  // for tests that check the two stages agree.
  bool mpfr_only = false;
};

[[nodiscard]] std::vector<double> softmax(std::span<const double> logits, const FloatFormat& target,
                                          const RowOptions& options = {});
[[nodiscard]] std::vector<double> log_softmax(std::span<const double> logits, const FloatFormat& target,
                                              const RowOptions& options = {});
[[nodiscard]] double logsumexp(std::span<const double> logits, const FloatFormat& target,
                               const RowOptions& options = {});
[[nodiscard]] double entropy(std::span<const double> logits, const FloatFormat& target,
                             const RowOptions& options = {});

// Float inputs, converted exactly.
[[nodiscard]] std::vector<double> softmax(std::span<const float> logits, const FloatFormat& target,
                                          const RowOptions& options = {});

}  // namespace sharpcheck::reference
