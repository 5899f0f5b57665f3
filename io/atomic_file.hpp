// The one way sharpcheck writes a result file: the whole text to a uniquely named temporary file
// beside the target, flushed to disk, then renamed over the target, so a reader (or a concurrent
// run) never sees half a file and a failed write leaves no temporary behind.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace sharpcheck::io {

// Throws IoError naming the path and the system's reason (missing directory, a directory at
// `path`, read-only or full file system, ...). On failure the target is left as it was.
// A symbolic link is written through to its target (the link stays); a path naming a FIFO or a
// device (/dev/null, /dev/stdout) is written in place, never replaced by a regular file (a FIFO
// with no reader is an IoError, not a hang).
void write_file_atomically(const std::string& path, std::string_view text);

// Whether write_file_atomically could write `path` now (IoError naming why not): for a command to
// refuse an unwritable report path before its work rather than after it.
void check_writable(const std::string& path);

// Creates `directory` (and its parents) when missing; IoError naming it when that fails or when
// the path exists and is not a writable directory.
void make_writable_directory(const std::string& directory);

// A file written as a stream and committed whole: commit() writes it atomically (IoError on
// failure). Nothing is written when it is destroyed without commit().
class OutputFile : public std::ostringstream {
 public:
  explicit OutputFile(std::string path) : path_(std::move(path)) {}
  void commit() { write_file_atomically(path_, str()); }

 private:
  std::string path_;
};

}  // namespace sharpcheck::io
