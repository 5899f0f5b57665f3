// SIGINT and SIGTERM as a request to stop: long runs (the gate, a plugin's child) poll
// `interrupt_signal()` between units of work, stop taking new ones, write what they have and exit
// 128 + the signal (130, 143), instead of dying with nothing written.
#pragma once

namespace sharpcheck {

// Installs the handlers (idempotent). A second signal of the same kind ends the process at once.
void catch_interrupts();
// 0 while no signal arrived; otherwise the signal's number.
[[nodiscard]] int interrupt_signal();

}  // namespace sharpcheck
