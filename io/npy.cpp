#include "io/npy.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "core/errors.hpp"
#include "formats/float_format.hpp"
#include "io/atomic_file.hpp"
#include "io/mapped_file.hpp"
#include "io/npz.hpp"

namespace sharpcheck::io {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw InputError(InputProblem::out_of_range, source + ": " + what);
}

std::size_t item_size(NpyType type) {
  switch (type) {
    case NpyType::float64:
      return 8;
    case NpyType::float32:
      return 4;
    case NpyType::float16:
    case NpyType::uint16:
    case NpyType::int16:
      return 2;
    case NpyType::int8:
    case NpyType::uint8:
      return 1;
    case NpyType::int32:
      return 4;
    case NpyType::int64:
      return 8;
  }
  return 0;
}

const char* type_code(NpyType type) {
  switch (type) {
    case NpyType::float64:
      return "<f8";
    case NpyType::float32:
      return "<f4";
    case NpyType::float16:
      return "<f2";
    case NpyType::int8:
      return "|i1";
    case NpyType::uint8:
      return "|u1";
    case NpyType::uint16:
      return "<u2";
    case NpyType::int16:
      return "<i2";
    case NpyType::int32:
      return "<i4";
    case NpyType::int64:
      return "<i8";
  }
  return "";
}

// The header's Python dict literal, parsed as numpy's reader takes it: quoted keys, each value as
// raw text up to the next top-level comma or closing brace (quotes and brackets nest). numpy
// requires exactly the keys descr, fortran_order and shape; a repeated key (which numpy's
// literal_eval would resolve to its last value) or any other key is refused, so that no file reads
// one way here and another in numpy.
std::map<std::string, std::string> header_entries(const std::string& header, const std::string& source) {
  std::size_t at = header.find_first_not_of(" \t");
  if (at == std::string::npos || header[at] != '{') fail(source, "the header is not a dict literal");
  const auto skip = [&] { at = header.find_first_not_of(" \t\n", at); };
  std::map<std::string, std::string> entries;
  for (++at, skip(); at != std::string::npos && header[at] != '}'; skip()) {
    const char quote = header[at];
    const std::size_t close = quote == '\'' || quote == '"' ? header.find(quote, at + 1) : std::string::npos;
    if (close == std::string::npos)
      fail(source, quote == '\'' || quote == '"' ? "the header's dict is not closed (it ends inside a key)"
                                                 : "a header key is not a quoted string");
    std::string key = header.substr(at + 1, close - at - 1);
    at = close + 1;
    skip();
    if (at == std::string::npos || header[at] != ':') fail(source, "header entry '" + key + "' has no value");
    const std::size_t start = ++at;
    int depth = 0;
    char in_string = 0;
    for (; at < header.size(); ++at) {
      const char c = header[at];
      if (in_string != 0) {
        if (c == in_string) in_string = 0;
        continue;
      }
      if (c == '\'' || c == '"') in_string = c;
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (depth < 0) fail(source, "unbalanced brackets in the header");
      if (depth == 0 && (c == ',' || c == '}')) break;
    }
    if (at >= header.size()) fail(source, "the header's dict is not closed");
    std::string value = header.substr(start, at - start);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t") + 1);
    if (!entries.emplace(key, value).second) fail(source, "the header repeats its '" + key + "' entry");
    if (header[at] == ',') ++at;
  }
  if (at == std::string::npos) fail(source, "the header's dict is not closed");
  if (header.find_first_not_of(" \t\n", at + 1) != std::string::npos)
    fail(source, "the header has text after its dict");
  for (const auto& [key, value] : entries) {
    if (key != "descr" && key != "fortran_order" && key != "shape")
      fail(source, "the header has an entry '" + key + "' numpy does not accept");
  }
  return entries;
}

// The value of `key` among the header's entries.
const std::string& dict_value(const std::map<std::string, std::string>& entries, const std::string& key,
                              const std::string& source) {
  const auto found = entries.find(key);
  if (found == entries.end()) fail(source, "header has no '" + key + "' entry");
  return found->second;
}

