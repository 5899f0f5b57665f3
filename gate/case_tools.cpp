// A case's record and a plugin failure's record with its reproducers.
#include "gate/case_tools.hpp"

#include <algorithm>
#include <exception>

#include "io/atomic_file.hpp"
#include "io/npy.hpp"
#include "kernels/plugin.hpp"

namespace sharpcheck::gate {
namespace {

std::string file_name_of(const std::string& id) {
  std::string name = id;
  for (char& c : name) {
    if (c == '/' || c == ':' || c == '=') c = '_';
  }
  return name;
}

// Saves a crashed case's input, as the plugin saw it (bf16 as bit patterns). A reproducer that
// cannot be written must not hide the crash: the reason is returned in place of the path.
std::string save_reproducer(const GateSettings& settings, const std::string& name, const Matrix& input,
                            const FloatFormat& format, bool& saved) {
  std::vector<double> stored = input.values;
  io::NpyType type = io::NpyType::float32;
  if (format == bf16) {
    type = io::NpyType::uint16;
    for (double& x : stored) x = static_cast<double>(encode(x, bf16));
  } else if (format == fp16) {
    type = io::NpyType::float16;
  }
  std::string path = settings.reproducer_directory + "/" + name + ".npy";
  try {
    io::make_writable_directory(settings.reproducer_directory);
    io::write_npy(path, type, {input.rows, input.cols}, stored);
    saved = true;
    return path;
  } catch (const std::exception& error) {
    saved = false;
    return std::string("(no reproducer: ") + error.what() + ")";
  }
}

}  // namespace

std::uint64_t case_seed(std::uint64_t base_seed, const std::string& id) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const char c : id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return base_seed ^ hash;
}

GateCase make_case(std::string kernel, std::string input, std::size_t n, const GateSettings& settings,
                   bool broken, const FloatFormat* plugin_format) {
  return {.operation = {},
          .kernel = std::move(kernel),
          .input = std::move(input),
          .n = n,
          .base_seed = settings.seed,
          .deliberately_broken = broken,
          .plugin_format = plugin_format,
          .plugin_path = plugin_format != nullptr ? settings.plugin->path() : std::string()};
}

void record_plugin_failure(const kernels::PluginRun& run, const GateSettings& settings,
                           const GateCase& gate_case,
                           const std::vector<std::pair<std::string, const Matrix*>>& inputs,
                           CaseOutcome& outcome) {
  if (run.status == kernels::PluginRun::Status::interrupted) {
    outcome.interrupted = true;
    return;
  }
  const FloatFormat& format = *gate_case.plugin_format;
  const std::string base_name = file_name_of(gate_case.id());
  outcome.crashed = true;
  outcome.console = run.console;
  std::string saved_note;
  for (const auto& [suffix, matrix] : inputs) {
    bool saved = false;
    const std::string where = save_reproducer(settings, base_name + suffix, *matrix, format, saved);
    if (outcome.reproducer.empty() && saved) outcome.reproducer = where;
    if (!saved && saved_note.empty()) saved_note = where;
  }
  std::string failure = std::string("plugin ") + kernels::plugin_status_name(run.status) + ": " + run.detail;
  if (!outcome.reproducer.empty()) {
    failure += inputs.size() > 1 ? "; inputs saved to " + outcome.reproducer + " and its _k, _v siblings"
                                 : "; input saved to " + outcome.reproducer;
  }
  if (!saved_note.empty()) failure += "; " + saved_note;
  outcome.failures.push_back(failure);
}

void adopt_judgement(CaseOutcome judged, CaseOutcome& outcome) {
  outcome.format = std::move(judged.format);
  outcome.comparison = std::move(judged.comparison);
  outcome.reference_statistics = judged.reference_statistics;
  outcome.failures = std::move(judged.failures);
  outcome.worst_array = std::move(judged.worst_array);
  outcome.worst_index = std::move(judged.worst_index);
  outcome.recipe = std::move(judged.recipe);
  outcome.recipe_note = std::move(judged.recipe_note);
  outcome.tensors = std::move(judged.tensors);
  for (std::string& note : judged.notes) {
    if (std::find(outcome.notes.begin(), outcome.notes.end(), note) == outcome.notes.end())
      outcome.notes.push_back(std::move(note));
  }
}

}  // namespace sharpcheck::gate
