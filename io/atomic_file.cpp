#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/errors.hpp"

namespace sharpcheck::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw IoError("cannot write '" + path + "': " + what +
                (error != 0 ? std::string(": ") + std::strerror(error) : ""));
}

bool write_all(int descriptor, std::string_view text) {
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t count = ::write(descriptor, text.data() + written, text.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) return false;
    written += static_cast<std::size_t>(count);
  }
  return true;
}

// A path that names something other than a regular file (a FIFO, a character device such
// as /dev/null or /dev/stdout): written in place, never replaced. A FIFO is opened without blocking,
// so one with no reader is an error rather than a hang.
void write_in_place(const std::string& path, std::string_view text, bool fifo) {
  const int descriptor = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (descriptor < 0) fail(path, fifo ? "a FIFO with no reader, or not writable" : "cannot open it", errno);
  if (fifo) ::fcntl(descriptor, F_SETFL, ::fcntl(descriptor, F_GETFL) & ~O_NONBLOCK);
  const bool written = write_all(descriptor, text);
  const int error = errno;
  ::close(descriptor);
  if (!written) fail(path, "writing failed", error);
}

// The file a path stands for: a symbolic link's final target (so the link survives and its target
// is written, created if it does not exist yet, as a shell's > would), else the path itself. The
// links are followed one by one: weakly_canonical leaves a dangling link's name as it is, and the
// report then replaced the link itself.
std::string resolved_target(const std::string& path) {
  std::error_code error;
  // /dev/stdout, /dev/fd/N and /proc/*/fd/N name an open descriptor (a terminal, a pipe, a file
  // redirected with >>): written in place through the name itself, never replaced.
  if (path.starts_with("/dev/") || path.starts_with("/proc/")) return path;
  std::filesystem::path target = path;
  for (int hops = 0; std::filesystem::is_symlink(target, error); ++hops) {
    if (hops == 40) fail(path, "too many levels of symbolic links", ELOOP);
    const std::filesystem::path next = std::filesystem::read_symlink(target, error);
    if (error) fail(path, "cannot resolve the symbolic link", error.value());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target.lexically_normal().string();
}

}  // namespace

void write_file_atomically(const std::string& given, std::string_view text) {
  if (given.empty()) fail(given, "empty file name", 0);
  const std::string path = resolved_target(given);
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0) {
    if (S_ISDIR(existing.st_mode)) fail(path, "it is a directory", 0);
    if (S_ISBLK(existing.st_mode)) fail(path, "it is a block device (a disk), not a report", 0);
    if (!S_ISREG(existing.st_mode) || path.starts_with("/dev/") || path.starts_with("/proc/")) {
      write_in_place(path, text, S_ISFIFO(existing.st_mode));
      return;
    }
  }
  // mkstemp's template: a unique name in the target's own directory, so the rename stays on one
  // file system and concurrent runs never share a temporary. The target's own name is cut where the
  // temporary's would pass the file system's limit on a name (a report named with 250 characters),
  // the directory's own (pathconf: 143 on eCryptfs, 255 on most), NAME_MAX where it says none.
  const std::string suffix = ".XXXXXX.partial";
  const std::size_t slash = path.rfind('/'), base = slash == std::string::npos ? 0 : slash + 1;
  const std::string directory = base == 0 ? "." : path.substr(0, base);
  const long limit = ::pathconf(directory.c_str(), _PC_NAME_MAX);
  const std::size_t name_max =
      limit > 0 ? static_cast<std::size_t>(limit) : static_cast<std::size_t>(NAME_MAX);
  const std::size_t longest = name_max > suffix.size() + 1 ? name_max - suffix.size() : 1;
  const std::string stem = path.substr(0, base + std::min(path.size() - base, longest));
  std::vector<char> name(stem.begin(), stem.end());
  name.insert(name.end(), suffix.begin(), suffix.end());
  name.push_back('\0');
  const int descriptor = ::mkstemps(name.data(), static_cast<int>(std::strlen(".partial")));
  if (descriptor < 0) fail(path, "cannot create a temporary file beside it", errno);
  const std::string temporary(name.data());
  const bool written = write_all(descriptor, text);
  const int write_error = errno;
  const bool synced = written && ::fsync(descriptor) == 0;
  const int sync_error = errno;
  const bool closed = ::close(descriptor) == 0;
  if (!written || !synced || !closed) {
    ::unlink(temporary.c_str());
    fail(path, "writing failed", !written ? write_error : sync_error);
  }
  // mkstemp makes the file 0600; a report is for others to read too.
  ::chmod(temporary.c_str(), 0644);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail(path, "cannot rename the temporary file onto it", error);
  }
}

void check_writable(const std::string& given) {
  if (given.empty()) fail(given, "empty file name", 0);
  const std::string path = resolved_target(given);
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0) {
    if (S_ISDIR(existing.st_mode)) fail(path, "it is a directory", 0);
    if (!S_ISREG(existing.st_mode)) {
      if (::access(path.c_str(), W_OK) != 0) fail(path, "not writable", errno);
      return;
    }
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string directory = parent.empty() ? "." : parent.string();
  if (::access(directory.c_str(), W_OK) != 0) fail(path, "its directory is missing or not writable", errno);
}

void make_writable_directory(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw IoError("cannot create directory '" + directory + "': " + error.message());
  if (!std::filesystem::is_directory(directory)) throw IoError("'" + directory + "' is not a directory");
  if (::access(directory.c_str(), W_OK) != 0) {
    throw IoError("directory '" + directory + "' is not writable: " + std::strerror(errno));
  }
}

}  // namespace sharpcheck::io