std::vector<std::size_t> parse_shape(const std::string& text, const std::string& source) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    fail(source, "shape '" + text + "' is not a tuple");
  std::vector<std::size_t> shape;
  std::stringstream stream(text.substr(1, text.size() - 2));
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    if (!std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        item.size() > 12) {
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

NpyLayout parse_npy_header(std::string_view bytes, const std::string& source,
                           std::optional<std::size_t> total_size) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) fail(source, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_length = 0;
  std::size_t header_start = 0;
  if (major == 1) {
    header_length = static_cast<unsigned char>(bytes[8]) |
                    (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(source, "truncated header");
    for (int i = 0; i < 4; ++i)
      header_length |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    fail(source, "unsupported .npy version " + std::to_string(major));
  }
  if (header_start + header_length > bytes.size()) fail(source, "truncated header");
  const std::map<std::string, std::string> header =
      header_entries(std::string(bytes.substr(header_start, header_length)), source);
  const std::string descr = dict_value(header, "descr", source);
  const std::string fortran = dict_value(header, "fortran_order", source);
  NpyLayout layout;
  layout.shape = parse_shape(dict_value(header, "shape", source), source);
  if (fortran != "True" && fortran != "False") fail(source, "fortran_order is '" + fortran + "'");
  layout.fortran_order = fortran == "True";
  if (descr.size() < 5 || (descr.front() != '\'' && descr.front() != '"'))
    fail(source, "dtype " + descr + " is not a simple type");
  const std::string code = descr.substr(1, descr.size() - 2);
  const char order = code.empty() ? '?' : code[0];
  const std::string kind = code.size() > 1 ? code.substr(1) : "";
  if (kind == "f8") {
    layout.type = NpyType::float64;
  } else if (kind == "f4") {
    layout.type = NpyType::float32;
  } else if (kind == "f2") {
    layout.type = NpyType::float16;
  } else if (kind == "i1") {
    layout.type = NpyType::int8;
  } else if (kind == "u1") {
    layout.type = NpyType::uint8;
  } else if (kind == "u2") {
    layout.type = NpyType::uint16;
  } else if (kind == "i2") {
    layout.type = NpyType::int16;
  } else if (kind == "i4") {
    layout.type = NpyType::int32;
  } else if (kind == "i8") {
    layout.type = NpyType::int64;
  } else {
    fail(source, "unsupported dtype '" + code +
                     "' (float64, float32, float16, int8, uint8, int32 and int64 (indices), and uint16 or "
                     "int16 for bf16/fp16 bits)");
  }
  if (order != '<' && order != '>' && order != '|' && order != '=')
    fail(source, "dtype '" + code + "' has no byte order");
  layout.big_endian = order == '>';
  std::size_t count = 1;
  for (const std::size_t extent : layout.shape) {
    if (__builtin_mul_overflow(count, extent, &count)) fail(source, "shape overflows the address space");
  }
  const std::size_t size = item_size(layout.type);
  layout.data_start = header_start + header_length;
  const std::size_t total = total_size.value_or(bytes.size());
  if (total < layout.data_start) fail(source, "truncated header");
  if (count > (total - layout.data_start) / size || total - layout.data_start != count * size) {
    fail(source, "data holds " + std::to_string(total - layout.data_start) + " bytes, the header promises " +
                     std::to_string(count) + " elements of " + std::to_string(size) + " bytes");
  }
  return layout;
}

std::size_t NpyLayout::element_count() const {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

double decode_npy_item(const NpyLayout& layout, const char* data, std::size_t position) {
  const char* item = data + position * item_size(layout.type);
  switch (layout.type) {
    case NpyType::float64:
      return load<double>(item, layout.big_endian);
    case NpyType::float32:
      return load<float>(item, layout.big_endian);
    case NpyType::float16:
      return decode(load<std::uint16_t>(item, layout.big_endian), fp16);
    case NpyType::int8:
      return static_cast<std::int8_t>(*item);
    case NpyType::uint8:
      return static_cast<unsigned char>(*item);
    case NpyType::uint16:
    case NpyType::int16:  // torch saves bf16 as int16 bits: the pattern, not the integer
      return load<std::uint16_t>(item, layout.big_endian);
    case NpyType::int32:  // integers (block tables, page indices): their values
      return load<std::int32_t>(item, layout.big_endian);
    case NpyType::int64:  // exact up to 2^53, which every index a judge accepts is far below
      return static_cast<double>(load<std::int64_t>(item, layout.big_endian));
  }
  return 0;
}

// The storage position of C-order element `c_position` (Fortran order stores the first axis fastest).
std::size_t storage_position(const NpyLayout& layout, std::size_t c_position) {
  if (!layout.fortran_order || layout.shape.size() < 2) return c_position;
  std::size_t f_position = 0;
  std::size_t rest = c_position;
  for (std::size_t axis = layout.shape.size(); axis-- > 0;) {
    std::size_t f_stride = 1;  // Fortran order: the product of the extents before this axis
    for (std::size_t before = 0; before < axis; ++before) f_stride *= layout.shape[before];
    f_position += (rest % layout.shape[axis]) * f_stride;
    rest /= layout.shape[axis];
  }
  return f_position;
}

NpyArray parse_npy(const std::string& bytes, const std::string& source) {
  const NpyLayout layout = parse_npy_header(bytes, source);
  NpyArray array;
  array.type = layout.type;
  array.shape = layout.shape;
  const std::size_t count = layout.element_count();
  array.values.resize(count);
  const char* data = bytes.data() + layout.data_start;
  for (std::size_t i = 0; i < count; ++i)
    array.values[i] = decode_npy_item(layout, data, storage_position(layout, i));
  return array;
}

NpyArray read_npy(const std::string& path) {
  const NpyFile file(path);
  NpyArray array;
  array.type = file.layout().type;
  array.shape = file.layout().shape;
  array.values.resize(file.layout().element_count());
  file.read_elements(0, array.values);
  return array;
}

void write_npy(const std::string& path, NpyType type, const std::vector<std::size_t>& shape,
               const std::vector<double>& values) {
  std::string shape_text = "(";
  for (const std::size_t extent : shape) shape_text += std::to_string(extent) + ",";
  if (shape.size() > 1) shape_text.pop_back();
  shape_text += ")";
  std::string header = std::string("{'descr': '") + type_code(type) +
                       "', 'fortran_order': False, 'shape': " + shape_text + ", }";
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
      case NpyType::float64:
        out.write(reinterpret_cast<const char*>(&value), 8);
        break;
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
      case NpyType::uint16:
      case NpyType::int16: {
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
      case NpyType::int32: {
        const auto integer = static_cast<std::int32_t>(value);
        out.write(reinterpret_cast<const char*>(&integer), 4);
        break;
      }
      case NpyType::int64: {
        const auto integer = static_cast<std::int64_t>(value);
        out.write(reinterpret_cast<const char*>(&integer), 8);
        break;
      }
    }
  }
  write_file_atomically(path, out.str());
}

namespace {

bool names_an_archive(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".npz") == 0;
}

}  // namespace

