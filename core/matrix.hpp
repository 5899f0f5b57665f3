// A dense row-major matrix of doubles: the shape in which attention inputs and outputs travel.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace sharpcheck {

struct Matrix {
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<double> values;  // rows * cols, row-major

  Matrix() = default;
  Matrix(std::size_t row_count, std::size_t col_count, double fill = 0.0)
      : rows(row_count), cols(col_count), values(row_count * col_count, fill) {}

  [[nodiscard]] double& operator()(std::size_t row, std::size_t col) { return values[row * cols + col]; }
  [[nodiscard]] double operator()(std::size_t row, std::size_t col) const { return values[row * cols + col]; }
  [[nodiscard]] std::span<const double> row(std::size_t index) const {
    return {values.data() + index * cols, cols};
  }
  [[nodiscard]] std::span<double> row(std::size_t index) { return {values.data() + index * cols, cols}; }
};

}  // namespace sharpcheck
