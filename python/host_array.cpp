#include "python/host_array.hpp"

#include <dlpack/dlpack.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "python/errors.hpp"

namespace sharpcheck::python {
namespace py = pybind11;
namespace {

std::size_t item_size(ElementType type) {
  switch (type) {
    case ElementType::float64:
    case ElementType::int64:
      return 8;
    case ElementType::float32:
    case ElementType::int32:
      return 4;
    case ElementType::float16:
    case ElementType::bfloat16:
    case ElementType::int16:
    case ElementType::uint16:
      return 2;
    default:
      return 1;
  }
}

// A buffer-protocol format string ('<f', '=e', 'B', ...) as an element type; big-endian refused.
ElementType buffer_type(std::string format, std::size_t itemsize, const std::string& name) {
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@')) format.erase(0, 1);
  if (!format.empty() && (format[0] == '>' || format[0] == '!') && itemsize > 1)
    refuse_type(name, "big-endian arrays are not read; convert with .astype('<f4') or similar");
  if (!format.empty() && (format[0] == '>' || format[0] == '!')) format.erase(0, 1);
  static const std::pair<const char*, ElementType> known[] = {
      {"d", ElementType::float64}, {"f", ElementType::float32}, {"e", ElementType::float16},
      {"b", ElementType::int8},    {"B", ElementType::uint8},   {"h", ElementType::int16},
      {"H", ElementType::uint16},  {"i", ElementType::int32},   {"l", ElementType::int64},
      {"l", ElementType::int32},   {"q", ElementType::int64},   {"?", ElementType::boolean}};
  for (const auto& [code, type] : known) {
    if (format == code && itemsize == item_size(type)) return type;
  }
  refuse_type(name,
              "unsupported dtype (buffer format '" + format +
                  "'); expected float64, float32, float16, bfloat16, int8, uint8, int16, uint16, int32, "
                  "int64 or bool");
}

ElementType dlpack_type(const DLDataType& dtype, const std::string& name) {
  if (dtype.lanes != 1) refuse_type(name, "vector (multi-lane) DLPack dtypes are not read");
  const auto bits = dtype.bits;
  if (dtype.code == kDLFloat && bits == 64) return ElementType::float64;
  if (dtype.code == kDLFloat && bits == 32) return ElementType::float32;
  if (dtype.code == kDLFloat && bits == 16) return ElementType::float16;
  if (dtype.code == kDLBfloat && bits == 16) return ElementType::bfloat16;
  if (dtype.code == kDLInt && bits == 8) return ElementType::int8;
  if (dtype.code == kDLInt && bits == 16) return ElementType::int16;
  if (dtype.code == kDLInt && bits == 32) return ElementType::int32;
  if (dtype.code == kDLInt && bits == 64) return ElementType::int64;
  if (dtype.code == kDLUInt && bits == 8) return ElementType::uint8;
  if (dtype.code == kDLUInt && bits == 16) return ElementType::uint16;
  if (dtype.code == 6 && bits == 8) return ElementType::boolean;  // kDLBool (DLPack 0.8 and later)
  refuse_type(name,
              "unsupported dtype (DLPack code " + std::to_string(dtype.code) + ", " + std::to_string(bits) +
                  " bits); expected float64, float32, float16, bfloat16, int8, uint8, int16, uint16, int32, "
                  "int64 or bool");
}

std::uint16_t bits16(const unsigned char* at) {
  std::uint16_t bits = 0;
  std::memcpy(&bits, at, sizeof bits);
  return bits;
}

// Probing memory for a bus error (a memory-mapped file truncated after it was mapped: every read
// of its lost pages raises SIGBUS, which would kill the interpreter). While a probe runs, SIGBUS
// jumps back to it; a bus error elsewhere in that window puts the previous handler back and lets
// the faulting instruction run again, so it reaches whoever handled it before.
thread_local sigjmp_buf* probe_jump = nullptr;
struct sigaction previous_bus_handler {};

void on_bus_error(int signal, siginfo_t* info, void* /*context*/) {
  if (probe_jump != nullptr && info != nullptr && info->si_code > 0) siglongjmp(*probe_jump, 1);  // a fault
  sigaction(SIGBUS, &previous_bus_handler, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(signal);  // sent (kill): to the previous handler, after
}

// Reads one byte in every page `visit` names (visit(probe) calls probe(address) for each) and
// returns the first address whose page cannot be read, or null. Only trivially destructible
// objects live between sigsetjmp and siglongjmp, so the jump skips no destructor.
template <typename Visit>
const unsigned char* first_unreadable(const Visit& visit) {
  struct sigaction ours {};
  ours.sa_sigaction = on_bus_error;
  ours.sa_flags = SA_SIGINFO;
  sigemptyset(&ours.sa_mask);
  sigaction(SIGBUS, &ours, &previous_bus_handler);
  sigjmp_buf jump;
  const unsigned char* volatile at = nullptr;
  const unsigned char* failed = nullptr;
  if (sigsetjmp(jump, 1) == 0) {
    probe_jump = &jump;
    visit([&at](const unsigned char* address) {
      at = address;
      [[maybe_unused]] const volatile unsigned char byte = *address;
    });
  } else {
    failed = at;
  }
  probe_jump = nullptr;
  sigaction(SIGBUS, &previous_bus_handler, nullptr);
  return failed;
}

// True when a mapping of a file (Linux's /proc/self/maps names an inode for it) holds any byte
// between `first` and `last`: another process may truncate that file while the judge reads the array. False
// where /proc is missing (other systems: the array is then read in place, checked once). One read of the maps
// for both addresses (a tiny call's cost is mostly this read).
bool in_a_mapped_file(const void* first, const void* last) {
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(first), b = reinterpret_cast<std::uintptr_t>(last);
  const std::uintptr_t low = std::min(a, b), high = std::max(a, b);  // negative strides reverse them
  std::array<char, 4096> line{};
  bool file = false;
  // The maps are in address order: the scan stops past the array's last byte.
  while (std::fgets(line.data(), static_cast<int>(line.size()), maps) != nullptr) {
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    std::array<char, 8> permissions{};
    std::array<char, 32> device{};
    if (std::sscanf(line.data(), "%llx-%llx %7s %llx %31s %llu", &start, &end, permissions.data(), &offset,
                    device.data(), &inode) != 6)
      continue;  // the rest of a long path, or no such line
    if (start > high) break;
    if (end > low && inode != 0) file = true;  // the mapping holds some of [low, high]
  }
  std::fclose(maps);
  return file;
}

}  // namespace

HostArray::HostArray(const py::object& object, std::string name, gate::StoredFormat stored)
    : name_(std::move(name)), stored_(std::move(stored)) {
  if (PyObject_CheckBuffer(object.ptr())) {
    take_buffer(object);
  } else if (py::hasattr(object, "__dlpack__")) {
    take_dlpack(object);
  } else {
    refuse_type(name_, std::string("expected an array (buffer protocol or DLPack), got ") +
                           py::str(py::type::of(object).attr("__name__")).cast<std::string>());
  }
  // int32 and int64 hold indices (block tables, page ids, lengths), read as plain numbers: a
  // tensor of values (logits, outputs, q) in them is a mistake worth naming, not reading.
  if ((type_ == ElementType::int32 || type_ == ElementType::int64) && *stored_.format != fp64)
    refuse_type(name_,
                "int32 and int64 are read only for index tensors (block tables, page ids, lengths); "
                "convert values to a floating dtype");
}

void HostArray::take_buffer(const py::object& object) {
  auto view_holder = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(object.ptr(), view_holder.get(), PyBUF_RECORDS_RO) != 0)
    throw py::error_already_set();
  const Py_buffer& view = *view_holder;
  exported_ = std::shared_ptr<void>(view_holder.release(), [](void* held) {
    auto* buffer = static_cast<Py_buffer*>(held);
    PyBuffer_Release(buffer);
    delete buffer;
  });
  type_ = buffer_type(view.format ? view.format : "B", static_cast<std::size_t>(view.itemsize), name_);
  std::vector<std::int64_t> strides;
  for (int axis = 0; axis < view.ndim; ++axis) {
    shape_.push_back(static_cast<std::size_t>(view.shape[axis]));
    if (view.strides[axis] % view.itemsize != 0) refuse_value(name_, "strides are not whole elements");
    strides.push_back(view.strides[axis] / view.itemsize);
  }
  data_ = static_cast<const unsigned char*>(view.buf);
  set_layout(strides);
}

void HostArray::take_dlpack(const py::object& object) {
  py::object capsule = object.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // ours now: deleted with the array
  exported_ = std::shared_ptr<void>(managed, [](void* held) {
    auto* tensor = static_cast<DLManagedTensor*>(held);
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  });
  const DLTensor& tensor = managed->dl_tensor;
  if (tensor.device.device_type != kDLCPU && tensor.device.device_type != kDLCUDAHost)
    refuse_type(name_, "the tensor is not in host memory (DLPack device " +
                           std::to_string(tensor.device.device_type) + "); copy it to the CPU first");
  type_ = dlpack_type(tensor.dtype, name_);
  std::vector<std::int64_t> strides;
  std::int64_t compact = 1;
  for (int axis = tensor.ndim; axis-- > 0;) {
    strides.insert(strides.begin(), tensor.strides ? tensor.strides[axis] : compact);
    compact *= tensor.shape[axis];
  }
  for (int axis = 0; axis < tensor.ndim; ++axis)
    shape_.push_back(static_cast<std::size_t>(tensor.shape[axis]));
  data_ = static_cast<const unsigned char*>(tensor.data) + tensor.byte_offset;
  set_layout(strides);
}

void HostArray::set_layout(const std::vector<std::int64_t>& strides_in_items) {
  // Any strides are read, negative and zero (a broadcast) included: the arrays are only read, so
  // elements that share memory cannot disagree. element() maps each C-order flat index to
  // its element; a C-contiguous array (extent-1 axes may have any stride) reads straight through.
  strides_ = strides_in_items;
  count_ = 1;
  for (const std::size_t extent : shape_) count_ *= extent;
  std::int64_t expected = 1;
  contiguous_ = true;
  for (std::size_t axis = shape_.size(); axis-- > 0;) {
    if (shape_[axis] != 1 && strides_[axis] != expected) contiguous_ = false;
    expected *= static_cast<std::int64_t>(shape_[axis]);
  }
  check_readable();
  copy_if_file_backed();
}

void HostArray::check_readable() const {
  if (count_ == 0 || data_ == nullptr) return;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto size = static_cast<std::int64_t>(item_size(type_));
  const auto page_of = [page](const unsigned char* p) { return reinterpret_cast<std::uintptr_t>(p) / page; };
  const unsigned char* bad = nullptr;
  if (contiguous_) {  // every page of the one run of elements
    const unsigned char* last = data_ + static_cast<std::int64_t>(count_) * size - 1;
    bad = first_unreadable([&](const auto& probe) {
      // The first byte, then the start of every later page, as offsets from data_ (no integer is
      // cast back to a pointer, and no pointer past the array is formed).
      const auto step = static_cast<std::ptrdiff_t>(page);
      const auto into_page = static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(data_) % page);
      for (std::ptrdiff_t offset = 0; offset <= last - data_; offset += offset == 0 ? step - into_page : step)
        probe(data_ + offset);
    });
  } else {  // only the pages elements lie on (a view's span may cover a whole file), run by run
    const std::size_t extent = shape_.empty() ? 1 : shape_.back();
    const std::int64_t step = (shape_.empty() ? 0 : strides_.back()) * size;
    bad = first_unreadable([&](const auto& probe) {
      std::uintptr_t last_page = 0;
      bool any = false;
      for (std::size_t run = 0; run < count_ / extent; ++run) {
        const unsigned char* element = data_ + offset_of(run * extent) * size;
        for (std::size_t k = 0; k < extent; ++k, element += step) {
          for (const unsigned char* byte : {element, element + size - 1}) {
            if (any && page_of(byte) == last_page) continue;
            probe(byte);
            last_page = page_of(byte);
            any = true;
          }
        }
      }
    });
  }
  if (bad != nullptr)
    refuse_value(name_, "its memory cannot be read (a bus error at byte " + std::to_string(bad - data_) +
                            " from its first element: a memory-mapped file truncated after it was mapped?)");
}

