// The gate's cases for a Python kernel (sharpcheck.cases and sharpcheck.sweep): an operation's
// external cases as dictionaries of NumPy arrays and JSON options, and the judgement of a
// batch-invariance case from the kernel's outputs of every call (gate/invariance.hpp), so the
// comparison by request and the verdict are the gate's, not a second implementation in Python.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sharpcheck::python {

// Each case: {"id", "tensors": {name: array}, "stored_as": {name: format}, "options": JSON text,
// "judge_options": JSON text, "needs": [...], "reruns": [the same keys, per rerun]}.
[[nodiscard]] pybind11::list external_cases(const std::string& name, const std::string& format,
                                            const std::vector<std::size_t>& sizes, std::uint64_t seed);

// The case record (JSON text) of the invariance case `id` of that sweep, from `calls`: the
// kernel's outputs ({name: array}, in `output_format`) of the first call and then of every rerun.
[[nodiscard]] std::string judge_invariance_case(const std::string& name, const std::string& format,
                                                const std::string& output_format,
                                                const std::vector<std::size_t>& sizes, std::uint64_t seed,
                                                const std::string& id, const pybind11::list& calls);

}  // namespace sharpcheck::python
