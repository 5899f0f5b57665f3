#include "core/child_process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace sharpcheck {

ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work, double timeout_seconds) {
  ChildOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int channel[2];
  if (pipe(channel) != 0) return outcome;
  std::fflush(nullptr);  // no buffered output may be written twice
  const pid_t child = fork();
  if (child < 0) {
    close(channel[0]);
    close(channel[1]);
    return outcome;
  }
  if (child == 0) {
    close(channel[0]);
    const auto [result, status] = work();
    std::size_t written = 0;
    while (written < result.size()) {
      const ssize_t count = write(channel[1], result.data() + written, result.size() - written);
      if (count <= 0) break;
      written += static_cast<std::size_t>(count);
    }
    _exit(status);
  }
  close(channel[1]);
  char buffer[65536];
  bool timed_out = false;
  while (true) {
    const double left = timeout_seconds - elapsed();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd descriptor{channel[0], POLLIN, 0};
    if (poll(&descriptor, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    const ssize_t count = read(channel[0], buffer, sizeof buffer);
    if (count <= 0) break;
    outcome.output.append(buffer, static_cast<std::size_t>(count));
  }
  close(channel[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  outcome.seconds = elapsed();
  if (timed_out) {
    outcome.ending = ChildOutcome::Ending::timed_out;
  } else if (WIFSIGNALED(status)) {
    outcome.ending = ChildOutcome::Ending::killed_by_signal;
    outcome.signal = strsignal(WTERMSIG(status));
  } else {
    outcome.ending = ChildOutcome::Ending::exited;
    outcome.exit_code = WEXITSTATUS(status);
  }
  return outcome;
}

}  // namespace sharpcheck
