// Matrix products with a certified error bound at BLAS speed: the midpoints by one double GEMM
// and the bound by a second GEMM of magnitudes. The attention backward's double stage
// (reference/attention_backward_double.cpp) forms dQ = dR K, dK = dR^T Q and dV = P^T dO this way.
//
// Why any conforming GEMM is admissible: a sum of T products of doubles computed in any order, with
// or without fused multiply-adds, errs by at most gamma_T sum |a_i b_i| plus T 2^-1074 for products
// that underflow (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.1 and 4.2;
// the bound holds for every summation tree). A BLAS dgemm computes each entry of C as such a sum,
// with C's old value as one more term when it accumulates. Not admissible, and not used: Strassen-
// like algorithms (3M, Winograd), reduced- or mixed-precision modes, and flush-to-zero; OpenBLAS's
// and the reference BLAS's dgemm are classical triple loops, blocked.
//
// Contract: A is enclosed, |A - A~| <= R entrywise, B is exact. product_weights turns (A~, R) into
// W = (gamma_T |A~| + R + 2^-1074)(1 + 2^-40), T an upper bound on the products that will ever be summed into
// an entry of C. enclosed_product then adds A~ B to C~ and W |B| to C_w. After every call, with T
// bounding the products summed in all calls together,
//   |C - C~| <= product_radius(C_w, T),   C the exact sum of every A B added.
#pragma once

#include <cstddef>
#include <span>

#include "core/matrix.hpp"

namespace sharpcheck::reference {

// While one lives, the BLAS runs each product on the calling thread. sharpcheck parallelises over
// heads, groups and rows itself, and OpenBLAS's own pool on top of that oversubscribes the cores: a
// backward judgement of [1, 4, 1024, 64] took 1.3 to 1.7 s with one BLAS thread against 3.6 to 4.7 s
// with the pool, on 2 loaded cores. Nested and concurrent scopes share one setting, and the last one out
// restores the BLAS's own thread count. The setting is the process's: a product another thread runs meanwhile
// (torch's, say) runs single-threaded too, and OpenBLAS releases before 0.3.7 do not promise that
// changing the count while another thread computes is safe. With a BLAS other than OpenBLAS (no
// openblas_set_num_threads) it does nothing.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
};

// A row-major matrix operand of a product: rows x cols with `stride` doubles between rows, used as
// is or transposed.
struct MatrixOperand {
  const double* values;
  std::size_t rows;
  std::size_t cols;
  std::size_t stride;
  bool transposed = false;
  [[nodiscard]] std::size_t used_rows() const { return transposed ? cols : rows; }
  [[nodiscard]] std::size_t used_cols() const { return transposed ? rows : cols; }
};

// The destination: C~ and C_w, row-major with `stride`, overwritten or accumulated into.
struct EnclosedResult {
  double* mid;
  double* weight;
  std::size_t stride;
  bool accumulate = false;
};

// C = A B in double (C += A B when accumulating; `c_stride` doubles between C's rows); the caller
// bounds its error.
void plain_product(const MatrixOperand& a, const MatrixOperand& b, double* c, std::size_t c_stride,
                   bool accumulate = false);

// What a product reads of a head matrix's rows (one row per key): the values, their magnitudes or
// their squares.
enum class KeyImage { values, magnitudes, squares };

// The products a block of query rows forms with the keys [first, first + width) of a head matrix B
// (one row per key), a tile of keys at a time: each tile's image of B (|B|, B^2) is formed in a
// buffer the thread keeps, at most 2^20 doubles, never the head's whole image (a decode head of
// 131,072 keys held two 64 MiB images). Any order of summation, as plain_product.
//   pair_product_by_tiles: C = A image(B)^T, C rows x width with `width` doubles between rows;
//   key_sum_by_tiles: C = A image(B), A rows x width (its stride `a.stride`), C rows x B.cols.
void pair_product_by_tiles(const MatrixOperand& a, const Matrix& b, std::size_t first, std::size_t width,
                           KeyImage image, double* c);
void key_sum_by_tiles(const MatrixOperand& a, const Matrix& b, std::size_t first, std::size_t width,
                      KeyImage image, double* c);

// Query rows per block of products with a head's keys: `most`, fewer where a block's pair matrices
// (a row per query, a column per key) would pass 2^18 entries (a decode block of 32 queries over
// 131,072 keys held 32 MiB in each). The forward reference's double stage and the judge's geometry
// size their blocks by it.
[[nodiscard]] std::size_t rows_per_block(std::size_t keys, std::size_t most);

// W = (gamma_T |A~| + R + 2^-1074)(1 + 2^-40) entrywise, written over `radius`. `gamma_scale` is 1; the
// mutation test sets it to 0 (a bound that forgets the products' rounding) to show the
// containment tests can fail.
void product_weights(std::span<const double> mid, std::span<double> radius, double terms,
                     double gamma_scale = 1);

// C~ (+)= A~ B and C_w (+)= W |B|: A and W share a shape (W given as `weights.values`, same stride).
void enclosed_product(const MatrixOperand& a_mid, const MatrixOperand& weights, const MatrixOperand& b,
                      const MatrixOperand& b_magnitudes, const EnclosedResult& c);

// The bound on |C - C~| from C_w: the magnitude GEMM's own rounding (a sum of non-negative terms
// errs by gamma_T of itself, so the true weight is below C_w (1 + 2 gamma_T)) and 2T 2^-1074 for
// underflow, rounded up.
[[nodiscard]] double product_radius(double weight, double terms);

}  // namespace sharpcheck::reference
