#include "gate/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "core/errors.hpp"
#include "core/interrupt.hpp"
#include "gate/report.hpp"
#include "io/atomic_file.hpp"

namespace sharpcheck::gate {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto report_interval = std::chrono::seconds(1);

// The workers and what they hand over. Its destructor stops and joins them, so no path out of
// run_sweep (an exception included) leaves a joinable thread behind.
class WorkerPool {
 public:
  WorkerPool(const GateSettings& settings, const std::vector<GateCase>& cases)
      : settings_(settings), cases_(cases), finished_(cases.size()) {}
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop_and_join(); }

  // Starts up to `count` threads; fewer when the system refuses more (at least one, or IoError).
  void start(unsigned count) {
    for (unsigned t = 0; t < count; ++t) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        if (threads_.empty()) throw IoError("gate: cannot start a worker thread");
        break;
      }
    }
  }

  // Waits for case i; nullopt when the sweep must stop first (an error or a signal).
  std::optional<CaseOutcome> take(std::size_t i) {
    std::unique_lock<std::mutex> guard(lock_);
    while (!finished_[i].has_value() && !error_) {
      if (interrupt_signal() != 0) return std::nullopt;
      ready_.wait_for(guard, std::chrono::milliseconds(100));
    }
    if (!finished_[i].has_value()) return std::nullopt;
    std::optional<CaseOutcome> outcome = std::move(finished_[i]);
    finished_[i].reset();
    return outcome;
  }

  std::exception_ptr error() {
    const std::lock_guard<std::mutex> guard(lock_);
    return error_;
  }

  void stop_and_join() {
    next_ = cases_.size();
    for (auto& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
  void work() {
    for (std::size_t j = next_++; j < cases_.size(); j = next_++) {
      if (interrupt_signal() != 0) break;
      std::optional<CaseOutcome> outcome;
      try {
        outcome = run_case(cases_[j], settings_);
      } catch (...) {
        const std::lock_guard<std::mutex> guard(lock_);
        if (!error_) error_ = std::current_exception();
        next_ = cases_.size();
      }
      const std::lock_guard<std::mutex> guard(lock_);
      finished_[j] = std::move(outcome);
      ready_.notify_all();
    }
  }

  const GateSettings& settings_;
  const std::vector<GateCase>& cases_;
  std::vector<std::optional<CaseOutcome>> finished_;
  std::mutex lock_;
  std::condition_variable ready_;
  std::atomic<std::size_t> next_{0};
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

unsigned thread_count(const GateSettings& settings) {
  if (settings.plugin) return 1;  // plugin cases fork, which wants a single thread
  return settings.threads != 0 ? settings.threads : std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

void write_reports(const GateSettings& settings, const std::vector<nlohmann::json>& cases, bool complete) {
  nlohmann::json report = report_json({.seed = settings.seed,
                                       .shard_index = settings.shard_index,
                                       .shard_count = settings.shard_count,
                                       .explicit_kernels = settings.explicit_kernels},
                                      cases);
  if (!complete) report["complete"] = false;  // a run cut short, or a report written while running
  if (!settings.json_path.empty()) io::write_file_atomically(settings.json_path, report.dump(1) + "\n");
  if (!settings.junit_path.empty()) {
    const JudgingScope scope{.explicit_kernels = settings.explicit_kernels,
                             .whole_sweep = settings.whole_sweep() && complete};
    io::write_file_atomically(settings.junit_path, junit_xml(cases, scope));
  }
}

SweepOutcome run_sweep(const GateSettings& settings, const std::vector<GateCase>& cases,
                       const nlohmann::json& budget, const nlohmann::json& baseline,
                       const SweepProgress& progress) {
  SweepOutcome sweep;
  sweep.planned = cases.size();
  write_reports(settings, sweep.cases, false);  // an unwritable report fails before any work
  const auto start = Clock::now();
  auto last_write = start;
  WorkerPool pool(settings, cases);
  pool.start(thread_count(settings));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::optional<CaseOutcome> outcome = pool.take(i);
    if (!outcome || outcome->interrupted) break;
    apply_budget(*outcome, budget);
    apply_baseline(*outcome, baseline);
    sweep.cases.push_back(to_json(*outcome));
    const bool kernel_done = i + 1 == cases.size() || cases[i].kernel != cases[i + 1].kernel;
    if (progress) progress(i + 1, cases.size(), cases[i], kernel_done);
    if (i + 1 < cases.size() && (kernel_done || Clock::now() - last_write >= report_interval)) {
      try {
        write_reports(settings, sweep.cases, false);
      } catch (...) {
        sweep.error = std::current_exception();
        break;
      }
      last_write = Clock::now();
    }
  }
  pool.stop_and_join();
  sweep.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  sweep.interrupt_signal = interrupt_signal();
  if (!sweep.error) sweep.error = pool.error();
  if (sweep.interrupt_signal != 0 && sweep.cases.size() == sweep.planned) sweep.interrupt_signal = 0;
  try {
    write_reports(settings, sweep.cases, sweep.complete());
  } catch (...) {
    if (!sweep.error) sweep.error = std::current_exception();
  }
  return sweep;
}

}  // namespace sharpcheck::gate
