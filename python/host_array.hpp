// A Python array (NumPy, PyTorch, JAX, CuPy, anything with the buffer protocol or DLPack) seen as
// a gate::Array: read in place from host memory, element by element, decoded to exact doubles.
// The one boundary where Python's arrays become sharpcheck's; nothing else in python/ touches
// their memory.
//
// Accepted element types: float64, float32, float16, bfloat16 (DLPack), int8, uint8, int16, uint16
// and bool; integer arrays are read as gate/judge_arrays.hpp says (bit patterns of the format, or
// quantized codes). Any strides are read in place (views, transposes, negative and zero strides: no
// copy); arrays must be on the host: the Python layer copies device tensors to the host first and
// says so.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gate/judge_arrays.hpp"

namespace sharpcheck::python {

enum class ElementType {
  float64,
  float32,
  float16,
  bfloat16,
  int8,
  uint8,
  int16,
  uint16,
  int32,
  int64,
  boolean
};

class HostArray final : public gate::Array {
 public:
  // Reads `object` through the buffer protocol when it has one, else through __dlpack__.
  // ValueError/TypeError (via InputError) naming `name` for another type, device, stride or dtype.
  // Must be built and destroyed holding the GIL; read() may run on any thread without it.
  HostArray(const pybind11::object& object, std::string name, gate::StoredFormat stored);
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  [[nodiscard]] std::size_t size() const override { return count_; }
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return shape_; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  void read(std::size_t first, std::span<double> out) const override;
  [[nodiscard]] ElementType type() const { return type_; }
  // Every element as a double (the one host copy the reference's spans need).
  [[nodiscard]] std::vector<double> values() const;

 private:
  void take_buffer(const pybind11::object& object);
  void take_dlpack(const pybind11::object& object);
  void set_layout(const std::vector<std::int64_t>& strides_in_items);
  // ValueError naming the array when a page of its memory raises a bus error when read (a
  // truncated memory-mapped file), instead of the signal killing the interpreter. Checked once,
  // when the array is taken.
  void check_readable() const;
  // An array in a mapping of a file (np.memmap, a torch tensor from a mapped file) is copied when
  // taken, under the same guard: a file truncated later, while the judge reads the array, cannot
  // reach the judge (the bus error would kill the interpreter). Other arrays are read in place.
  void copy_if_file_backed();
  // Where the element at C-order flat index `index` lies, in items from data_.
  [[nodiscard]] std::int64_t offset_of(std::size_t index) const;
  [[nodiscard]] double element(std::size_t index) const;

  std::string name_;
  gate::StoredFormat stored_;
  std::vector<std::size_t> shape_;
  std::size_t count_ = 1;
  ElementType type_ = ElementType::float64;
  const unsigned char* data_ = nullptr;
  std::vector<std::int64_t> strides_;  // in items, one per axis
  bool contiguous_ = true;
  // The buffer-protocol view or the DLManagedTensor, released (buffer) or deleted (DLPack) with
  // the array, also when the constructor refuses it half way.
  std::shared_ptr<void> exported_;
  std::vector<unsigned char> owned_;  // the copy of a file-backed array's elements, C order
};

// A NumPy float64 array of `shape` holding `values` (as many as the shape's elements).
[[nodiscard]] pybind11::array_t<double> to_numpy(const std::vector<double>& values,
                                                 const std::vector<std::size_t>& shape);

}  // namespace sharpcheck::python
