// The .npz reader against bundles numpy wrote (np.savez: stored members; np.savez_compressed:
// deflated), and the same bytes damaged: every damage is refused, naming the archive and what.
#include "io/npz.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/errors.hpp"
#include "io/mapped_file.hpp"
#include "io/npy.hpp"

namespace {

using sharpcheck::InputError;
using testing::HasSubstr;

const std::string data = SHARPCHECK_NPY_DATA;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Each test process writes its own files: ctest -j runs the parameterised cases side by side, and
// one case rewriting a file another has memory-mapped killed that one with SIGBUS.
std::string write_temporary(const std::string& name, const std::string& bytes) {
  const auto path =
      (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "-" + name)).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    static_cast<void>(sharpcheck::io::read_npy(path));
  } catch (const InputError& error) {
    return error.what();
  }
  return "no error";
}

class NumpyBundle : public testing::TestWithParam<const char*> {};

TEST_P(NumpyBundle, MembersReadAsTheArraysNumpySaved) {
  const std::string bundle = data + "/" + GetParam();
  const auto logits = sharpcheck::io::read_npy(bundle + ":logits");
  EXPECT_EQ(logits.shape, (std::vector<std::size_t>{2, 3}));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(logits.values[i], static_cast<double>(i) / 8);
  const auto probs = sharpcheck::io::read_npy(bundle + ":probs.npy");  // the stored name works too
  EXPECT_EQ(probs.values, (std::vector<double>{0.25, 0.5, 0.25}));
}

TEST_P(NumpyBundle, AMissingMemberIsRefusedListingTheMembers) {
  const std::string bundle = data + "/" + GetParam();
  EXPECT_THAT(error_of(bundle + ":q"), HasSubstr("no member 'q' (the archive holds logits.npy, probs.npy)"));
  EXPECT_THAT(error_of(bundle), HasSubstr("is an .npz bundle: name one of its arrays"));
}

TEST_P(NumpyBundle, EveryTruncationIsRefused) {
  const std::string bytes = read_bytes(data + "/" + GetParam());
  for (std::size_t length = 0; length < bytes.size(); length += 7) {
    const auto path = write_temporary("truncated.npz", bytes.substr(0, length));
    EXPECT_THAT(error_of(path + ":logits"), HasSubstr("truncated.npz")) << "length " << length;
  }
}

TEST_P(NumpyBundle, AFlippedByteInAMemberFailsItsCrc) {
  std::string bytes = read_bytes(data + "/" + GetParam());
  const auto member =
      sharpcheck::io::find_npz_member(sharpcheck::io::list_npz_members(bytes, "b"), "logits", "b");
  const std::size_t header = member.local_header_offset;
  const std::size_t data_start = header + 30 + static_cast<unsigned char>(bytes[header + 26]) +
                                 static_cast<unsigned char>(bytes[header + 28]) +
                                 256 * static_cast<unsigned char>(bytes[header + 29]);
  bytes[data_start + member.compressed_size - 1] ^= 0x01;
  const auto path = write_temporary("flipped.npz", bytes);
  EXPECT_THAT(error_of(path + ":logits"),
              testing::AnyOf(HasSubstr("CRC-32 mismatch"), HasSubstr("corrupt deflate")));
  EXPECT_EQ(sharpcheck::io::read_npy(path + ":probs").values.size(), 3U);  // the other member is intact
}

// A member whose local header names it otherwise than the central directory does: Python's zipfile
// refuses it, and so does this reader (one of the two names would be a guess).
TEST_P(NumpyBundle, ALocalHeaderNamingTheMemberOtherwiseIsRefused) {
  std::string bytes = read_bytes(data + "/" + GetParam());
  const auto member =
      sharpcheck::io::find_npz_member(sharpcheck::io::list_npz_members(bytes, "b"), "logits", "b");
  ASSERT_EQ(bytes[member.local_header_offset + 30], 'l');
  bytes[member.local_header_offset + 30] = 'p';  // "pogits.npy"
  const auto path = write_temporary("renamed.npz", bytes);
  EXPECT_THAT(error_of(path + ":logits"), HasSubstr("its local header names it 'pogits.npy'"));
  EXPECT_EQ(sharpcheck::io::read_npy(path + ":probs").values.size(), 3U);
}

INSTANTIATE_TEST_SUITE_P(SavezAndSavezCompressed, NumpyBundle,
                         testing::Values("bundle_stored.npz", "bundle_deflated.npz"));

// An .npy file of two float64 values with the given header dict (padded as numpy pads it).
std::string npy_with_header(std::string header) {
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  const double values[] = {0.5, -2.0};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  return bytes;
}

// numpy reads a header dict with exactly descr, fortran_order and shape (a repeated key would be its
// last value there): this reader reads the same dict, and refuses a repeated or unknown key rather
// than read another shape than numpy would.
TEST(NpyHeader, IsReadAsNumpyReadsItAndARepeatedOrUnknownKeyIsRefused) {
  const std::string plain = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
  EXPECT_EQ(sharpcheck::io::read_npy(write_temporary("plain.npy", npy_with_header(plain))).values,
            (std::vector<double>{0.5, -2.0}));
  const std::string reordered = "{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<f8\"}";
  EXPECT_EQ(sharpcheck::io::read_npy(write_temporary("reordered.npy", npy_with_header(reordered))).shape,
            (std::vector<std::size_t>{1, 2}));
  const std::string repeated = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'shape': (2,), }";
  EXPECT_THAT(error_of(write_temporary("repeated.npy", npy_with_header(repeated))),
              HasSubstr("repeats its 'shape' entry"));
  const std::string extra = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), 'offset': 8, }";
  EXPECT_THAT(error_of(write_temporary("extra.npy", npy_with_header(extra))),
              HasSubstr("an entry 'offset' numpy does not accept"));
  const std::string unclosed = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,)";
  EXPECT_THAT(error_of(write_temporary("unclosed.npy", npy_with_header(unclosed))), HasSubstr("not closed"));
}

TEST(NpzPath, SplitsAtTheLastNpzColon) {
  const auto path = sharpcheck::io::split_array_path("dir.npz:x/run.npz:q");
  EXPECT_EQ(path.file, "dir.npz:x/run.npz");
  EXPECT_EQ(path.member, "q");
  EXPECT_EQ(sharpcheck::io::split_array_path("plain.npy").member, "");
}

}  // namespace

// A file truncated under a live mapping: reading past its new end is an input error that says so
// (exit 2), not a crash with SIGBUS.
TEST(MappedFileDeathTest, AFileTruncatedWhileMappedIsAnInputErrorNotABusError) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto path = write_temporary("shrinking.bin", std::string(4 * page, 'x'));
  EXPECT_EXIT(
      {
        const sharpcheck::io::MappedFile file(path);
        std::filesystem::resize_file(path, 0);
        volatile char last = file.bytes()[3 * page];
        static_cast<void>(last);
        std::_Exit(0);
      },
      testing::ExitedWithCode(2), "an input file shrank while it was being read");
}
