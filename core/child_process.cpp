#include "core/child_process.hpp"

#include <dirent.h>
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
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "core/interrupt.hpp"

namespace sharpcheck {
namespace {

constexpr std::size_t console_limit = 64 * 1024;
constexpr int poll_slice_ms = 50;  // how often the parent looks at the clock, the child and signals

void out_of_memory() { _exit(child_out_of_memory_status); }

void kill_own_children();  // below, with the sweep

// In the child: its own group, default signal dispositions, the limits, console to the pipe.
[[noreturn]] void become_child(int result_fd, int console_fd, const ChildLimits& limits,
                               const std::function<std::pair<std::string, int>()>& work) {
  setpgid(0, 0);
  // Orphans of what the work starts come here, not to the gate: the work's own strays are killed
  // below before the child exits, and while it runs nothing of another call's reaches the gate.
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  for (const int signal_number : stop_signals()) signal(signal_number, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  dup2(console_fd, STDOUT_FILENO);
  dup2(console_fd, STDERR_FILENO);
  close(console_fd);
  if (limits.memory_bytes > 0) {
    const rlimit limit{limits.memory_bytes, limits.memory_bytes};
    setrlimit(RLIMIT_AS, &limit);
    std::set_new_handler(out_of_memory);
  }
  const auto [result, status] = work();
  kill_own_children();  // what the work forked, in its group or not (a daemon's setsid and double fork)
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

// The children run_in_child is waiting on (other threads' calls): the sweep below leaves them
// alone. The mutex is also held across fork, so a child is listed before any sweep can see it.
std::mutex children_mutex;
std::set<pid_t> live_children;

struct ProcessStat {
  pid_t parent = 0;
  unsigned long long start = 0;  // clock ticks since boot
};

// Fields 4 (parent) and 22 (start time) of /proc/<pid>/stat; the name (field 2) may hold spaces
// and parentheses, so the fields are counted from its last ')'.
std::optional<ProcessStat> read_stat(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(file, text)) return std::nullopt;
  const std::size_t name_end = text.rfind(')');
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(name_end + 1));
  std::string field;
  ProcessStat stat;
  for (int number = 3; number <= 22 && fields >> field; ++number) {
    if (number == 4) stat.parent = static_cast<pid_t>(std::stol(field));
    if (number == 22) stat.start = std::stoull(field);
  }
  return stat;
}

// Children of this process started at or after `since` that no run_in_child call is waiting on:
// what a plugin left behind outside its process group (setsid, then a double fork), re-parented
// here because this process is their subreaper.
// The pids that /proc lists as this process's children: each thread's `children` file (a few
// reads), or, where the kernel has no such files, every process's parent (a scan of /proc).
std::vector<pid_t> children_of_self() {
  std::vector<pid_t> pids;
  bool listed = false;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (const dirent* entry = readdir(tasks)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream file(std::string("/proc/self/task/") + entry->d_name + "/children");
      listed = listed || file.is_open();
      for (long pid = 0; file >> pid;) pids.push_back(static_cast<pid_t>(pid));
    }
    closedir(tasks);
  }
  if (listed) return pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  const pid_t self = getpid();
  while (const dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    const std::optional<ProcessStat> stat = read_stat(static_cast<pid_t>(pid));
    if (stat && stat->parent == self) pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return pids;
}

std::vector<pid_t> stray_children(unsigned long long since) {
  std::vector<pid_t> found;
  for (const pid_t pid : children_of_self()) {
    const std::optional<ProcessStat> stat = read_stat(pid);
    if (stat && stat->parent == getpid() && stat->start >= since && !live_children.contains(pid))
      found.push_back(pid);
  }
  return found;
}

// In the child: kills and reaps every child of this process, round after round (killing one
// re-parents its own children here, this process being their subreaper).
void kill_own_children() {
  for (int round = 0; round < 1000; ++round) {
    const std::vector<pid_t> children = stray_children(0);
    if (children.empty()) return;
    for (const pid_t pid : children) kill(pid, SIGKILL);
    for (const pid_t pid : children) {
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

// Kills and reaps the strays, round after round: killing one re-parents its own children here.
void sweep_strays(unsigned long long since) {
  for (int round = 0; round < 1000; ++round) {
    const std::vector<pid_t> strays = stray_children(since);
    if (strays.empty()) return;
    for (const pid_t pid : strays) kill(pid, SIGKILL);
    for (const pid_t pid : strays) {
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

// The sweep above under the registry's lock.
void sweep_strays_now(unsigned long long since) {
  const std::lock_guard lock(children_mutex);
  sweep_strays(since);
}

}  // namespace

namespace {

// Reads the child's result and console until both pipes close, the time runs out or a signal
// arrives; sets outcome.ending for the last two. Once the child has exited its group and its
// strays (started since child_start) are killed, so a grandchild holding a pipe open, in the
// group or out of it, cannot make a finished call look hung.
void collect_until_done(pid_t child, unsigned long long child_start, const int pipes[2],
                        const ChildLimits& limits, const std::function<double()>& elapsed,
                        ChildOutcome& outcome) {
  bool open[2] = {true, true};
  bool exited = false;
  std::string* sinks[2] = {&outcome.output, &outcome.console};
  const std::size_t limits_of[2] = {static_cast<std::size_t>(-1), console_limit};
  while (open[0] || open[1]) {
    if (interrupt_signal() != 0) {
      outcome.ending = ChildOutcome::Ending::interrupted;
      return;
    }
    if (!(elapsed() < limits.timeout_seconds)) {  // also true for a NaN limit: never wait forever
      outcome.ending = ChildOutcome::Ending::timed_out;
      return;
    }
    siginfo_t info{};
    exited = exited || (waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                        info.si_pid == child);
    if (exited) {
      kill(-child, SIGKILL);
      sweep_strays_now(child_start);
    }
    pollfd descriptors[2] = {{open[0] ? pipes[0] : -1, POLLIN, 0}, {open[1] ? pipes[1] : -1, POLLIN, 0}};
    if (poll(descriptors, 2, poll_slice_ms) <= 0) continue;
    for (int k = 0; k < 2; ++k) {
      if (open[k] && (descriptors[k].revents & (POLLIN | POLLHUP)) != 0)
        open[k] = drain(pipes[k], *sinks[k], limits_of[k]);
    }
  }
}

// Kills what is left of the child's group, reaps the child and every orphan of its group (this
// process is their subreaper), and classifies how the child ended.
void reap(pid_t child, const ChildLimits& limits, ChildOutcome& outcome) {
  kill(-child, SIGKILL);
  int status = 0;
  rusage usage{};
  while (wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  while (waitpid(-child, nullptr, 0) > 0 || errno == EINTR) {
  }
  outcome.peak_rss_kib = static_cast<std::size_t>(usage.ru_maxrss);
  if (outcome.ending == ChildOutcome::Ending::interrupted ||
      outcome.ending == ChildOutcome::Ending::timed_out)
    return;
  if (WIFSIGNALED(status)) {
    outcome.ending = ChildOutcome::Ending::killed_by_signal;
    outcome.signal = strsignal(WTERMSIG(status));
  } else if (WEXITSTATUS(status) == child_out_of_memory_status && limits.memory_bytes > 0) {
    outcome.ending = ChildOutcome::Ending::out_of_memory;
  } else {
    outcome.ending = ChildOutcome::Ending::exited;
    outcome.exit_code = WEXITSTATUS(status);
  }
}

}  // namespace

ChildOutcome run_in_child(const std::function<std::pair<std::string, int>()>& work,
                          const ChildLimits& limits) {
  ChildOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  const std::function<double()> elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int result_pipe[2];
  int console_pipe[2];
  if (pipe2(result_pipe, O_CLOEXEC) != 0) return outcome;
  if (pipe2(console_pipe, O_CLOEXEC) != 0) {
    close(result_pipe[0]);
    close(result_pipe[1]);
    return outcome;
  }
  // Orphans of the child (what a plugin forked) are re-parented to this process rather than to
  // init, so the whole group can be reaped and no zombie outlives the call.
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  std::fflush(nullptr);  // no buffered output may be written twice
  pid_t child = -1;
  unsigned long long child_start = 0;
  {
    const std::lock_guard lock(children_mutex);
    child = fork();
    if (child == 0) {
      close(result_pipe[0]);
      close(console_pipe[0]);
      become_child(result_pipe[1], console_pipe[1], limits, work);
    }
    if (child > 0) {
      live_children.insert(child);
      if (const std::optional<ProcessStat> stat = read_stat(child)) child_start = stat->start;
    }
  }
  close(result_pipe[1]);
  close(console_pipe[1]);
  const int reading[2] = {result_pipe[0], console_pipe[0]};
  if (child > 0) {
    setpgid(child, child);  // also here: the group exists before the parent may need to kill it
    outcome.ending = ChildOutcome::Ending::exited;  // until collect_until_done or reap says otherwise
    collect_until_done(child, child_start, reading, limits, elapsed, outcome);
  }
  close(reading[0]);
  close(reading[1]);
  if (child < 0) return outcome;
  reap(child, limits, outcome);
  {
    const std::lock_guard lock(children_mutex);
    live_children.erase(child);
    // Everything the child started descends from it, so started no earlier; a start time that
    // could not be read sweeps from boot, which still spares the live calls' children.
    sweep_strays(child_start);
  }
  outcome.seconds = elapsed();
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
    case ChildOutcome::Ending::exited:
      return "exited with status " + std::to_string(outcome.exit_code);
    case ChildOutcome::Ending::killed_by_signal:
      return "killed by " + outcome.signal;
    case ChildOutcome::Ending::timed_out:
      return "no answer within " + std::to_string(limits.timeout_seconds) + " s (killed)";
    case ChildOutcome::Ending::out_of_memory:
      return "ran out of its memory limit of " + std::to_string(limits.memory_bytes >> 20) + " MiB (killed)";
    case ChildOutcome::Ending::interrupted:
      return "interrupted (the gate received a signal)";
    case ChildOutcome::Ending::could_not_start:
      return "could not start a child process";
  }
  return "?";
}

}  // namespace sharpcheck
