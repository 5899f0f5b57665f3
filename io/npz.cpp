#include "io/npz.hpp"

#include <zlib.h>

#include <algorithm>
#include <limits>
#include <new>

#include "core/errors.hpp"

namespace sharpcheck::io {
namespace {

constexpr std::uint32_t end_signature = 0x06054b50;
constexpr std::uint32_t zip64_end_signature = 0x06064b50;
constexpr std::uint32_t zip64_locator_signature = 0x07064b50;
constexpr std::uint32_t central_signature = 0x02014b50;
constexpr std::uint32_t local_signature = 0x04034b50;

[[noreturn]] void malformed(const std::string& source, const std::string& what) {
  throw InputError(InputProblem::out_of_range, source + ": not a readable .npz archive: " + what);
}

// Little-endian reads that refuse to run past the end of the archive.
struct Reader {
  std::string_view bytes;
  const std::string& source;
  [[nodiscard]] std::uint64_t read(std::uint64_t at, unsigned width) const {
    if (at > bytes.size() || bytes.size() - at < width)
      malformed(source, "a record at byte " + std::to_string(at) + " runs past the end");
    std::uint64_t value = 0;
    for (unsigned b = 0; b < width; ++b)
      value |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[at + b])) << (8 * b);
    return value;
  }
  [[nodiscard]] std::uint16_t u16(std::uint64_t at) const { return static_cast<std::uint16_t>(read(at, 2)); }
  [[nodiscard]] std::uint32_t u32(std::uint64_t at) const { return static_cast<std::uint32_t>(read(at, 4)); }
  [[nodiscard]] std::uint64_t u64(std::uint64_t at) const { return read(at, 8); }
};

struct Directory {
  std::uint64_t entries = 0;
  std::uint64_t offset = 0;
};

// The end-of-central-directory record (searched back from the end, past a comment of up to
// 65,535 bytes), and its zip64 twin when the classic fields are saturated.
Directory find_directory(const Reader& in) {
  const std::size_t size = in.bytes.size();
  if (size < 22) malformed(in.source, "shorter than an end-of-directory record");
  const std::size_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
  for (std::size_t at = size - 22 + 1; at-- > lowest;) {
    if (in.u32(at) != end_signature) continue;
    Directory directory{in.u16(at + 10), in.u32(at + 16)};
    if (directory.entries == 0xFFFF || directory.offset == 0xFFFFFFFF) {
      if (at < 20 || in.u32(at - 20) != zip64_locator_signature)
        malformed(in.source, "saturated directory fields without a zip64 locator");
      const std::uint64_t record = in.u64(at - 20 + 8);
      if (in.u32(record) != zip64_end_signature) malformed(in.source, "bad zip64 end-of-directory record");
      directory = {in.u64(record + 32), in.u64(record + 48)};
    }
    return directory;
  }
  malformed(in.source, "no end-of-central-directory record");
}

// Fields saturated at 0xFFFFFFFF are in the zip64 extra field (id 1), in this order.
void read_zip64_extra(const Reader& in, std::uint64_t extra, std::uint16_t length, NpzMember& member) {
  for (std::uint64_t at = extra; at + 4 <= extra + length;) {
    const std::uint16_t id = in.u16(at);
    const std::uint16_t field_size = in.u16(at + 2);
    if (id == 1) {
      std::uint64_t field = at + 4;
      for (std::uint64_t* value : {&member.size, &member.compressed_size, &member.local_header_offset}) {
        if (*value != 0xFFFFFFFF) continue;
        if (field + 8 > at + 4 + field_size)
          malformed(in.source, "short zip64 extra field of " + member.name);
        *value = in.u64(field);
        field += 8;
      }
      return;
    }
    at += 4 + field_size;
  }
}

}  // namespace

std::vector<NpzMember> list_npz_members(std::string_view archive, const std::string& source) {
  const Reader in{archive, source};
  const Directory directory = find_directory(in);
  if (directory.entries > archive.size() / 46) malformed(source, "more directory entries than bytes allow");
  std::vector<NpzMember> members;
  std::uint64_t at = directory.offset;
  for (std::uint64_t e = 0; e < directory.entries; ++e) {
    if (in.u32(at) != central_signature)
      malformed(source, "bad central directory entry " + std::to_string(e));
    NpzMember member;
    const std::uint16_t flags = in.u16(at + 8);
    member.method = in.u16(at + 10);
    member.crc32 = in.u32(at + 16);
    member.compressed_size = in.u32(at + 20);
    member.size = in.u32(at + 24);
    const std::uint16_t name_length = in.u16(at + 28);
    const std::uint16_t extra_length = in.u16(at + 30);
    const std::uint16_t comment_length = in.u16(at + 32);
    member.local_header_offset = in.u32(at + 42);
    static_cast<void>(in.read(at + 46, name_length));  // bounds check only
    member.name = std::string(archive.substr(at + 46, name_length));
    if ((flags & 1) != 0) malformed(source, member.name + " is encrypted");
    read_zip64_extra(in, at + 46 + name_length, extra_length, member);
    // Two members of one name (x and x, or x and x.npy): readers disagree on which is meant
    // (NumPy takes the last, a first-match search the first), so neither is judged.
    for (const NpzMember& earlier : members) {
      const auto stem = [](const std::string& name) {
        return name.size() > 4 && name.ends_with(".npy") ? name.substr(0, name.size() - 4) : name;
      };
      if (stem(earlier.name) == stem(member.name))
        malformed(source, "two members named '" + stem(member.name) + "' (" + earlier.name + " and " +
                              member.name + "): which one is meant is ambiguous");
    }
    members.push_back(std::move(member));
    at += 46 + std::uint64_t{name_length} + extra_length + comment_length;
  }
  return members;
}

