// What runs in a plugin's child process besides the entries of ABI versions 1 to 5: describing the
// plugin for Plugin::open, and calling version 6's sharpcheck_op with PluginTensors stored in the
// storages they name, outputs read back exactly (for Plugin::run_operation). kernels/plugin.cpp
// forks the child and reads what these return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/plugin.hpp"

namespace sharpcheck::kernels {

// A child's exit status for a plugin that wrote past the end of an output buffer; its output is the
// buffer's name.
inline constexpr int overrun_status = 8;

// Output buffers handed to a plugin carry a tail of canary bytes after their `count` elements: a
// small buffer's overrun reaches no unmapped page (a large one's would crash), so a write past its
// end is seen only by intact() after the call.
inline constexpr std::size_t canary_bytes = 256;
inline constexpr unsigned char canary_byte = 0xA5;

template <typename T>
std::vector<T> guarded(std::size_t count, T fill = T{}) {
  std::vector<T> buffer(count + (canary_bytes + sizeof(T) - 1) / sizeof(T), fill);
  std::memset(static_cast<void*>(buffer.data() + count), canary_byte, (buffer.size() - count) * sizeof(T));
  return buffer;
}

template <typename T>
bool intact(const std::vector<T>& buffer, std::size_t count) {
  const auto* tail = reinterpret_cast<const unsigned char*>(buffer.data() + count);
  const std::size_t bytes = (buffer.size() - count) * sizeof(T);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (tail[i] != canary_byte) return false;
  }
  return true;
}

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
