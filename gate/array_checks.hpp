// What the array judges (gate/judge_arrays.cpp, gate/judge_backward_arrays.cpp) share: how they
// refuse bad input, name shapes and kernels, check values and name elements. Shared by the array judges of
// gate/ and ops/.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "gate/judge_arrays.hpp"

namespace sharpcheck::gate {

[[noreturn]] inline void refuse(InputProblem problem, const std::string& message) {
  throw InputError(problem, "judge: " + message);
}

inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t axis = 0; axis < shape.size(); ++axis)
    text += (axis ? ", " : "") + std::to_string(shape[axis]);
  return text + "]";
}

inline void require_elements(const Array& array) {
  if (array.size() == 0) {
    refuse(InputProblem::empty_input,
           array.name() + " holds no element (shape " + shape_text(array.shape()) + ")");
  }
}

// The caller's name (compare names files by gate::kernel_name_of, Python by the test), else the
// outputs' own.
inline std::string kernel_name(const JudgeOptions& options, const Array& output) {
  return options.name.empty() ? "compare:" + output.name() : options.name;
}

// Every output must be a value of its format (log-probabilities may also be -inf, a masked entry).
inline void require_value_of(double value, const StoredFormat& stored, const std::string& name,
                             std::size_t index, bool minus_infinity_allowed = false) {
  if (minus_infinity_allowed && value == -INFINITY) return;
  if (!is_representable(value, *stored.format)) {
    refuse(InputProblem::out_of_range, name + ": element " + std::to_string(index) + " (" + hex_float(value) +
                                           ") is not a " + stored.name + " value");
  }
}

// The multi-index of C-order position `flat` in an array of this shape.
inline std::vector<std::size_t> unravel(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t axis = shape.size(); axis-- > 0;) {
    index[axis] = flat % shape[axis];
    flat /= shape[axis];
  }
  return index;
}

// Every element finite, read in blocks: a NaN or infinity in an input (q, k, v) is named by its
// array (compare: the option and the file) and full index, where the reference, working head by
// head, could name only the head and a position within it.
inline void require_finite(const Array& array) {
  std::vector<double> block(std::min<std::size_t>(array.size(), std::size_t{1} << 16));
  for (std::size_t first = 0; first < array.size(); first += block.size()) {
    const std::size_t count = std::min(block.size(), array.size() - first);
    array.read(first, {block.data(), count});
    for (std::size_t i = 0; i < count; ++i) {
      if (std::isfinite(block[i])) continue;
      refuse(std::isnan(block[i]) ? InputProblem::nan_value : InputProblem::non_finite_value,
             array.name() + shape_text(unravel(first + i, array.shape())) + " is " +
                 (std::isnan(block[i]) ? "NaN" : "infinite"));
    }
  }
}

inline std::vector<std::size_t> without_unit_axes(const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> kept;
  for (const std::size_t extent : shape) {
    if (extent != 1) kept.push_back(extent);
  }
  return kept;
}

// Whether an array of shape `got` holds the elements of shape `want` in the same C order with the
// same axes: equal once axes of extent 1 are dropped, or, where want's last two axes are the heads
// and the value dimension (bshd, packed), with those merged. In bhsd they are the positions and the
// dimension: merged, an output flattened to [S * D] passed for B = H = 1.
inline bool same_order_shape(const std::vector<std::size_t>& got, const std::vector<std::size_t>& want,
                             bool heads_then_dim) {
  const std::vector<std::size_t> g = without_unit_axes(got), w = without_unit_axes(want);
  if (g == w) return true;
  if (want.size() < 2 || !heads_then_dim) return false;
  std::vector<std::size_t> merged(want.begin(), want.end() - 1);
  merged.back() *= want.back();
  return g == without_unit_axes(merged);
}

}  // namespace sharpcheck::gate