bool npz_member_is(const NpzMember& member, const std::string& name) {
  return member.name == name || member.name == name + ".npy";
}

const NpzMember& find_npz_member(const std::vector<NpzMember>& members, const std::string& name,
                                 const std::string& source) {
  for (const auto& member : members) {
    if (npz_member_is(member, name)) return member;
  }
  std::string names;
  for (const auto& member : members) names += (names.empty() ? "" : ", ") + member.name;
  throw InputError(InputProblem::out_of_range, source + ": no member '" + name + "' (the archive holds " +
                                                   (names.empty() ? "none" : names) + ")");
}

namespace {

// The member's stored (possibly deflated) bytes in the archive.
std::string_view packed_bytes(std::string_view archive, const NpzMember& member, const std::string& source) {
  const Reader in{archive, source};
  const std::string where = source + ":" + member.name;
  const std::uint64_t header = member.local_header_offset;
  if (in.u32(header) != local_signature) malformed(where, "bad local header");
  // The local header must name the member as the central directory does (as Python's zipfile
  // requires): two names for one member are two readings of the archive.
  const std::uint16_t name_length = in.u16(header + 26);
  if (header + 30 + name_length > archive.size()) malformed(where, "the local header runs past the end");
  const std::string_view local_name = archive.substr(header + 30, name_length);
  if (local_name != member.name)
    malformed(where, "its local header names it '" + std::string(local_name) +
                         "': which name is meant is ambiguous");
  const std::uint64_t data = header + 30 + name_length + in.u16(header + 28);
  if (data > archive.size() || archive.size() - data < member.compressed_size)
    malformed(where, "the member's data runs past the end");
  return archive.substr(data, member.compressed_size);
}

}  // namespace

std::string npz_member_prefix(std::string_view archive, const NpzMember& member, std::size_t limit,
                              const std::string& source) {
  const std::string_view packed = packed_bytes(archive, member, source);
  const std::size_t wanted = static_cast<std::size_t>(std::min<std::uint64_t>(limit, member.size));
  if (member.method != 8) return std::string(packed.substr(0, std::min(wanted, packed.size())));
  std::string prefix(wanted, '\0');
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK)
    malformed(source + ":" + member.name, "zlib could not start");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  stream.avail_in = static_cast<uInt>(std::min<std::size_t>(packed.size(), std::numeric_limits<uInt>::max()));
  stream.next_out = reinterpret_cast<Bytef*>(prefix.data());
  stream.avail_out = static_cast<uInt>(prefix.size());
  inflate(&stream, Z_SYNC_FLUSH);  // stops when the prefix is full; a corrupt stream is caught later
  prefix.resize(stream.total_out);
  inflateEnd(&stream);
  return prefix;
}

std::string_view npz_member_bytes(std::string_view archive, const NpzMember& member, std::string& storage,
                                  const std::string& source) {
  const std::string where = source + ":" + member.name;
  const std::string_view packed = packed_bytes(archive, member, source);
  std::string_view bytes;
  if (member.method == 0) {
    if (member.size != member.compressed_size) malformed(where, "a stored member whose sizes differ");
    bytes = packed;
  } else if (member.method == 8) {
    // Deflate expands at most 1032:1; a larger claim is a corrupt or hostile header.
    if (member.size > 1032 * member.compressed_size + 1024) malformed(where, "an impossible inflated size");
    if (member.size > std::numeric_limits<uInt>::max() || packed.size() > std::numeric_limits<uInt>::max())
      malformed(where, "a deflated member over 4 GiB (save the bundle with np.savez, uncompressed)");
    try {
      storage.assign(member.size, '\0');
    } catch (const std::bad_alloc&) {
      malformed(where, "inflating it needs " + std::to_string(member.size) +
                           " bytes, more memory than this process may use");
    }
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) malformed(where, "zlib could not start");
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
    stream.avail_in = static_cast<uInt>(packed.size());
    stream.next_out = reinterpret_cast<Bytef*>(storage.data());
    stream.avail_out = static_cast<uInt>(storage.size());
    const int status = inflate(&stream, Z_FINISH);
    const auto produced = stream.total_out;
    inflateEnd(&stream);
    if (status != Z_STREAM_END || produced != member.size) malformed(where, "corrupt deflate data");
    bytes = storage;
  } else {
    malformed(where, "compression method " + std::to_string(member.method) + " (only stored and deflate)");
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::size_t at = 0; at < bytes.size(); at += 1U << 30) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - at, 1U << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(chunk));
  }
  if (crc != member.crc32) malformed(where, "CRC-32 mismatch (the member is corrupt)");
  return bytes;
}

ArrayPath split_array_path(const std::string& path) {
  const auto at = path.rfind(".npz:");
  if (at == std::string::npos) return {path, ""};
  return {path.substr(0, at + 4), path.substr(at + 5)};
}

}  // namespace sharpcheck::io
