// NumPy .npy files: the way outputs of GPU, PyTorch or JAX kernels reach sharpcheck, and the
// way sharpcheck hands reproducers back. Reads format versions 1.0, 2.0 and 3.0, C and Fortran
// order, dtypes float64, float32, float16, int8, uint8, uint16 and int16 (bf16 bit patterns), int32
// and int64 (integers), little or
// big endian; writes version 1.0, C order, little endian.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/matrix.hpp"
#include "io/mapped_file.hpp"
#include "io/npz.hpp"

namespace sharpcheck::io {

// uint16 and int16 arrays are read as 16-bit patterns (0 to 65535): torch saves bf16 as
// .view(torch.int16) (torch 1.13 has no uint16), numpy users as uint16.
// int32 and int64 arrays (block tables, page indices) are read as their integer values.
enum class NpyType { float64, float32, float16, int8, uint8, uint16, int16, int32, int64 };

struct NpyArray {
  NpyType type = NpyType::float64;
  std::vector<std::size_t> shape;
  // The values in C (row-major) order, each converted exactly to double; for uint16 arrays the
  // bit patterns as integers (interpret them with a format, e.g. bf16, via decode()).
  std::vector<double> values;
  [[nodiscard]] std::size_t element_count() const;
};

// What a .npy header says: the element type, shape, order, and where the data starts.
struct NpyLayout {
  NpyType type = NpyType::float64;
  std::vector<std::size_t> shape;
  bool fortran_order = false;
  bool big_endian = false;
  std::size_t data_start = 0;
  [[nodiscard]] std::size_t element_count() const;
};
// Parses and checks the header of a .npy file's bytes (which must hold the whole file: the data's
// size is checked against the shape), or of a prefix holding the whole header when `total_size`
// gives the file's size. Throws InputError like parse_npy.
[[nodiscard]] NpyLayout parse_npy_header(std::string_view bytes, const std::string& source,
                                         std::optional<std::size_t> total_size = std::nullopt);
// The value at storage position `position` of the data, converted exactly to double.
[[nodiscard]] double decode_npy_item(const NpyLayout& layout, const char* data, std::size_t position);
// The storage position of the element at C-order position `c_position`.
[[nodiscard]] std::size_t storage_position(const NpyLayout& layout, std::size_t c_position);

// The lanes of an array along one axis (softmax over any axis of an N-D array): lane l is every
// index but the axis's, in C order; a 0-D array is one lane of one element.
struct NpyLanes {
  std::size_t axis = 0, extent = 1, inner = 1, count = 1;  // inner: the product of the later extents
  // The C-order position of element `position` of lane `lane`.
  [[nodiscard]] std::size_t c_index(std::size_t lane, std::size_t position) const {
    return (lane / inner) * extent * inner + position * inner + lane % inner;
  }
};
[[nodiscard]] NpyLanes lanes_along(const std::vector<std::size_t>& shape, std::size_t axis);

// A .npy file (or a member of an .npz bundle, named "bundle.npz:q") mapped into memory and read
// a block at a time: judging files larger than memory costs the blocks, not copies of the files.
// A stored .npz member is read in place; a deflated one is inflated into memory when first read,
// after its header (inflated alone) has given its shape, so a shape check refuses a hostile member
// before it costs its inflated size. Rows are
// the lanes of the last axis (a 1-D array is one row, a 0-D array one row of one element).
class NpyFile {
 public:
  explicit NpyFile(const std::string& path);  // InputError naming the path when unreadable or malformed
  ~NpyFile();
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;
  [[nodiscard]] const NpyLayout& layout() const { return layout_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::size_t rows() const { return rows_; }
  [[nodiscard]] std::size_t cols() const { return cols_; }
  // Rows [first, first + count) as doubles (uint16 as bit patterns); the pages read are released.
  [[nodiscard]] Matrix read_rows(std::size_t first, std::size_t count) const;
  // Lanes [first, first + count) of lanes_along(layout().shape, axis), one per row of the result.
  [[nodiscard]] Matrix read_lanes(const NpyLanes& lanes, std::size_t first, std::size_t count) const;
  // Elements [first, first + out.size()) in C order. Safe to call from several threads.
  void read_elements(std::size_t first, std::span<double> out) const;

 private:
  void release(std::size_t first_element, std::size_t count) const;
  [[nodiscard]] const char* bytes() const;  // inflates a deflated member on the first call
  std::string path_;
  std::unique_ptr<MappedFile> mapping_;  // the whole file (an .npz archive for a member)
  std::optional<NpzMember> deflated_;    // a deflated member, inflated when first read
  mutable std::once_flag inflate_once_;
  mutable std::string inflated_;         // a deflated .npz member's bytes
  mutable const char* bytes_ = nullptr;  // the .npy bytes: in the mapping or in inflated_
  NpyLayout layout_;
  std::size_t rows_ = 0, cols_ = 0;
};

// Parses a whole .npy file held in memory. Throws InputError naming `source` and what is wrong:
// bad magic, unsupported version, malformed header, unsupported dtype, truncated data.
[[nodiscard]] NpyArray parse_npy(const std::string& bytes, const std::string& source);
// A whole array from a .npy file or an .npz member ("bundle.npz:q").
[[nodiscard]] NpyArray read_npy(const std::string& path);

// Writes values (C order, `shape`) as `type`. Values must be exactly representable in the type
// (float16 via IEEE binary16; uint16 expects bit patterns).
void write_npy(const std::string& path, NpyType type, const std::vector<std::size_t>& shape,
               const std::vector<double>& values);

// A 1-D array is one row; a 2-D array is rows x columns. Anything else is an InputError.
[[nodiscard]] Matrix as_matrix(const NpyArray& array, const std::string& source);

}  // namespace sharpcheck::io
