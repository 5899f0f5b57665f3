#include "reference/attention_double_block.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/double_stage.hpp"
#include "reference/double_stage_row.hpp"
#include "reference/enclosed_product.hpp"

namespace sharpcheck::reference {
namespace {

// The block's keys, [first, first + width), and its row-major pair matrices (rows x width).
struct BlockKeys {
  std::size_t first = 0, width = 0;
};

BlockKeys keys_seen(std::span<const AttentionRow> rows) {
  std::size_t first = SIZE_MAX, last = 0;
  for (const AttentionRow& row : rows) {
    for (const std::size_t key : row.active) {
      first = std::min(first, key);
      last = std::max(last, key + 1);
    }
  }
  return first < last ? BlockKeys{first, last - first} : BlockKeys{};
}

MatrixOperand operand(const std::vector<double>& values, std::size_t rows, std::size_t cols,
                      bool transposed = false) {
  return {values.data(), rows, cols, cols, transposed};
}

// Rows [first, first + count) of a head matrix, in place.
MatrixOperand rows_of(const Matrix& m, std::size_t first, std::size_t count, bool transposed = false) {
  return {m.values.data() + first * m.cols, count, m.cols, m.cols, transposed};
}

// Q K^T and |Q| |K|^T over the block's keys into dots and absolutes (rows x width).
void pair_products(std::span<const AttentionRow> rows, const HeadImages& images, const BlockKeys& keys,
                   std::vector<double>& dots, std::vector<double>& absolutes) {
  const std::size_t d = rows.front().keys.cols;
  thread_local std::vector<double> q, q_abs;
  q.resize(rows.size() * d);
  q_abs.resize(rows.size() * d);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].query.begin(), rows[r].query.end(), q.begin() + static_cast<std::ptrdiff_t>(r * d));
    for (std::size_t t = 0; t < d; ++t) q_abs[r * d + t] = std::fabs(rows[r].query[t]);
  }
  dots.assign(rows.size() * keys.width, 0.0);
  absolutes.assign(rows.size() * keys.width, 0.0);
  if (d == 0) return;
  plain_product(operand(q, rows.size(), d), rows_of(rows.front().keys, keys.first, keys.width, true),
                dots.data(), keys.width);
  plain_product(operand(q_abs, rows.size(), d), rows_of(images.key_magnitudes, keys.first, keys.width, true),
                absolutes.data(), keys.width);
}

// One row's state between the products.
struct RowState {
  std::vector<double> logits, errors, exponentials, dots, absolutes;
  bool taken = false;  // the stage decides this row's outputs after the value products
};

// Row r's logits, exponentials and sum from the pair products; its coefficients decided; its
// exponentials into W (row r, at its keys).
AttentionRowInDouble bound_row(const AttentionRow& row, const FloatFormat& target, const BlockKeys& keys,
                               std::size_t r, const std::vector<double>& dots,
                               const std::vector<double>& absolutes, RowState& state,
                               std::vector<double>& scratch, std::vector<double>& w,
                               AttentionRowResults& results) {
  const std::size_t count = row.entries();
  state.logits.resize(count);
  state.errors.resize(count);
  state.exponentials.resize(count);
  AttentionRowInDouble bounded{state.logits, state.errors, state.exponentials};
  state.taken = false;
  if (!attention_double_stage_applies(row, target)) return bounded;
  state.dots.resize(row.active.size());
  state.absolutes.resize(row.active.size());
  for (std::size_t a = 0; a < row.active.size(); ++a) {
    state.dots[a] = dots[r * keys.width + row.active[a] - keys.first];
    state.absolutes[a] = absolutes[r * keys.width + row.active[a] - keys.first];
  }
  if (!bound_attention_logits(row, state.dots, state.absolutes, bounded)) return bounded;
  bound_attention_exponentials(count, scratch, bounded);
  decide_attention_weights(row, target, bounded, results);
  for (std::size_t a = 0; a < row.active.size(); ++a)
    w[r * keys.width + row.active[a] - keys.first] = state.exponentials[a];
  state.taken = true;
  return bounded;
}

}  // namespace

Matrix magnitudes_of(const Matrix& m) {
  Matrix out(m.rows, m.cols);
  for (std::size_t e = 0; e < m.values.size(); ++e) out.values[e] = std::fabs(m.values[e]);
  return out;
}

HeadImages::HeadImages(const Matrix& keys, const Matrix& values)
    : key_magnitudes(magnitudes_of(keys)), value_magnitudes(magnitudes_of(values)) {}

void decide_attention_block_in_double(std::span<const AttentionRow> rows, const HeadImages& images,
                                      const FloatFormat& target, std::span<AttentionRowResults> results) {
  if (rows.empty()) return;
  const BlockKeys keys = keys_seen(rows);
  if (keys.width == 0) return;
  thread_local std::vector<double> dots, absolutes, w, scratch, numerators, magnitudes;
  thread_local std::vector<RowState> states;
  pair_products(rows, images, keys, dots, absolutes);
  w.assign(rows.size() * keys.width, 0.0);
  states.resize(rows.size());
  std::vector<AttentionRowInDouble> bounded;
  bounded.reserve(rows.size());
  bool any_taken = false;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    bounded.push_back(
        bound_row(rows[r], target, keys, r, dots, absolutes, states[r], scratch, w, results[r]));
    any_taken = any_taken || states[r].taken;
  }
  if (!any_taken) return;
  const Matrix& v = rows.front().values;
  const std::size_t columns = v.cols;
  numerators.assign(rows.size() * columns, 0.0);
  magnitudes.assign(rows.size() * columns, 0.0);
  if (columns > 0) {
    plain_product(operand(w, rows.size(), keys.width), rows_of(v, keys.first, keys.width), numerators.data(),
                  columns);
    plain_product(operand(w, rows.size(), keys.width),
                  rows_of(images.value_magnitudes, keys.first, keys.width), magnitudes.data(), columns);
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (!states[r].taken) continue;
    decide_attention_outputs(rows[r], target, bounded[r], {numerators.data() + r * columns, columns},
                             {magnitudes.data() + r * columns, columns}, results[r]);
    decide_lse_in_double(bounded[r], rows[r].entries(), results[r]);
  }
}

}  // namespace sharpcheck::reference
