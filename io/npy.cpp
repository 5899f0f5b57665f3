#include "io/npy.hpp"

#include "io/atomic_file.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/errors.hpp"
#include "formats/float_format.hpp"

namespace sharpcheck::io {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw InputError(InputProblem::out_of_range, source + ": " + what);
}

std::size_t item_size(NpyType type) {
  switch (type) {
    case NpyType::float64: return 8;
    case NpyType::float32: return 4;
    case NpyType::float16:
    case NpyType::uint16: return 2;
    case NpyType::int8:
    case NpyType::uint8: return 1;
  }
  return 0;
}

const char* type_code(NpyType type) {
  switch (type) {
    case NpyType::float64: return "<f8";
    case NpyType::float32: return "<f4";
    case NpyType::float16: return "<f2";
    case NpyType::int8: return "|i1";
    case NpyType::uint8: return "|u1";
    case NpyType::uint16: return "<u2";
  }
  return "";
}

// The value of `key` in the header's Python dict literal, as raw text up to the next top-level
// comma or closing brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& source) {
  const std::string quoted_single = "'" + key + "'";
  const std::string quoted_double = "\"" + key + "\"";
  std::size_t position = header.find(quoted_single);
  std::size_t length = quoted_single.size();
  if (position == std::string::npos) {
    position = header.find(quoted_double);
    length = quoted_double.size();
  }
  if (position == std::string::npos) fail(source, "header has no '" + key + "' entry");
  position = header.find(':', position + length);
  if (position == std::string::npos) fail(source, "header entry '" + key + "' has no value");
  ++position;
  int depth = 0;
  std::size_t end = position;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) fail(source, "unbalanced brackets in the header");
  }
  std::string value = header.substr(position, end - position);
  value.erase(0, value.find_first_not_of(" \t"));
  value.erase(value.find_last_not_of(" \t") + 1);
  return value;
}

std::vector<std::size_t> parse_shape(const std::string& text, const std::string& source) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') fail(source, "shape '" + text + "' is not a tuple");
  std::vector<std::size_t> shape;
  std::stringstream stream(text.substr(1, text.size() - 2));
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    if (!std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }) || item.size() > 12) {
      fail(source, "shape entry '" + item + "' is not a non-negative integer");
    }
    shape.push_back(std::stoull(item));
  }
  return shape;
}

template <typename T>
T load(const char* bytes, bool big_endian) {
  std::array<char, sizeof(T)> buffer;
  std::memcpy(buffer.data(), bytes, sizeof(T));
  if (big_endian) std::reverse(buffer.begin(), buffer.end());
  T value;
  std::memcpy(&value, buffer.data(), sizeof(T));
  return value;
}

}  // namespace