void HostArray::copy_if_file_backed() {
  if (count_ == 0 || data_ == nullptr) return;
  const std::size_t size = item_size(type_);
  const unsigned char* last = data_ + offset_of(count_ - 1) * static_cast<std::int64_t>(size);
  if (!in_a_mapped_file(data_, last + size - 1)) return;  // the last element's last byte
  owned_.resize(count_ * size);
  unsigned char* copy = owned_.data();
  const unsigned char* bad = first_unreadable([&](const auto& probe) {
    for (std::size_t i = 0; i < count_; ++i) {
      const unsigned char* element = data_ + (contiguous_ ? static_cast<std::int64_t>(i) : offset_of(i)) *
                                                 static_cast<std::int64_t>(size);
      probe(element);
      std::memcpy(copy + i * size, element, size);
    }
  });
  if (bad != nullptr)
    refuse_value(name_, "its memory cannot be read (a bus error at byte " + std::to_string(bad - data_) +
                            " from its first element: a memory-mapped file truncated while it was copied?)");
  data_ = owned_.data();
  contiguous_ = true;
  std::int64_t stride = 1;
  for (std::size_t axis = shape_.size(); axis-- > 0;) {
    strides_[axis] = stride;
    stride *= static_cast<std::int64_t>(shape_[axis]);
  }
}

