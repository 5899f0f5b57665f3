#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.hpp"

namespace sharpcheck::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(InputProblem::out_of_range, path + ": " + what);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) fail(path, std::string("cannot be opened: ") + std::strerror(errno));
  struct stat status {};
  if (::fstat(descriptor, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(descriptor);
    fail(path, "is not a regular file");
  }
  size_ = static_cast<std::size_t>(status.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, descriptor, 0);
    if (mapped == MAP_FAILED) {
      ::close(descriptor);
      fail(path, std::string("cannot be mapped: ") + std::strerror(errno));
    }
    bytes_ = static_cast<const char*>(mapped);
  }
  ::close(descriptor);
}

MappedFile::~MappedFile() {
  if (bytes_ != nullptr) ::munmap(const_cast<char*>(bytes_), size_);
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;  // only whole pages: a neighbour's bytes stay mapped
  end = end / page * page;
  if (bytes_ != nullptr && end > begin && end <= size_)
    ::madvise(const_cast<char*>(bytes_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace sharpcheck::io