NpyFile::NpyFile(const std::string& path) : path_(path) {
  const ArrayPath where = split_array_path(path);
  mapping_ = std::make_unique<MappedFile>(where.file);
  std::string_view bytes = mapping_->bytes();
  if (!where.member.empty()) {
    const auto members = list_npz_members(bytes, where.file);
    const NpzMember& member = find_npz_member(members, where.member, where.file);
    if (member.method == 8) {
      // The header alone first: its shape is checked before the member costs its inflated size.
      constexpr std::size_t header_prefix = std::size_t{1} << 20;
      deflated_ = member;
      layout_ = parse_npy_header(npz_member_prefix(bytes, member, header_prefix, where.file), path,
                                 static_cast<std::size_t>(member.size));
      cols_ = layout_.shape.empty() ? 1 : layout_.shape.back();
      rows_ = 1;
      for (std::size_t axis = 0; axis + 1 < layout_.shape.size(); ++axis) rows_ *= layout_.shape[axis];
      return;
    }
    bytes = npz_member_bytes(bytes, member, inflated_, where.file);
  } else if (names_an_archive(where.file)) {
    fail(path, "is an .npz bundle: name one of its arrays as " + path + ":NAME");
  }
  bytes_ = bytes.data();
  layout_ = parse_npy_header(bytes, path);
  cols_ = layout_.shape.empty() ? 1 : layout_.shape.back();
  rows_ = 1;
  for (std::size_t axis = 0; axis + 1 < layout_.shape.size(); ++axis) rows_ *= layout_.shape[axis];
}

NpyFile::~NpyFile() = default;

const char* NpyFile::bytes() const {
  if (deflated_) {
    std::call_once(inflate_once_, [&] {
      const ArrayPath where = split_array_path(path_);
      const std::string_view whole = npz_member_bytes(mapping_->bytes(), *deflated_, inflated_, where.file);
      // The full member must say what its header said.
      const NpyLayout full = parse_npy_header(whole, path_);
      if (full.shape != layout_.shape || full.type != layout_.type || full.data_start != layout_.data_start)
        fail(path_, "the inflated member disagrees with its header");
      bytes_ = whole.data();
    });
  }
  return bytes_;
}

void NpyFile::read_elements(std::size_t first, std::span<double> out) const {
  const char* data = bytes() + layout_.data_start;
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = decode_npy_item(layout_, data, storage_position(layout_, first + i));
}

// The pages of elements already read are not needed again: let the kernel drop them from memory
// (C order, read in place only).
void NpyFile::release(std::size_t first_element, std::size_t count) const {
  if (layout_.fortran_order || deflated_) return;
  const std::size_t item = item_size(layout_.type);
  const auto offset = static_cast<std::size_t>(bytes_ - mapping_->bytes().data()) + layout_.data_start;
  mapping_->release(offset + first_element * item, offset + (first_element + count) * item);
}

Matrix NpyFile::read_rows(std::size_t first, std::size_t count) const {
  Matrix matrix(count, cols_);
  read_elements(first * cols_, matrix.values);
  release(first * cols_, count * cols_);
  return matrix;
}

NpyLanes lanes_along(const std::vector<std::size_t>& shape, std::size_t axis) {
  NpyLanes lanes;
  if (shape.empty()) return lanes;
  lanes.axis = axis;
  lanes.extent = shape[axis];
  std::size_t total = 1;
  for (std::size_t a = 0; a < shape.size(); ++a) {
    total *= shape[a];
    if (a > axis) lanes.inner *= shape[a];
  }
  lanes.count = lanes.extent == 0 ? 0 : total / lanes.extent;
  return lanes;
}

Matrix NpyFile::read_lanes(const NpyLanes& lanes, std::size_t first, std::size_t count) const {
  if (lanes.inner == 1) return read_rows(first, count);
  Matrix matrix(count, lanes.extent);
  const char* data = bytes() + layout_.data_start;
  for (std::size_t r = 0; r < count; ++r) {
    for (std::size_t a = 0; a < lanes.extent; ++a)
      matrix(r, a) = decode_npy_item(layout_, data, storage_position(layout_, lanes.c_index(first + r, a)));
  }
  return matrix;
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
