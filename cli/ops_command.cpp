// sharpcheck ops: every operation with its tensors, options, allowance, kernels and where it can be
// judged, read from the registry (ops/registry.hpp); --json prints what Python's sharpcheck.ops()
// returns.
#include <cstdio>

#include "cli/commands.hpp"
#include "gate/operation.hpp"
#include "ops/registry.hpp"

namespace sharpcheck::cli {
namespace {

void print_operation(const gate::Operation& operation) {
  const nlohmann::json described = gate::describe_operation(operation);
  std::printf("%s: %s\n", std::string(operation.name).c_str(), std::string(operation.summary).c_str());
  std::printf("  tensors:\n");
  for (const gate::TensorSpec& t : operation.tensors) {
    std::printf("    %-13s %-16s %-34s %s\n", std::string(t.name).c_str(),
                std::string(gate::tensor_role_name(t.role)).c_str(), std::string(t.shape).c_str(),
                std::string(t.meaning).c_str());
  }
  std::printf("  options:");
  for (const auto& option : described["options"])
    std::printf(" %s", option["name"].get<std::string>().c_str());
  std::printf("\n  allowance: %s\n", std::string(operation.allowance).c_str());
  std::printf("  kernels:");
  std::size_t kernels = 0;
  for (const gate::KernelRow& k : operation.kernels()) {
    std::printf(" %s%s", std::string(k.name).c_str(), k.deliberately_broken ? " (broken)" : "");
    ++kernels;
  }
  if (kernels == 0) std::printf(" none built in");
  std::printf("\n  plugin entry: %s\n",
              operation.plugin_entry.empty() ? "none" : std::string(operation.plugin_entry).c_str());
  std::string from;
  for (const auto& place : described["judged_from"])
    from += (from.empty() ? "" : ", ") + place.get<std::string>();
  std::printf("  judged from: %s\n\n", from.c_str());
}

}  // namespace

Command add_ops_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* command = app.add_subcommand(
      "ops",
      "List every operation: its tensors, options, allowance, built-in kernels and where it is judged");
  command->add_flag("--json", *json, "Print the list as JSON (what Python's sharpcheck.ops() returns)");
  return [command, json]() -> int {
    if (!*command) return -1;
    if (*json) {
      nlohmann::json list = nlohmann::json::array();
      for (const gate::Operation* operation : ops::all_operations())
        list.push_back(gate::describe_operation(*operation));
      std::printf("%s\n", list.dump(1).c_str());
      return exit_pass;
    }
    for (const gate::Operation* operation : ops::all_operations()) print_operation(*operation);
    std::printf("judge one from files: sharpcheck compare --op NAME TENSOR=FILE.npy ... OPTION=VALUE ...\n");
    return exit_pass;
  };
}

}  // namespace sharpcheck::cli
