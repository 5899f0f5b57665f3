// Runs `count` independent work items on up to `threads` threads (0: every core), each item
// once. Worker threads never let an exception escape: the first one thrown is rethrown to the
// caller after every thread has joined, and no new item starts once one has failed. Where
// interrupts apply to the calling thread (core/interrupt.hpp: the gate, compare, a Python call in
// its main thread), no item starts after SIGINT or SIGTERM either: Interrupted is thrown instead,
// so a long judgement stops within one item.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/errors.hpp"
#include "core/interrupt.hpp"

namespace sharpcheck {

[[nodiscard]] inline unsigned thread_count(unsigned requested) {
  return requested != 0 ? requested : std::max(1U, std::thread::hardware_concurrency());
}

template <typename Work>
void parallel_for(std::size_t count, unsigned threads, const Work& work) {
  const std::size_t workers = std::min<std::size_t>(thread_count(threads), count);
  const bool listening = interrupts_apply_here();  // captured here: the workers are other threads
  const auto stop_if_interrupted = [listening] {
    if (const int signal = interrupt_signal(); listening && signal != 0) throw Interrupted(signal);
  };
  if (workers <= 1) {
    for (std::size_t item = 0; item < count; ++item) {
      stop_if_interrupted();
      work(item);
    }
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  const auto run = [&]() {
    for (std::size_t item = next++; item < count && !failed; item = next++) {
      try {
        stop_if_interrupted();
        work(item);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  try {
    for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(run);
  } catch (...) {  // no thread could be started: stop those that were, then report
    failed = true;
    for (auto& thread : pool) thread.join();
    throw;
  }
  run();
  for (auto& thread : pool) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace sharpcheck
