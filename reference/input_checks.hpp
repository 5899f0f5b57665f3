// Validation shared by the reference operations: every bad input becomes an InputError that
// names the operation, the argument and the position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/errors.hpp"
#include "core/matrix.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::reference {

// A row of logits after validation.
struct PreparedRow {
  std::vector<std::size_t> active;  // indices of the unmasked entries, in order
  double shift = 0.0;  // the unmasked logit that maximises e / theta (max for theta > 0, min for theta < 0)
  bool all_equal = false;  // every unmasked logit is the same value

  // The index buffer is reused from call to call on a thread: allocating and freeing it per call
  // let glibc return the pages to the system and fault them in again, which doubled the cost of a
  // 16,384-entry softmax (docs/performance.md).
  PreparedRow();
  ~PreparedRow();
  PreparedRow(PreparedRow&&) noexcept = default;
  PreparedRow& operator=(PreparedRow&&) noexcept = default;
  PreparedRow(const PreparedRow&) = delete;
  PreparedRow& operator=(const PreparedRow&) = delete;
};

// Throws InputError for: empty logits, a non-finite or zero theta, a mask of the wrong length, a
// NaN or +inf logit (with its index), and a fully masked row unless that is allowed.
[[nodiscard]] PreparedRow prepare_row(std::span<const double> logits, std::span<const std::uint8_t> keep,
                                      double theta, bool allow_fully_masked, std::string_view operation);

void check_temperature(double theta, std::string_view operation);

// Throws InputError naming `what` and the (row, column) of the first NaN or infinity.
void check_all_finite(const Matrix& matrix, std::string_view operation, std::string_view what);

// Throws InputError when Q, K or V has the wrong number of elements for the problem, or holds a NaN
// or an infinity (named at its full index in the problem's layout).
void check_tensor_sizes(const tensor::AttentionProblem& problem, std::span<const double> q,
                        std::span<const double> k, std::span<const double> v);

}  // namespace sharpcheck::reference
