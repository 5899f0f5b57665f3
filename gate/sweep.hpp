// Running a planned sweep: cases on a pool of worker threads, results taken in sweep order (so
// reports and verdicts do not depend on the thread count), budgets and baselines applied, and the
// reports rewritten as cases finish. Nothing computed is lost: on an error in a case, a report
// that cannot be written, or SIGINT/SIGTERM, the workers stop taking cases, are joined, and the
// outcome holds every case finished so far (written to the reports where they can be written).
#pragma once

#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gate/cases.hpp"

namespace sharpcheck::gate {

struct SweepOutcome {
  std::vector<nlohmann::json> cases;  // records (gate/report.hpp) of the finished cases, in sweep order
  std::size_t planned = 0;
  double seconds = 0;
  int interrupt_signal = 0;  // SIGINT/SIGTERM stopped the sweep
  std::exception_ptr error;  // a case or a report write failed: the sweep stopped there
  [[nodiscard]] bool complete() const { return cases.size() == planned && interrupt_signal == 0 && !error; }
};

// Called in sweep order after each case is taken (done, planned, that case, whether it is the last
// case of a run of its kernel's cases).
using SweepProgress = std::function<void(std::size_t, std::size_t, const GateCase&, bool)>;

// Runs `cases` under `settings` (reports to settings.json_path / junit_path; budget and baseline
// already read). The reports are written once before the first case, so an unwritable path fails
// at once (IoError, nothing run), then at least every second and at the end.
[[nodiscard]] SweepOutcome run_sweep(const GateSettings& settings, const std::vector<GateCase>& cases,
                                     const nlohmann::json& budget, const nlohmann::json& baseline,
                                     const SweepProgress& progress);

// Writes the sweep's JSON and JUnit reports (whichever paths are set) from its case records.
void write_reports(const GateSettings& settings, const std::vector<nlohmann::json>& cases, bool complete);

}  // namespace sharpcheck::gate
