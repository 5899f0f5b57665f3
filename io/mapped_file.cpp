#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include "core/errors.hpp"

namespace sharpcheck::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(InputProblem::out_of_range, path + ": " + what);
}

// A mapped file that another process truncates while it is read makes the next read of a page past
// its new end raise SIGBUS. The live mappings are kept here (lock-free, so the handler can read
// them); a SIGBUS inside one ends the program with an input error that says what happened, and
// any other SIGBUS is left to the default action (a crash, as before).
struct LiveMapping {
  std::atomic<const char*> begin{nullptr};
  std::atomic<std::size_t> size{0};
};
constexpr std::size_t tracked_mappings = 64;
LiveMapping live_mappings[tracked_mappings];

void on_bus_error(int signal, siginfo_t* info, void*) {
  const auto* address = static_cast<const char*>(info->si_addr);
  for (const LiveMapping& mapping : live_mappings) {
    const char* begin = mapping.begin.load();
    if (begin != nullptr && address >= begin && address < begin + mapping.size.load()) {
      constexpr char message[] =
          "sharpcheck: input error: an input file shrank while it was being read (another process "
          "truncated or rewrote it); nothing more was judged from it\n";
      [[maybe_unused]] const auto written = ::write(STDERR_FILENO, message, sizeof message - 1);
      ::_exit(2);  // the input-error exit code (cli/commands.hpp)
    }
  }
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void track(const char* begin, std::size_t size) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
  });
  for (LiveMapping& mapping : live_mappings) {
    const char* expected = nullptr;
    if (mapping.begin.compare_exchange_strong(expected, begin)) {
      mapping.size.store(size);  // until this store the slot covers no bytes (size 0)
      return;
    }
  }
  // More than 64 files mapped at once: this one is read untracked (a SIGBUS in it crashes).
}

void untrack(const char* begin) {
  for (LiveMapping& mapping : live_mappings) {
    if (mapping.begin.load() != begin) continue;
    mapping.size.store(0);
    mapping.begin.store(nullptr);
    return;
  }
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
    track(bytes_, size_);
  }
  ::close(descriptor);
}

MappedFile::~MappedFile() {
  if (bytes_ == nullptr) return;
  untrack(bytes_);
  ::munmap(const_cast<char*>(bytes_), size_);
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;  // only whole pages: a neighbour's bytes stay mapped
  end = end / page * page;
  if (bytes_ != nullptr && end > begin && end <= size_)
    ::madvise(const_cast<char*>(bytes_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace sharpcheck::io
