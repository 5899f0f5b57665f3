// NumPy .npy files: the way outputs of GPU, PyTorch or JAX kernels reach sharpcheck, and the
// way sharpcheck hands reproducers back. Reads format versions 1.0, 2.0 and 3.0, C and Fortran
// order, dtypes float64, float32, float16, int8, uint8 and uint16 (bf16 bit patterns), little or
// big endian; writes version 1.0, C order, little endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/matrix.hpp"

namespace sharpcheck::io {

enum class NpyType { float64, float32, float16, int8, uint8, uint16 };

struct NpyArray {
  NpyType type = NpyType::float64;
  std::vector<std::size_t> shape;
  // The values in C (row-major) order, each converted exactly to double; for uint16 arrays the
  // bit patterns as integers (interpret them with a format, e.g. bf16, via decode()).
  std::vector<double> values;
  [[nodiscard]] std::size_t element_count() const;
};

// Parses a whole .npy file held in memory. Throws InputError naming `source` and what is wrong:
// bad magic, unsupported version, malformed header, unsupported dtype, truncated data.
[[nodiscard]] NpyArray parse_npy(const std::string& bytes, const std::string& source);
[[nodiscard]] NpyArray read_npy(const std::string& path);

// Writes values (C order, `shape`) as `type`. Values must be exactly representable in the type
// (float16 via IEEE binary16; uint16 expects bit patterns).
void write_npy(const std::string& path, NpyType type, const std::vector<std::size_t>& shape,
               const std::vector<double>& values);

// A 1-D array is one row; a 2-D array is rows x columns. Anything else is an InputError.
[[nodiscard]] Matrix as_matrix(const NpyArray& array, const std::string& source);

}  // namespace sharpcheck::io
