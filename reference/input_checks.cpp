#include "reference/input_checks.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "formats/float_format.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::reference {
namespace {

thread_local std::vector<std::size_t> spare_indices;  // the buffer the last PreparedRow gave back

}  // namespace

PreparedRow::PreparedRow() {
  active.swap(spare_indices);
  active.clear();
}

PreparedRow::~PreparedRow() {
  if (active.capacity() > spare_indices.capacity()) {
    active.clear();
    spare_indices.swap(active);
  }
}

void check_temperature(double theta, std::string_view operation) {
  if (!std::isfinite(theta) || theta == 0.0) {
    throw InputError(
        InputProblem::bad_temperature,
        std::string(operation) + ": temperature theta must be finite and non-zero, got " + hex_float(theta));
  }
}

PreparedRow prepare_row(std::span<const double> logits, std::span<const std::uint8_t> keep, double theta,
                        bool allow_fully_masked, std::string_view operation) {
  const std::string name(operation);
  if (logits.empty()) throw InputError(InputProblem::empty_input, name + ": the row of logits is empty");
  check_temperature(theta, operation);
  if (!keep.empty() && keep.size() != logits.size()) {
    throw InputError(InputProblem::shape_mismatch, name + ": mask has " + std::to_string(keep.size()) +
                                                       " entries but the row has " +
                                                       std::to_string(logits.size()) + " logits");
  }
  PreparedRow row;
  for (std::size_t j = 0; j < logits.size(); ++j) {
    const double logit = logits[j];
    if (std::isnan(logit)) {
      throw InputError(InputProblem::nan_value, name + ": logit " + std::to_string(j) + " is NaN");
    }
    if (logit == INFINITY) {
      throw InputError(InputProblem::positive_infinity, name + ": logit " + std::to_string(j) + " is +inf");
    }
    if (logit == -INFINITY || (!keep.empty() && keep[j] == 0)) continue;
    row.active.push_back(j);
  }
  if (row.active.empty()) {
    if (allow_fully_masked) return row;
    throw InputError(InputProblem::fully_masked_row,
                     name + ": every one of the " + std::to_string(logits.size()) + " entries is masked");
  }
  row.shift = logits[row.active.front()];
  row.all_equal = true;
  for (const std::size_t j : row.active) {
    if (logits[j] != row.shift) row.all_equal = false;
    if (theta > 0 ? logits[j] > row.shift : logits[j] < row.shift) row.shift = logits[j];
  }
  return row;
}

void check_all_finite(const Matrix& matrix, std::string_view operation, std::string_view what) {
  for (std::size_t r = 0; r < matrix.rows; ++r) {
    for (std::size_t c = 0; c < matrix.cols; ++c) {
      const double value = matrix(r, c);
      if (!std::isfinite(value)) {
        throw InputError(std::isnan(value) ? InputProblem::nan_value : InputProblem::non_finite_value,
                         std::string(operation) + ": " + std::string(what) + "(" + std::to_string(r) + ", " +
                             std::to_string(c) + ") is " + (std::isnan(value) ? "NaN" : "infinite"));
      }
    }
  }
}

namespace {

// Flat index `flat` of a stored Q, K or V as its full index in the problem's layout: bhsd
// [b, h, s, c], bshd [b, s, h, c], packed [t, h, c] (the index a user finds the value at).
std::string stored_index(const tensor::AttentionProblem& problem, char tensor, std::size_t flat) {
  const tensor::AttentionShape& shape = problem.shape;
  const std::size_t heads = tensor == 'Q' ? shape.heads : shape.kv_heads;
  const std::size_t rows = tensor == 'Q' ? problem.stored_queries() : problem.stored_keys();
  const std::size_t columns = tensor == 'V' ? shape.value_dim : shape.head_dim;
  std::vector<std::size_t> extents;
  if (problem.layout == tensor::Layout::bhsd) extents = {shape.batch, heads, rows, columns};
  if (problem.layout == tensor::Layout::bshd) extents = {shape.batch, rows, heads, columns};
  if (problem.layout == tensor::Layout::packed) extents = {rows, heads, columns};
  std::vector<std::size_t> index(extents.size());
  for (std::size_t axis = extents.size(); axis-- > 0;) {
    index[axis] = extents[axis] == 0 ? 0 : flat % extents[axis];
    flat = extents[axis] == 0 ? flat : flat / extents[axis];
  }
  std::string text = "[";
  for (std::size_t axis = 0; axis < index.size(); ++axis)
    text += (axis > 0 ? ", " : "") + std::to_string(index[axis]);
  return text + "] (" + std::string(tensor::layout_name(problem.layout)) + ")";
}

}  // namespace

void check_tensor_sizes(const tensor::AttentionProblem& problem, std::span<const double> q,
                        std::span<const double> k, std::span<const double> v) {
  const auto check = [](std::size_t got, std::size_t expected, const char* name) {
    if (got != expected) {
      throw InputError(InputProblem::shape_mismatch,
                       std::string("attention: ") + name + " has " + std::to_string(got) +
                           " elements, the problem needs " + std::to_string(expected));
    }
  };
  check(q.size(), problem.query_elements(), "Q");
  check(k.size(), problem.key_elements(), "K");
  check(v.size(), problem.value_elements(), "V");
  for (const auto& [data, name] : {std::pair{q, 'Q'}, std::pair{k, 'K'}, std::pair{v, 'V'}}) {
    const auto bad = std::find_if(data.begin(), data.end(), [](double x) { return !std::isfinite(x); });
    if (bad == data.end()) continue;
    throw InputError(std::isnan(*bad) ? InputProblem::nan_value : InputProblem::non_finite_value,
                     std::string("attention: ") + name +
                         stored_index(problem, name, static_cast<std::size_t>(bad - data.begin())) + " is " +
                         (std::isnan(*bad) ? "NaN" : "infinite"));
  }
}

}  // namespace sharpcheck::reference
