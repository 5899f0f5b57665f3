#include "reference/enclosed_product.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "reference/double_stage_row.hpp"

namespace sharpcheck::reference {
namespace {

CBLAS_TRANSPOSE transpose_of(const MatrixOperand& operand) {
  return operand.transposed ? CblasTrans : CblasNoTrans;
}

// The CBLAS interface counts in int (both Debian's netlib and OpenBLAS headers, LP64).
int blas_size(std::size_t size) {
  if (size > static_cast<std::size_t>(INT_MAX))
    throw std::length_error("enclosed_product: a dimension exceeds int");
  return static_cast<int>(size);
}

void gemm(const MatrixOperand& a, const MatrixOperand& b, double* c, std::size_t c_stride, bool accumulate) {
  if (a.used_rows() == 0 || b.used_cols() == 0) return;
  cblas_dgemm(CblasRowMajor, transpose_of(a), transpose_of(b), blas_size(a.used_rows()),
              blas_size(b.used_cols()), blas_size(a.used_cols()), 1.0, a.values,
              blas_size(std::max<std::size_t>(a.stride, 1)), b.values,
              blas_size(std::max<std::size_t>(b.stride, 1)), accumulate ? 1.0 : 0.0, c,
              blas_size(std::max<std::size_t>(c_stride, 1)));
}

// OpenBLAS's thread count, found at run time (the link is to the generic libblas.so.3).
struct BlasThreads {
  using Setter = void (*)(int);
  using Getter = int (*)();
  Setter set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  Getter get = reinterpret_cast<Getter>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  std::mutex mutex;
  int scopes = 0;
  int saved = 0;
};

BlasThreads& blas_threads() {
  static BlasThreads threads;
  return threads;
}

}  // namespace

SingleThreadedBlas::SingleThreadedBlas() {
  BlasThreads& threads = blas_threads();
  if (threads.set == nullptr || threads.get == nullptr) return;
  const std::lock_guard lock(threads.mutex);
  if (threads.scopes++ == 0) {
    threads.saved = threads.get();
    threads.set(1);
  }
}

SingleThreadedBlas::~SingleThreadedBlas() {
  BlasThreads& threads = blas_threads();
  if (threads.set == nullptr || threads.get == nullptr) return;
  const std::lock_guard lock(threads.mutex);
  if (--threads.scopes == 0) threads.set(threads.saved);
}

void plain_product(const MatrixOperand& a, const MatrixOperand& b, double* c, std::size_t c_stride,
                   bool accumulate) {
  if (a.used_cols() != b.used_rows()) throw std::logic_error("plain_product: operand shapes disagree");
  gemm(a, b, c, c_stride, accumulate);
}

namespace {

std::size_t tile_keys(std::size_t columns) {
  return std::max<std::size_t>(1, (std::size_t{1} << 20) / std::max<std::size_t>(columns, 1));
}

// Rows [first, first + count) of b as an operand: b's own rows, or their image in `buffer`.
MatrixOperand key_rows(const Matrix& b, std::size_t first, std::size_t count, KeyImage image, bool transposed,
                       std::vector<double>& buffer) {
  const double* from = b.values.data() + first * b.cols;
  if (image == KeyImage::values) return {from, count, b.cols, b.cols, transposed};
  buffer.resize(count * b.cols);
  for (std::size_t e = 0; e < buffer.size(); ++e)
    buffer[e] = image == KeyImage::magnitudes ? std::fabs(from[e]) : from[e] * from[e];
  return {buffer.data(), count, b.cols, b.cols, transposed};
}

}  // namespace

namespace {

// Calls tile(t, count) for each tile [t, t + count) of [0, width), with the tile's rows of b through
// `image` as an operand (b's rows from first + t), formed in a buffer the thread keeps.
template <typename Tile>
void for_each_tile(const Matrix& b, std::size_t first, std::size_t width, KeyImage image, bool transposed,
                   Tile tile) {
  thread_local std::vector<double> buffer;
  const std::size_t keys = tile_keys(b.cols);
  for (std::size_t t = 0; t < width; t += keys) {
    const std::size_t count = std::min(keys, width - t);
    tile(t, count, key_rows(b, first + t, count, image, transposed, buffer));
  }
}

}  // namespace

void pair_product_by_tiles(const MatrixOperand& a, const Matrix& b, std::size_t first, std::size_t width,
                           KeyImage image, double* c) {
  for_each_tile(b, first, width, image, true, [&](std::size_t t, std::size_t, const MatrixOperand& keys) {
    plain_product(a, keys, c + t, width);
  });
}

void key_sum_by_tiles(const MatrixOperand& a, const Matrix& b, std::size_t first, std::size_t width,
                      KeyImage image, double* c) {
  for_each_tile(b, first, width, image, false,
                [&](std::size_t t, std::size_t count, const MatrixOperand& keys) {
                  plain_product(MatrixOperand{a.values + t, a.rows, count, a.stride}, keys, c, b.cols,
                                /*accumulate=*/t > 0);
                });
}

std::size_t rows_per_block(std::size_t keys, std::size_t most) {
  return std::clamp<std::size_t>((std::size_t{1} << 18) / std::max<std::size_t>(keys, 1), 1,
                                 std::max<std::size_t>(most, 1));
}

void product_weights(std::span<const double> mid, std::span<double> radius, double terms,
                     double gamma_scale) {
  const double gamma = gamma_scale * gamma_of(terms);
  for (std::size_t e = 0; e < mid.size(); ++e)
    radius[e] =
        (gamma * std::fabs(mid[e]) + radius[e] + 0x1p-1074) * (1 + 0x1p-40);  // gamma |A~| may underflow
}

void enclosed_product(const MatrixOperand& a_mid, const MatrixOperand& weights, const MatrixOperand& b,
                      const MatrixOperand& b_magnitudes, const EnclosedResult& c) {
  if (a_mid.used_cols() != b.used_rows() || weights.used_rows() != a_mid.used_rows() ||
      weights.used_cols() != a_mid.used_cols() || b_magnitudes.used_rows() != b.used_rows() ||
      b_magnitudes.used_cols() != b.used_cols()) {
    throw std::logic_error("enclosed_product: operand shapes disagree");
  }
  gemm(a_mid, b, c.mid, c.stride, c.accumulate);
  gemm(weights, b_magnitudes, c.weight, c.stride, c.accumulate);
}

double product_radius(double weight, double terms) {
  return (weight * (1 + 2 * gamma_of(terms)) + 2 * terms * 0x1p-1074) * (1 + 0x1p-40);
}

}  // namespace sharpcheck::reference
