#include "kernels/plugin_child.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "formats/storage.hpp"
#include "kernels/plugin_abi.h"

namespace sharpcheck::kernels {
namespace {

using OperationEntry = int (*)(const sharpcheck_op_call*);
using InfoEntry = const sharpcheck_plugin_description* (*)();

std::size_t storage_bytes(std::uint32_t storage) {
  switch (storage) {
    case SHARPCHECK_STORE_BF16:
    case SHARPCHECK_STORE_FP16:
      return 2;
    case SHARPCHECK_STORE_FP32:
      return 4;
    default:
      return 8;
  }
}

void store(double value, std::uint32_t storage, char* at) {
  switch (storage) {
    case SHARPCHECK_STORE_FP32: {
      const auto narrow = static_cast<float>(value);
      std::memcpy(at, &narrow, sizeof narrow);
      return;
    }
    case SHARPCHECK_STORE_BF16:
    case SHARPCHECK_STORE_FP16: {
      const auto bits =
          static_cast<std::uint16_t>(encode(value, storage == SHARPCHECK_STORE_BF16 ? bf16 : fp16));
      std::memcpy(at, &bits, sizeof bits);
      return;
    }
    case SHARPCHECK_STORE_INT64: {
      const auto integer = std::isfinite(value) ? static_cast<std::int64_t>(value) : std::int64_t{-1};
      std::memcpy(at, &integer, sizeof integer);
      return;
    }
    default:
      std::memcpy(at, &value, sizeof value);
  }
}

double load(const char* at, std::uint32_t storage) {
  switch (storage) {
    case SHARPCHECK_STORE_FP32: {
      float value = 0;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case SHARPCHECK_STORE_BF16:
    case SHARPCHECK_STORE_FP16: {
      std::uint16_t bits = 0;
      std::memcpy(&bits, at, sizeof bits);
      return decode(bits, storage == SHARPCHECK_STORE_BF16 ? bf16 : fp16);
    }
    case SHARPCHECK_STORE_INT64: {
      std::int64_t integer = 0;
      std::memcpy(&integer, at, sizeof integer);
      return static_cast<double>(integer);
    }
    default: {
      double value = 0;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
  }
}

// One tensor's bytes in its storage and the ABI's view of it.
struct StoredTensor {
  std::vector<char> bytes;
  sharpcheck_tensor view{};
};

StoredTensor stored(const PluginTensor& tensor, bool output) {
  StoredTensor t;
  const std::size_t count = element_count(tensor), size = storage_bytes(tensor.storage);
  t.bytes = output ? guarded<char>(count * size) : std::vector<char>(count * size);
  for (std::size_t i = 0; i < count; ++i)
    store(output ? std::numeric_limits<double>::quiet_NaN() : tensor.values[i], tensor.storage,
          t.bytes.data() + i * size);
  t.view = {tensor.name.c_str(), tensor.storage, tensor.shape.size(), tensor.shape.data(), t.bytes.data()};
  return t;
}

}  // namespace

std::size_t element_count(const PluginTensor& tensor) {
  std::size_t count = 1;
  for (const std::size_t extent : tensor.shape) count *= extent;
  return count;
}

std::pair<std::string, int> call_operation(void* symbol, const std::string& operation,
                                           std::uint32_t format_code, const std::string& options,
                                           const std::vector<PluginTensor>& inputs,
                                           const std::vector<PluginTensor>& outputs) {
  std::vector<StoredTensor> in, out;
  std::vector<sharpcheck_tensor> in_views, out_views;
  for (const PluginTensor& tensor : inputs) in_views.push_back(in.emplace_back(stored(tensor, false)).view);
  for (const PluginTensor& tensor : outputs) out_views.push_back(out.emplace_back(stored(tensor, true)).view);
  const sharpcheck_op_call call{operation.c_str(), format_code,      options.c_str(), in_views.size(),
                                in_views.data(),   out_views.size(), out_views.data()};
  const int code = reinterpret_cast<OperationEntry>(symbol)(&call);
  for (std::size_t o = 0; o < outputs.size(); ++o) {  // an overrun counts before a returned error
    if (!intact(out[o].bytes, element_count(outputs[o]) * storage_bytes(outputs[o].storage)))
      return {outputs[o].name, overrun_status};
  }
  if (code != 0) return {"", 10 + (code & 0x7F)};
  std::vector<double> result;
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const std::size_t size = storage_bytes(outputs[o].storage);
    for (std::size_t i = 0; i < element_count(outputs[o]); ++i)
      result.push_back(load(out[o].bytes.data() + i * size, outputs[o].storage));
  }
  return {std::string(reinterpret_cast<const char*>(result.data()), result.size() * sizeof(double)), 0};
}

std::pair<std::string, int> describe_in_child(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return {"error\ncannot be loaded: " + std::string(dlerror()), 0};
  auto info_entry = reinterpret_cast<InfoEntry>(dlsym(handle, "sharpcheck_plugin_info"));
  if (info_entry == nullptr) return {"error\ndoes not export sharpcheck_plugin_info", 0};
  const sharpcheck_plugin_description* info = info_entry();
  if (info == nullptr || info->abi_version < 1 || info->abi_version > SHARPCHECK_PLUGIN_ABI_VERSION) {
    return {"error\nspeaks ABI version " + (info ? std::to_string(info->abi_version) : std::string("?")) +
                ", this sharpcheck speaks 1 to " + std::to_string(SHARPCHECK_PLUGIN_ABI_VERSION),
            0};
  }
  // A v1 struct has no field; a v2 plugin knows only the first three bits.
  // A v3 plugin knows the bits below SHARPCHECK_ATTENTION_BACKWARD.
  const std::uint32_t known = info->abi_version >= 5   ? (SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK << 1) - 1U
                              : info->abi_version == 4 ? SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK - 1U
                              : info->abi_version == 3 ? SHARPCHECK_ATTENTION_BACKWARD - 1U
                              : info->abi_version == 2 ? 7U
                                                       : 0U;
  // A bit its version does not define is refused, not masked: the plugin was built against a later
  // header (the backward declared at version 3 would otherwise never run, and no word of it).
  if (info->abi_version >= 2 && (info->features & ~known) != 0) {
    char bits[16];
    std::snprintf(bits, sizeof bits, "0x%x", info->features & ~known);
    return {"error\ndeclares feature bits " + std::string(bits) + " that ABI version " +
                std::to_string(info->abi_version) + " does not have; set abi_version to the version that " +
                "defines them (kernels/plugin_abi.h)",
            0};
  }
  const std::uint32_t features = info->abi_version >= 2 ? info->features : 0U;
  if ((features & ~7U & ~SHARPCHECK_ATTENTION_BACKWARD & ~SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK) != 0 &&
      dlsym(handle, "sharpcheck_attention_layer") == nullptr) {
    return {"error\ndeclares version-3 attention features but does not export sharpcheck_attention_layer", 0};
  }
  if ((features & SHARPCHECK_ATTENTION_BACKWARD) != 0 &&
      dlsym(handle, "sharpcheck_attention_backward") == nullptr) {
    return {"error\ndeclares the attention backward but does not export sharpcheck_attention_backward", 0};
  }
  if ((features & SHARPCHECK_ATTENTION_BACKWARD_LSE_SINK) != 0 &&
      dlsym(handle, "sharpcheck_attention_backward_lse") == nullptr) {
    return {
        "error\ndeclares the backward through the log-sum-exp and sinks but does not export "
        "sharpcheck_attention_backward_lse",
        0};
  }
  if (info->attention_formats != 0 && dlsym(handle, "sharpcheck_attention") == nullptr) {
    return {"error\ndeclares attention formats but does not export sharpcheck_attention", 0};
  }
  if (info->softmax_formats != 0 && dlsym(handle, "sharpcheck_softmax") == nullptr) {
    return {"error\ndeclares softmax formats but does not export sharpcheck_softmax", 0};
  }
  const char* operations = info->abi_version >= 6 && info->operations != nullptr ? info->operations : "";
  const std::uint32_t operation_formats = info->abi_version >= 6 ? info->operation_formats : 0U;
  if (*operations != '\0' && dlsym(handle, "sharpcheck_op") == nullptr)
    return {"error\ndeclares operations but does not export sharpcheck_op", 0};
  if (*operations != '\0' && operation_formats == 0)
    return {"error\ndeclares operations but no operation_formats to compute them in", 0};
  const auto one_line = [](const char* text, const char* fallback) {
    std::string line = text != nullptr ? text : fallback;
    for (char& c : line) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return line;
  };
  return {"ok\n" + one_line(info->name, "unnamed") + "\n" + one_line(info->description, "") + "\n" +
              std::to_string(info->softmax_formats) + "\n" + std::to_string(info->attention_formats) + "\n" +
              std::to_string(features) + "\n" + one_line(operations, "") + "\n" +
              std::to_string(operation_formats) + "\n",
          0};
}

}  // namespace sharpcheck::kernels
