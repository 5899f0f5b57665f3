// A regular file mapped read-only into memory: files larger than memory are read a page at a
// time, and pages already read can be handed back (release).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sharpcheck::io {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // InputError naming the path when it cannot be mapped
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  [[nodiscard]] std::string_view bytes() const { return {bytes_ == nullptr ? "" : bytes_, size_}; }
  // Lets the kernel drop the pages wholly inside bytes [begin, end) from memory.
  void release(std::size_t begin, std::size_t end) const;

 private:
  const char* bytes_ = nullptr;  // nullptr for an empty file
  std::size_t size_ = 0;
};

}  // namespace sharpcheck::io
