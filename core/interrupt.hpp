// SIGINT and SIGTERM as a request to stop: long runs (the gate, a plugin's child) poll
// `interrupt_signal()` between units of work, stop taking new ones, write what they have and exit
// 128 + the signal (130, 143), instead of dying with nothing written. So is every other signal whose
// default is to end the process quietly (a closed terminal's SIGHUP, SIGUSR1/2, a timer's
// SIGALRM, a CPU limit's SIGXCPU), which would otherwise leave a plugin's process running and the
// report unfinished.
#pragma once

#include <signal.h>

#include <span>

namespace sharpcheck {

// The signals treated as a request to stop (SIGINT and SIGTERM first).
[[nodiscard]] std::span<const int> stop_signals();

// Installs the handlers for stop_signals() (idempotent), and ignores SIGPIPE (a report or console
// whose reader went away is an I/O error, not the end). A second signal of the same kind ends the
// process at once.
void catch_interrupts();
// 0 while no signal arrived; otherwise the signal's number.
[[nodiscard]] int interrupt_signal();
// Whether such a signal is meant for work started on this thread: always where the process
// catches interrupts (catch_interrupts: the CLI), else only inside an InterruptScope on this
// thread (a Python call in the main thread; a call from another Python thread is never stopped,
// as Python raises KeyboardInterrupt in the main thread alone). Work that polls from worker
// threads captures it where it starts (core/parallel.hpp).
[[nodiscard]] bool interrupts_apply_here();

// SIGINT caught for the life of the object, for a host whose own handler cannot run meanwhile
// (the Python module, whose handler runs only between bytecodes, around a call made without the
// GIL): the work polls interrupt_signal() and stops within one item (Interrupted). Afterwards the
// previous handler is put back and the record cleared; a SIGINT that arrived when no work was left
// to stop it (the object destroyed other than by an exception) is raised again to that handler,
// so it is never lost. Not nested, and for one thread at a time (the Python module's main thread).
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction* previous_;
};

}  // namespace sharpcheck
