// What runs in a plugin's child process besides the entries of ABI versions 1 to 5: describing the
// plugin for Plugin::open, and calling version 6's sharpcheck_op with PluginTensors stored in the
// storages they name, outputs read back exactly (for Plugin::run_operation). kernels/plugin.cpp
// forks the child and reads what these return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/plugin.hpp"

namespace sharpcheck::kernels {

// The number of elements of `tensor`: the product of its shape (1 for a scalar).
std::size_t element_count(const PluginTensor& tensor);

// Runs in the child: loads the plugin at `path` and checks its description against the ABI version it
// declares. Returns "ok" and the description as lines (name, description, softmax formats, attention
// formats, features, operations, operation formats), or "error" and a message, with status 0.
std::pair<std::string, int> describe_in_child(const std::string& path);

// Runs in the child: stores `inputs` in their storages, gives every output NaN-filled storage,
// calls the `sharpcheck_op` entry at `symbol`, and returns the outputs' values in order as the bytes
// of doubles with status 0; a non-zero return of the plugin becomes status 10 + (code & 0x7F).
std::pair<std::string, int> call_operation(void* symbol, const std::string& operation,
                                           std::uint32_t format_code, const std::string& options,
                                           const std::vector<PluginTensor>& inputs,
                                           const std::vector<PluginTensor>& outputs);

}  // namespace sharpcheck::kernels
