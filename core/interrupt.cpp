#include "core/interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace sharpcheck {
namespace {

std::atomic<int> received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler stores into it");

extern "C" void on_interrupt(int signal_number) {
  if (received.exchange(signal_number) != 0) _exit(128 + signal_number);
}

}  // namespace

void catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocking poll or wait returns EINTR and looks again
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int interrupt_signal() { return received.load(); }

}  // namespace sharpcheck
