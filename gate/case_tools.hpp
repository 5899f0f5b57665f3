// What every operation's gate cases are made with (ops/*/): a case's record, and a plugin call
// that returned no output recorded as a crash with its inputs saved as reproducers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/matrix.hpp"
#include "gate/cases.hpp"

namespace sharpcheck::gate {

// A case of `kernel` on `input` at size n (a plugin's case when plugin_format is set); the
// operation's name is stamped on it by the planner.
[[nodiscard]] GateCase make_case(std::string kernel, std::string input, std::size_t n,
                                 const GateSettings& settings, bool broken, const FloatFormat* plugin_format);

// A case's own seed: the sweep's base seed mixed with the case id (FNV-1a), so that a case's
// inputs do not depend on which other cases the sweep holds.
[[nodiscard]] std::uint64_t case_seed(std::uint64_t base_seed, const std::string& id);

// Records a plugin call that did not return an output (crash, hang, error; an interrupt marks the
// case interrupted), saving each input as `<case id><suffix>.npy` under the reproducer directory.
// A reproducer that cannot be written does not hide the crash: the reason joins the failure.
void record_plugin_failure(const kernels::PluginRun& run, const GateSettings& settings,
                           const GateCase& gate_case,
                           const std::vector<std::pair<std::string, const Matrix*>>& inputs,
                           CaseOutcome& outcome);

// A case run by the gate but judged as arrays handed over are (a paged kernel's output, a
// plugin's version-6 outputs): the judgement's verdict, figures and worst element, into `outcome`
// (whose case, console and timing stay the gate's).
void adopt_judgement(CaseOutcome judged, CaseOutcome& outcome);

}  // namespace sharpcheck::gate
