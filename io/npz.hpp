// NumPy .npz bundles (np.savez and np.savez_compressed): a zip archive whose members are .npy
// files, so one file can hold q, k, v, out and lse under their names. Reads stored and deflated
// members (zlib), zip64 records included, checking every offset, size and CRC-32; refuses
// encrypted members and other compression methods, naming the archive and the member.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sharpcheck::io {

struct NpzMember {
  std::string name;          // as stored, e.g. "q.npy"
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint32_t crc32 = 0;
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;
  std::uint64_t local_header_offset = 0;
};

// The members listed in the archive's central directory. InputError naming `source` when the
// bytes are not a well-formed zip archive.
[[nodiscard]] std::vector<NpzMember> list_npz_members(std::string_view archive, const std::string& source);

// Whether `member` is the one called `name` (or `name`.npy, as np.savez stores it).
[[nodiscard]] bool npz_member_is(const NpzMember& member, const std::string& name);

// The member called `name` or `name`.npy; InputError listing the members when there is none.
[[nodiscard]] const NpzMember& find_npz_member(const std::vector<NpzMember>& members, const std::string& name,
                                               const std::string& source);

// The member's bytes (a .npy file): a view into `archive` when stored, else inflated into
// `storage` (the view then points there). Checks the CRC-32 either way.
[[nodiscard]] std::string_view npz_member_bytes(std::string_view archive, const NpzMember& member,
                                                std::string& storage, const std::string& source);

// The first min(limit, size) bytes of a deflated member's contents, inflated alone (enough for a
// .npy header, so that its shape is known before the whole member is inflated; no CRC check).
[[nodiscard]] std::string npz_member_prefix(std::string_view archive, const NpzMember& member,
                                            std::size_t limit, const std::string& source);

// "bundle.npz:q" names member q of bundle.npz; any other path names a whole file (member "").
struct ArrayPath {
  std::string file;
  std::string member;
};
[[nodiscard]] ArrayPath split_array_path(const std::string& path);

}  // namespace sharpcheck::io
