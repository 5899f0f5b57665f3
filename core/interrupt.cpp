#include "core/interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <exception>

namespace sharpcheck {
namespace {

std::atomic<int> received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler stores into it");

// The first stop signal is kept (its number is the exit code). A second SIGINT, SIGTERM or SIGHUP
// ends the process at once (someone insists); the timers' and the CPU limit's signals repeat by
// themselves (SIGXCPU every CPU second past the soft limit), so a repeat of those is ignored.
extern "C" void on_interrupt(int signal_number) {
  int none = 0;
  if (received.compare_exchange_strong(none, signal_number)) return;
  if (signal_number == SIGINT || signal_number == SIGTERM || signal_number == SIGHUP)
    _exit(128 + signal_number);
}

// Within an InterruptScope: recorded only (the host decides what a second one means).
extern "C" void on_scoped_interrupt(int signal_number) { received.store(signal_number); }

constexpr int stopping[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU};

struct sigaction saved_action {};
std::atomic<bool> process_catches{false};
thread_local bool in_scope = false;

}  // namespace

std::span<const int> stop_signals() { return stopping; }

bool interrupts_apply_here() { return process_catches.load() || in_scope; }

void catch_interrupts() {
  process_catches.store(true);
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocking poll or wait returns EINTR and looks again
  for (const int signal_number : stopping) sigaction(signal_number, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int interrupt_signal() { return received.load(); }

InterruptScope::InterruptScope() : previous_(&saved_action) {
  in_scope = true;
  received.store(0);
  struct sigaction action {};
  action.sa_handler = on_scoped_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  sigaction(SIGINT, &action, previous_);
}

InterruptScope::~InterruptScope() {
  in_scope = false;
  sigaction(SIGINT, previous_, nullptr);
  const int arrived = received.exchange(0);
  if (arrived != 0 && std::uncaught_exceptions() == 0) raise(arrived);
}

}  // namespace sharpcheck
