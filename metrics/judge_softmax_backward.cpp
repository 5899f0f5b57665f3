// The softmax and log-softmax backward judge (metrics/judge_backward.hpp), apart from the attention
// backward's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "metrics/judge_backward.hpp"
#include "metrics/tolerance_table.hpp"
#include "reference/softmax_backward.hpp"

namespace sharpcheck::metrics {

Comparison judge_softmax_backward(const kernels::SoftmaxBackwardKernel& kernel, const Matrix& logits,
                                  const Matrix& dy, const Matrix& dx) {
  return judge_softmax_backward(kernel.log_softmax, kernel.tolerance, *kernel.format, logits, dy, dx);
}

Comparison judge_softmax_backward(bool log_softmax, const Tolerance& tolerance, const FloatFormat& format,
                                  const Matrix& logits, const Matrix& dy, const Matrix& dx) {
  Matrix expected(logits.rows, logits.cols), magnitudes(logits.rows, logits.cols);
  const Matrix zeros(logits.rows, logits.cols);
  std::vector<RowScale> scales(logits.rows);
  reference::RowOptions options;
  options.fully_masked_gives_zeros = true;
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const auto row = logits.row(r), gradient = dy.row(r);
    const auto exact = log_softmax ? reference::log_softmax_backward(row, gradient, format, options)
                                   : reference::softmax_backward(row, gradient, format, options);
    std::copy(exact.begin(), exact.end(), expected.row(r).begin());
    double top = -INFINITY, bottom = INFINITY, sum = 0, weighted = 0, absolute = 0;
    for (const double x : row) {
      if (x != -INFINITY) top = std::max(top, x);
    }
    // As for the forward softmax: entries more than negligible_below under the top (an additive
    // mask of -1e9) are counted as negligible, not in n or the spread (metrics/tolerance_table.cpp).
    for (const double x : row) {
      if (x == -INFINITY) continue;
      if (top - x > negligible_below) {
        ++scales[r].negligible;
        continue;
      }
      bottom = std::min(bottom, x);
      ++scales[r].n;
    }
    if (scales[r].n == 0) continue;
    scales[r].largest_magnitude = top - bottom;
    std::vector<double> y(row.size(), 0.0);
    for (std::size_t j = 0; j < row.size(); ++j)
      sum += y[j] = row[j] == -INFINITY ? 0.0 : std::exp(row[j] - top);
    for (std::size_t j = 0; j < row.size(); ++j) {
      y[j] /= sum;
      if (row[j] == -INFINITY) continue;
      weighted += y[j] * std::fabs(gradient[j]);
      absolute += std::fabs(gradient[j]);
    }
    for (std::size_t j = 0; j < row.size(); ++j) {
      if (row[j] == -INFINITY) continue;
      const double g = std::fabs(gradient[j]);
      magnitudes(r, j) = (log_softmax ? g + y[j] * absolute : y[j] * (g + weighted)) * (1 + 1e-9);
    }
  }
  ComparisonInput input{&expected, &dx, &magnitudes, &zeros, scales, false};
  input.output_rounding_of_expected = true;
  return compare(input, tolerance, format);
}

}  // namespace sharpcheck::metrics
