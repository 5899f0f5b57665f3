// Runs work in a forked child process under a time limit and collects what it writes, so that a
// crash, a hang or a runaway solver in the work cannot take the caller down with it.
#pragma once

#include <functional>
#include <string>

namespace sharpcheck {

struct ChildOutcome {
  enum class Ending { exited, killed_by_signal, timed_out, could_not_start };
  Ending ending = Ending::could_not_start;
  int exit_code = 0;       // when exited
  std::string signal;      // when killed by a signal: its name
  std::string output;      // everything the work returned (written through a pipe)
  double seconds = 0;
};

// Forks; the child runs `work`, writes its result to the parent and exits with `work`'s status
// (the second member of the pair). The parent waits at most timeout_seconds, then kills it.
[[nodiscard]] ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work,
                                        double timeout_seconds);

}  // namespace sharpcheck
