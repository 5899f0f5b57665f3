// The GIL released for a long computation (a reference or a judgement on every core), with
// Ctrl-C kept working: Python's own SIGINT handler runs only between bytecodes, so without this a
// Ctrl-C waited for the whole call (minutes for a large backward). In the main thread, SIGINT is
// caught for the call (core/interrupt.hpp's InterruptScope) where Python's default handler is
// installed: the work stops within one item and the call raises KeyboardInterrupt
// (translate_errors maps Interrupted). Other threads, and programs that ignore SIGINT or handle it
// themselves, release the GIL only (their calls are never stopped by it).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "core/interrupt.hpp"

namespace sharpcheck::python {

class Released {
 public:
  Released() {
    if (PyThread_get_thread_ident() == main_thread() && default_handler_installed()) scope_.emplace();
    release_.emplace();
  }
  Released(const Released&) = delete;
  Released& operator=(const Released&) = delete;

 private:
  // Only where Ctrl-C would raise KeyboardInterrupt anyway: a program that ignores SIGINT
  // (multiprocessing's workers) or handles it itself keeps its own handler for the call.
  static bool default_handler_installed() {
    const pybind11::module_ signal = pybind11::module_::import("signal");
    return signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler"));
  }
  static unsigned long main_thread() {
    static const unsigned long ident =
        pybind11::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
    return ident;
  }
  std::optional<InterruptScope> scope_;
  std::optional<pybind11::gil_scoped_release> release_;  // destroyed first: the GIL back, then the handler
};

}  // namespace sharpcheck::python