std::size_t NpyArray::element_count() const {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

NpyArray parse_npy(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) fail(source, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_length = 0;
  std::size_t header_start = 0;
  if (major == 1) {
    header_length = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(source, "truncated header");
    for (int i = 0; i < 4; ++i) header_length |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    fail(source, "unsupported .npy version " + std::to_string(major));
  }
  if (header_start + header_length > bytes.size()) fail(source, "truncated header");
  const std::string header = bytes.substr(header_start, header_length);
  const std::string descr = dict_value(header, "descr", source);
  const std::string fortran = dict_value(header, "fortran_order", source);
  NpyArray array;
  array.shape = parse_shape(dict_value(header, "shape", source), source);
  if (fortran != "True" && fortran != "False") fail(source, "fortran_order is '" + fortran + "'");
  if (descr.size() < 5 || (descr.front() != '\'' && descr.front() != '"')) fail(source, "dtype " + descr + " is not a simple type");
  const std::string code = descr.substr(1, descr.size() - 2);
  const char order = code.empty() ? '?' : code[0];
  const std::string kind = code.size() > 1 ? code.substr(1) : "";
  if (kind == "f8") {
    array.type = NpyType::float64;
  } else if (kind == "f4") {
    array.type = NpyType::float32;
  } else if (kind == "f2") {
    array.type = NpyType::float16;
  } else if (kind == "i1") {
    array.type = NpyType::int8;
  } else if (kind == "u1") {
    array.type = NpyType::uint8;
  } else if (kind == "u2") {
    array.type = NpyType::uint16;
  } else {
    fail(source, "unsupported dtype '" + code + "' (float64, float32, float16, int8, uint8, uint16 for bf16 bits)");
  }
  if (order != '<' && order != '>' && order != '|' && order != '=') fail(source, "dtype '" + code + "' has no byte order");
  const bool big_endian = order == '>';
  std::size_t count = 1;
  for (const std::size_t extent : array.shape) {
    if (__builtin_mul_overflow(count, extent, &count)) fail(source, "shape overflows the address space");
  }
  const std::size_t size = item_size(array.type);
  const std::size_t data_start = header_start + header_length;
  if (count > (bytes.size() - data_start) / size || bytes.size() - data_start != count * size) {
    fail(source, "data holds " + std::to_string(bytes.size() - data_start) + " bytes, the header promises " +
                     std::to_string(count) + " elements of " + std::to_string(size) + " bytes");
  }
  std::vector<double> stored(count);
  const char* data = bytes.data() + data_start;
  for (std::size_t i = 0; i < count; ++i) {
    const char* item = data + i * size;
    switch (array.type) {
      case NpyType::float64: stored[i] = load<double>(item, big_endian); break;
      case NpyType::float32: stored[i] = load<float>(item, big_endian); break;
      case NpyType::float16: stored[i] = decode(load<std::uint16_t>(item, big_endian), fp16); break;
      case NpyType::int8: stored[i] = static_cast<std::int8_t>(*item); break;
      case NpyType::uint8: stored[i] = static_cast<unsigned char>(*item); break;
      case NpyType::uint16: stored[i] = load<std::uint16_t>(item, big_endian); break;
    }
  }
  if (fortran == "True" && array.shape.size() > 1) {
    // Column-major storage: element (i0, i1, ...) sits at i0 + s0 (i1 + s1 (...)).
    array.values.resize(count);
    std::vector<std::size_t> index(array.shape.size(), 0);
    for (std::size_t c_position = 0; c_position < count; ++c_position) {
      std::size_t f_position = 0;
      std::size_t stride = 1;
      for (std::size_t axis = 0; axis < array.shape.size(); ++axis) {
        f_position += index[axis] * stride;
        stride *= array.shape[axis];
      }
      array.values[c_position] = stored[f_position];
      for (std::size_t axis = array.shape.size(); axis-- > 0;) {
        if (++index[axis] < array.shape[axis]) break;
        index[axis] = 0;
      }
    }
  } else {
    array.values = std::move(stored);
  }
  return array;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(InputProblem::out_of_range, path + ": cannot be opened");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_npy(bytes, path);
}

void write_npy(const std::string& path, NpyType type, const std::vector<std::size_t>& shape,
               const std::vector<double>& values) {
  std::string shape_text = "(";
  for (const std::size_t extent : shape) shape_text += std::to_string(extent) + ",";
  if (shape.size() > 1) shape_text.pop_back();
  shape_text += ")";
  std::string header = std::string("{'descr': '") + type_code(type) + "', 'fortran_order': False, 'shape': " +
                       shape_text + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ostringstream out(std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<std::uint16_t>(header.size());
  const char length_bytes[2] = {static_cast<char>(length & 0xFF), static_cast<char>(length >> 8)};
  out.write(length_bytes, 2);
  out << header;
  for (const double value : values) {
    switch (type) {
      case NpyType::float64: out.write(reinterpret_cast<const char*>(&value), 8); break;
      case NpyType::float32: {
        const auto narrow = static_cast<float>(value);
        out.write(reinterpret_cast<const char*>(&narrow), 4);
        break;
      }
      case NpyType::float16: {
        const auto bits = static_cast<std::uint16_t>(encode(round_to_format(value, fp16), fp16));
        out.write(reinterpret_cast<const char*>(&bits), 2);
        break;
      }
      case NpyType::uint16: {
        const auto bits = static_cast<std::uint16_t>(value);
        out.write(reinterpret_cast<const char*>(&bits), 2);
        break;
      }
      case NpyType::int8:
      case NpyType::uint8: {
        const auto byte = static_cast<char>(static_cast<int>(value));
        out.write(&byte, 1);
        break;
      }
    }
  }
  write_file_atomically(path, out.str());
}

Matrix as_matrix(const NpyArray& array, const std::string& source) {
  if (array.shape.size() == 1) {
    Matrix matrix(1, array.shape[0]);
    matrix.values = array.values;
    return matrix;
  }
  if (array.shape.size() == 2) {
    Matrix matrix(array.shape[0], array.shape[1]);
    matrix.values = array.values;
    return matrix;
  }
  fail(source, "expected a 1-D or 2-D array, got " + std::to_string(array.shape.size()) + " dimensions");
}

}  // namespace sharpcheck::io
