// RapidCheck generators for softmax and attention inputs, named as sentences. Every logit is an
// fp32 value (what kernels take), rows have 1 to `max_size` entries, and every generator shrinks
// toward short rows of small integers, so counterexamples come back small.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::properties {

using Row = std::vector<double>;

// An fp32 logit in [-limit, limit]: an integer part plus a fraction in 1/1024ths, so shrinking
// goes to small integers first.
inline rc::Gen<double> a_logit_within(int limit) {
  return rc::gen::map(
      rc::gen::tuple(rc::gen::inRange(-limit, limit + 1), rc::gen::inRange(0, 1024)),
      [](const std::tuple<int, int>& parts) {
        return static_cast<double>(static_cast<float>(std::get<0>(parts) + std::get<1>(parts) / 1024.0));
      });
}

inline rc::Gen<Row> rows_of_logits_within(int limit, int max_size = 64) {
  return rc::gen::resize(max_size, rc::gen::nonEmpty(rc::gen::container<Row>(a_logit_within(limit))));
}

// Rows whose entries all lie in [0, delta] with both ends present: spread exactly delta.
inline rc::Gen<Row> rows_with_spread(double delta, int max_size = 64) {
  return rc::gen::map(
      rc::gen::pair(
          rc::gen::resize(max_size, rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 1025))),
          rc::gen::inRange(0, 1000)),
      [delta](const std::pair<std::vector<int>, int>& parts) {
        Row row{0.0, static_cast<double>(static_cast<float>(delta))};
        for (const int fraction : parts.first) {
          row.push_back(static_cast<double>(static_cast<float>(delta * fraction / 1024.0)));
        }
        // Place the extremes at a drawn position so they are not always first.
        std::rotate(row.begin(), row.begin() + parts.second % row.size(), row.end());
        return row;
      });
}

// Rows near fp32's exp overflow threshold (about 88.72): kernels without a max shift overflow.
inline rc::Gen<Row> rows_near_the_exp_overflow_threshold(int max_size = 64) {
  return rc::gen::map(rows_of_logits_within(8, max_size), [](Row row) {
    for (double& e : row) e = static_cast<double>(static_cast<float>(80.0 + std::fabs(e)));
    return row;
  });
}

inline rc::Gen<Row> all_negative_rows(int max_size = 64) {
  return rc::gen::map(rows_of_logits_within(60, max_size), [](Row row) {
    for (double& e : row) e = -1.0 - std::fabs(e);
    return row;
  });
}

// Several entries equal to the row's maximum.
inline rc::Gen<Row> rows_with_tied_maxima(int max_size = 64) {
  return rc::gen::map(rc::gen::pair(rows_of_logits_within(10, max_size), rc::gen::inRange(2, 9)),
                      [](const std::pair<Row, int>& parts) {
                        Row row = parts.first;
                        const double top = *std::max_element(row.begin(), row.end());
                        for (int copy = 0; copy < parts.second; ++copy) row.push_back(top);
                        return row;
                      });
}

// Flat noise within +-1/4 and one logit `height` above it.
inline rc::Gen<Row> a_spike_over_flat_noise(int max_size = 64) {
  return rc::gen::map(rc::gen::pair(rows_of_logits_within(0, max_size), rc::gen::inRange(1, 30)),
                      [](const std::pair<Row, int>& parts) {
                        Row row = parts.first;
                        for (double& e : row) e /= 4;
                        row.push_back(static_cast<double>(parts.second));
                        return row;
                      });
}

// Some entries -inf (masked), never all of them.
inline rc::Gen<Row> rows_with_masked_entries(int max_size = 64) {
  return rc::gen::map(rc::gen::pair(rows_of_logits_within(10, max_size),
                                    rc::gen::container<std::vector<bool>>(rc::gen::arbitrary<bool>())),
                      [](const std::pair<Row, std::vector<bool>>& parts) {
                        Row row = parts.first;
                        for (std::size_t j = 1; j < row.size() && j - 1 < parts.second.size(); ++j) {
                          if (parts.second[j - 1]) row[j] = -std::numeric_limits<double>::infinity();
                        }
                        return row;
                      });
}

// Any of the above: what kernel properties are checked on.
inline rc::Gen<Row> any_stressing_row(int max_size = 64) {
  return rc::gen::oneOf(rows_of_logits_within(20, max_size), rows_with_spread(5.69, max_size),
                        rows_near_the_exp_overflow_threshold(max_size), all_negative_rows(max_size),
                        rows_with_tied_maxima(max_size), a_spike_over_flat_noise(max_size),
                        rows_with_masked_entries(max_size));
}

// A generated row as a one-row matrix, as the kernels and metrics take it.
inline Matrix as_matrix(const Row& row) {
  Matrix matrix(1, row.size());
  std::copy(row.begin(), row.end(), matrix.values.begin());
  return matrix;
}

// Rounds a generated fp32 row into a kernel's input format.
inline Row in_format(Row row, const FloatFormat& format) {
  for (double& e : row) e = round_to_format(e, format);
  return row;
}

inline rc::Gen<double> a_temperature() {
  return rc::gen::map(rc::gen::inRange(1, 41), [](int tenths) { return tenths / 10.0; });
}

// A matrix of the given shape with entries N(0,1)-like integers over 8 (small and shrinkable).
inline rc::Gen<Matrix> a_matrix(std::size_t rows, std::size_t cols) {
  return rc::gen::map(rc::gen::container<std::vector<int>>(rows * cols, rc::gen::inRange(-24, 25)),
                      [rows, cols](const std::vector<int>& entries) {
                        Matrix matrix(rows, cols);
                        for (std::size_t i = 0; i < entries.size(); ++i) matrix.values[i] = entries[i] / 8.0;
                        return matrix;
                      });
}

}  // namespace sharpcheck::properties