std::int64_t HostArray::offset_of(std::size_t index) const {
  std::int64_t offset = 0;
  for (std::size_t axis = shape_.size(); axis-- > 0;) {
    const std::size_t extent = shape_[axis];
    offset += static_cast<std::int64_t>(index % extent) * strides_[axis];
    index /= extent;
  }
  return offset;
}

double HostArray::element(std::size_t index) const {
  const std::int64_t offset = contiguous_ ? static_cast<std::int64_t>(index) : offset_of(index);
  const unsigned char* at = data_ + offset * static_cast<std::int64_t>(item_size(type_));
  switch (type_) {
    case ElementType::float64: {
      double value = 0;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case ElementType::float32: {
      float value = 0;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case ElementType::float16:
      return decode(bits16(at), fp16);
    case ElementType::bfloat16:
      return decode(bits16(at), bf16);
    case ElementType::int16:
      return gate::decode_stored(bits16(at), io::NpyType::int16, stored_, name_, index);
    case ElementType::uint16:
      return gate::decode_stored(bits16(at), io::NpyType::uint16, stored_, name_, index);
    case ElementType::int8:
      return gate::decode_stored(static_cast<signed char>(*at), io::NpyType::int8, stored_, name_, index);
    case ElementType::uint8:
      return gate::decode_stored(*at, io::NpyType::uint8, stored_, name_, index);
    case ElementType::int32: {  // integers (block tables, page indices): their values
      std::int32_t value = 0;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case ElementType::int64: {  // exact up to 2^53, far beyond any index a judge accepts
      std::int64_t value = 0;
      std::memcpy(&value, at, sizeof value);
      return static_cast<double>(value);
    }
    case ElementType::boolean:
      return *at != 0 ? 1.0 : 0.0;
  }
  return 0;
}

void HostArray::read(std::size_t first, std::span<double> out) const {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = element(first + i);
}

std::vector<double> HostArray::values() const {
  std::vector<double> all(count_);
  read(0, all);
  return all;
}

pybind11::array_t<double> to_numpy(const std::vector<double>& values, const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  if (count != values.size())
    throw std::logic_error("sharpcheck: " + std::to_string(values.size()) + " values for a shape of " +
                           std::to_string(count) + " elements");
  std::vector<pybind11::ssize_t> extents(shape.begin(), shape.end());
  pybind11::array_t<double> array(extents);
  std::copy(values.begin(), values.end(), array.mutable_data());
  return array;
}

}  // namespace sharpcheck::python
