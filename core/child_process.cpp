#include "core/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/interrupt.hpp"

namespace sharpcheck {
namespace {

constexpr std::size_t console_limit = 64 * 1024;
constexpr int poll_slice_ms = 50;  // how often the parent looks at the clock, the child and signals

void out_of_memory() { _exit(child_out_of_memory_status); }

// In the child: its own group, default signal dispositions, the limits, console to the pipe.
[[noreturn]] void become_child(int result_fd, int console_fd, const ChildLimits& limits,
                               const std::function<std::pair<std::string, int>()>& work) {
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  dup2(console_fd, STDOUT_FILENO);
  dup2(console_fd, STDERR_FILENO);
  close(console_fd);
  if (limits.memory_bytes > 0) {
    const rlimit limit{limits.memory_bytes, limits.memory_bytes};
    setrlimit(RLIMIT_AS, &limit);
    std::set_new_handler(out_of_memory);
  }
  const auto [result, status] = work();
  std::size_t written = 0;
  while (written < result.size()) {
    const ssize_t count = write(result_fd, result.data() + written, result.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) break;
    written += static_cast<std::size_t>(count);
  }
  std::fflush(nullptr);
  _exit(status);
}

// Reads what is ready on fd into text (up to limit bytes kept); false at end of file.
bool drain(int fd, std::string& text, std::size_t limit) {
  char buffer[65536];
  const ssize_t count = read(fd, buffer, sizeof buffer);
  if (count < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (count <= 0) return false;
  const std::size_t room = text.size() < limit ? limit - text.size() : 0;
  text.append(buffer, std::min(room, static_cast<std::size_t>(count)));
  return true;
}

}  // namespace

ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work, const ChildLimits& limits) {
  ChildOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int result_pipe[2];
  int console_pipe[2];
  if (pipe2(result_pipe, O_CLOEXEC) != 0) return outcome;
  if (pipe2(console_pipe, O_CLOEXEC) != 0) {
    close(result_pipe[0]);
    close(result_pipe[1]);
    return outcome;
  }
  // Orphans of the child (what a plugin forked) are re-parented to this process rather than to
  // init, so the whole group can be reaped below and no zombie outlives the call.
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  std::fflush(nullptr);  // no buffered output may be written twice
  const pid_t child = fork();
  if (child == 0) {
    close(result_pipe[0]);
    close(console_pipe[0]);
    become_child(result_pipe[1], console_pipe[1], limits, work);
  }
  close(result_pipe[1]);
  close(console_pipe[1]);
  if (child < 0) {
    close(result_pipe[0]);
    close(console_pipe[0]);
    return outcome;
  }
  setpgid(child, child);  // also here: the group exists before the parent may need to kill it
  bool result_open = true;
  bool console_open = true;
  bool exited = false;
  while (true) {
    if (interrupt_signal() != 0) {
      outcome.ending = ChildOutcome::Ending::interrupted;
      break;
    }
    if (!(elapsed() < limits.timeout_seconds)) {  // also true for a NaN limit: never wait forever
      outcome.ending = ChildOutcome::Ending::timed_out;
      break;
    }
    // The child gone and its pipes at end: done. A grandchild holding a pipe open must not make
    // a finished call look hung, so once the child has exited the group is killed below.
    siginfo_t info{};
    exited = exited || (waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == child);
    if (exited) kill(-child, SIGKILL);
    if (!result_open && !console_open) break;
    pollfd descriptors[2] = {{result_open ? result_pipe[0] : -1, POLLIN, 0}, {console_open ? console_pipe[0] : -1, POLLIN, 0}};
    if (poll(descriptors, 2, poll_slice_ms) <= 0) continue;
    if (result_open && (descriptors[0].revents & (POLLIN | POLLHUP)) != 0) {
      result_open = drain(result_pipe[0], outcome.output, static_cast<std::size_t>(-1));
    }
    if (console_open && (descriptors[1].revents & (POLLIN | POLLHUP)) != 0) {
      console_open = drain(console_pipe[0], outcome.console, console_limit);
    }
  }
  close(result_pipe[0]);
  close(console_pipe[0]);
  kill(-child, SIGKILL);  // the whole group: the child (if still there) and everything it forked
  int status = 0;
  rusage usage{};
  while (wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  // The child's own children are ours now (a subreaper's): reap every member of its group.
  while (waitpid(-child, nullptr, 0) > 0 || errno == EINTR) {
  }
  outcome.peak_rss_kib = static_cast<std::size_t>(usage.ru_maxrss);
  outcome.seconds = elapsed();
  if (outcome.ending == ChildOutcome::Ending::interrupted || outcome.ending == ChildOutcome::Ending::timed_out) {
    return outcome;
  }
  if (WIFSIGNALED(status)) {
    outcome.ending = ChildOutcome::Ending::killed_by_signal;
    outcome.signal = strsignal(WTERMSIG(status));
  } else if (WEXITSTATUS(status) == child_out_of_memory_status && limits.memory_bytes > 0) {
    outcome.ending = ChildOutcome::Ending::out_of_memory;
  } else {
    outcome.ending = ChildOutcome::Ending::exited;
    outcome.exit_code = WEXITSTATUS(status);
  }
  return outcome;
}

std::size_t default_child_memory() {
#if defined(__SANITIZE_ADDRESS__)
  return 0;
#else
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size) / 2;
#endif
}

std::string describe_ending(const ChildOutcome& outcome, const ChildLimits& limits) {
  switch (outcome.ending) {
    case ChildOutcome::Ending::exited: return "exited with status " + std::to_string(outcome.exit_code);
    case ChildOutcome::Ending::killed_by_signal: return "killed by " + outcome.signal;
    case ChildOutcome::Ending::timed_out:
      return "no answer within " + std::to_string(limits.timeout_seconds) + " s (killed)";
    case ChildOutcome::Ending::out_of_memory:
      return "ran out of its memory limit of " + std::to_string(limits.memory_bytes >> 20) + " MiB (killed)";
    case ChildOutcome::Ending::interrupted: return "interrupted (the gate received a signal)";
    case ChildOutcome::Ending::could_not_start: return "could not start a child process";
  }
  return "?";
}

}  // namespace sharpcheck
