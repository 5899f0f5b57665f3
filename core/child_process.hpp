// Runs work in a forked child process under a time and memory limit and collects what it writes,
// so that a crash, a hang, a fork bomb or a runaway allocation in the work cannot take the caller
// down with it. The child leads a process group of its own; the whole group is killed when the
// work ends, times out or the caller is interrupted, so nothing it started outlives the call.
// What left the group (setsid, then a double fork, as a daemon does) is killed too: the child is
// the subreaper of what its work starts and kills all of it before it exits, and if the child dies
// first (a crash, a time-out), its orphans come to this process, also a subreaper, which kills
// every child of its own that started after the call's child and is no other call's child. Only
// in that second case could a library user's own child, started by another thread while a call is
// finishing, be taken for a stray; the CLI starts none.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace sharpcheck {

struct ChildLimits {
  double timeout_seconds = 10;
  std::size_t memory_bytes = 0;  // address-space limit of the child; 0: none
};

struct ChildOutcome {
  enum class Ending { exited, killed_by_signal, timed_out, out_of_memory, interrupted, could_not_start };
  Ending ending = Ending::could_not_start;
  int exit_code = 0;    // when exited
  std::string signal;   // when killed by a signal: its name
  std::string output;   // everything the work returned (written through a pipe)
  std::string console;  // what the child printed on stdout and stderr (at most 64 KiB)
  std::size_t peak_rss_kib = 0;
  double seconds = 0;
};

// The child's exit status when an allocation failed under the memory limit.
inline constexpr int child_out_of_memory_status = 125;

// Forks; the child runs `work`, writes its result to the parent and exits with `work`'s status
// (the second member of the pair). The parent waits at most limits.timeout_seconds, then kills
// the child's process group; it also stops at once on SIGINT/SIGTERM (core/interrupt.hpp).
[[nodiscard]] ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work,
                                        const ChildLimits& limits);
[[nodiscard]] inline ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work,
                                               double timeout_seconds) {
  return run_in_child(work, ChildLimits{.timeout_seconds = timeout_seconds, .memory_bytes = 0});
}

// The default memory limit of a child: half the machine's physical memory (0, no limit, in a build
// under AddressSanitizer, whose shadow memory an address-space limit would break).
[[nodiscard]] std::size_t default_child_memory();

// A name for an ending, for messages ("timed out", "killed by Segmentation fault", ...).
[[nodiscard]] std::string describe_ending(const ChildOutcome& outcome, const ChildLimits& limits);

}  // namespace sharpcheck
