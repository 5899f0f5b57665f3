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

// Q K^T and |Q| |K|^T over the block's keys into dots and absolutes (rows x width).
void pair_products(std::span<const AttentionRow> rows, const BlockKeys& keys, std::vector<double>& dots,
                   std::vector<double>& absolutes) {
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
  const Matrix& k = rows.front().keys;
  pair_product_by_tiles(operand(q, rows.size(), d), k, keys.first, keys.width, KeyImage::values, dots.data());
  pair_product_by_tiles(operand(q_abs, rows.size(), d), k, keys.first, keys.width, KeyImage::magnitudes,
                        absolutes.data());
}

// One row's state between the products.
struct RowState {
  std::vector<double> logits, errors, exponentials, dots, absolutes;
  bool taken = false;  // the stage decides this row's outputs after the value products
};

// A block's products and rows, in buffers the thread keeps: dots and absolutes (rows x width, from
// pair_products), W (rows x width), the value products (rows x columns).
struct BlockWork {
  BlockKeys keys;
  std::vector<double> dots, absolutes, w, scratch, numerators, magnitudes;
  std::vector<RowState> states;
  [[nodiscard]] std::size_t at(std::size_t r, std::size_t key) const {
    return r * keys.width + key - keys.first;
  }
};

// Row r's logits, exponentials and sum from the pair products; its coefficients decided; its
// exponentials into W (row r, at its keys).
AttentionRowInDouble bound_row(const AttentionRow& row, const FloatFormat& target, std::size_t r,
                               BlockWork& work, AttentionRowResults& results) {
  RowState& state = work.states[r];
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
    state.dots[a] = work.dots[work.at(r, row.active[a])];
    state.absolutes[a] = work.absolutes[work.at(r, row.active[a])];
  }
  if (!bound_attention_logits(row, state.dots, state.absolutes, bounded)) return bounded;
  bound_attention_exponentials(count, work.scratch, bounded);
  decide_attention_weights(row, target, bounded, results);
  for (std::size_t a = 0; a < row.active.size(); ++a)
    work.w[work.at(r, row.active[a])] = state.exponentials[a];
  state.taken = true;
  return bounded;
}

}  // namespace

void decide_attention_block_in_double(std::span<const AttentionRow> rows, const FloatFormat& target,
                                      std::span<AttentionRowResults> results) {
  thread_local BlockWork work;
  work.keys = keys_seen(rows);
  const std::size_t width = work.keys.width, columns = rows.front().values.cols;
  if (width == 0) return;
  pair_products(rows, work.keys, work.dots, work.absolutes);
  work.w.assign(rows.size() * width, 0.0);
  work.states.resize(rows.size());
  std::vector<AttentionRowInDouble> bounded;
  bounded.reserve(rows.size());
  bool any_taken = false;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    bounded.push_back(bound_row(rows[r], target, r, work, results[r]));
    any_taken = any_taken || work.states[r].taken;
  }
  if (!any_taken) return;
  work.numerators.assign(rows.size() * columns, 0.0);
  work.magnitudes.assign(rows.size() * columns, 0.0);
  if (columns > 0) {
    const Matrix& v = rows.front().values;
    key_sum_by_tiles(operand(work.w, rows.size(), width), v, work.keys.first, width, KeyImage::values,
                     work.numerators.data());
    key_sum_by_tiles(operand(work.w, rows.size(), width), v, work.keys.first, width, KeyImage::magnitudes,
                     work.magnitudes.data());
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (!work.states[r].taken) continue;
    decide_attention_outputs(rows[r], target, bounded[r], {work.numerators.data() + r * columns, columns},
                             {work.magnitudes.data() + r * columns, columns}, results[r]);
    decide_lse_in_double(bounded[r], rows[r].entries(), results[r]);
  }
}

}  // namespace sharpcheck::reference
