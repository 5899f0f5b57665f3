// Test plugins for the gate: a sound softmax, and the same that segfaults or hangs on rows of 64
// or more, or returns an error; and the hostile ones of the reliability suite (tests/reliability.sh):
// code that crashes, hangs or aborts while being loaded, forks children that outlive it, declares
// nothing, has a name that is not UTF-8, allocates without bound, prints, or declares a feature
// (causal, softmax scale) it then ignores. Which one is chosen
// at compile time (SHARPCHECK_TEST_PLUGIN_MODE).
#include <sys/prctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, 4);
  if ((word & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<std::uint16_t>((word >> 16) | 0x40U);
  return static_cast<std::uint16_t>((word + 0x7FFFU + ((word >> 16) & 1U)) >> 16);
}

void softmax_row(const float* in, float* out, std::size_t n, float scale) {
  float largest = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) largest = std::fmax(largest, in[i]);
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += out[i] = std::exp((in[i] - largest) * scale);
  for (std::size_t i = 0; i < n; ++i) out[i] /= sum;
}

#if SHARPCHECK_TEST_PLUGIN_MODE == 8
constexpr std::uint32_t softmax_formats = 0, attention_formats = 0;  // declares nothing
#else
constexpr std::uint32_t softmax_formats = SHARPCHECK_FP32 | SHARPCHECK_BF16,
                        attention_formats = SHARPCHECK_FP32;
#endif
#if SHARPCHECK_TEST_PLUGIN_MODE == 9
constexpr const char* plugin_name = "bad\xff\xfe_name";  // not valid UTF-8
#else
constexpr const char* plugin_name = SHARPCHECK_TEST_PLUGIN_NAME;
#endif
#if SHARPCHECK_TEST_PLUGIN_MODE == 15
// Speaks ABI version 3 but declares version 4's backward: refused, not silently masked.
constexpr std::uint32_t abi_version = 3, extra_features = SHARPCHECK_ATTENTION_BACKWARD;
#else
constexpr std::uint32_t abi_version = SHARPCHECK_PLUGIN_ABI_VERSION, extra_features = 0;
#endif
const sharpcheck_plugin_description info{
    abi_version,
    plugin_name,
    "a scalar three-pass softmax for the gate's own tests",
    softmax_formats,
    attention_formats,
    SHARPCHECK_SOFTMAX_SCALE | SHARPCHECK_ATTENTION_SCALE | SHARPCHECK_ATTENTION_CAUSAL | extra_features,
    nullptr,
    0};

// Spins forever under a process name a test can look for (it must not outlive the gate).
[[noreturn]] void spin_as(const char* name) {
  prctl(PR_SET_NAME, name, 0, 0, 0);
  for (volatile bool forever = true; forever;) {
  }
  std::abort();
}

#if SHARPCHECK_TEST_PLUGIN_MODE == 6
__attribute__((constructor)) void abort_when_loaded() { std::abort(); }
#endif

// Mode 7: children that sleep holding the parent's pipes (as a careless plugin's workers would),
// and one that leaves the process group as a daemon does (setsid, then a second fork whose parent
// exits at once), which killing the group cannot reach.
void fork_sleepers() {
  for (int i = 0; i < 4; ++i) {
    if (fork() == 0) {
      prctl(PR_SET_NAME, "sc_grandchild", 0, 0, 0);
      sleep(60);
      _exit(0);
    }
  }
  if (fork() == 0) {
    setsid();
    if (fork() == 0) {
      prctl(PR_SET_NAME, "sc_detached", 0, 0, 0);
      sleep(60);
      _exit(0);
    }
    _exit(0);
  }
}

}  // namespace

extern "C" const sharpcheck_plugin_description* sharpcheck_plugin_info() {
#if SHARPCHECK_TEST_PLUGIN_MODE == 4
  volatile int* nowhere = nullptr;
  *nowhere = 1;  // a segmentation fault while being described
#elif SHARPCHECK_TEST_PLUGIN_MODE == 5
  spin_as("sc_info_hang");
#endif
  return &info;
}

extern "C" int sharpcheck_softmax(uint32_t format, const void* logits, void* out, size_t rows, size_t n,
                                  float scale) {
#if SHARPCHECK_TEST_PLUGIN_MODE == 14
  scale = 1.0F;  // declares SHARPCHECK_SOFTMAX_SCALE, ignores it
#endif
#if SHARPCHECK_TEST_PLUGIN_MODE == 7
  fork_sleepers();
#elif SHARPCHECK_TEST_PLUGIN_MODE == 10
  std::vector<char*> hoard;  // allocates (and touches) until the memory limit stops it
  while (true) {
    hoard.push_back(new char[64 << 20]);
    for (std::size_t i = 0; i < (64u << 20); i += 4096) hoard.back()[i] = 1;
  }
#elif SHARPCHECK_TEST_PLUGIN_MODE == 11
  std::printf("chatty plugin: %zu rows of %zu\n", rows, n);
  std::fprintf(stderr, "chatty plugin: a warning on stderr\n");
#endif
  if (n >= 64) {
#if SHARPCHECK_TEST_PLUGIN_MODE == 1
    volatile int* nowhere = nullptr;
    *nowhere = 1;  // a segmentation fault
#elif SHARPCHECK_TEST_PLUGIN_MODE == 2
    for (volatile bool forever = true; forever;) {
    }
#elif SHARPCHECK_TEST_PLUGIN_MODE == 3
    return 7;
#elif SHARPCHECK_TEST_PLUGIN_MODE == 12
    spin_as("sc_sigterm_spin");
#endif
  }
  for (size_t r = 0; r < rows; ++r) {
    if (format == SHARPCHECK_FP32) {
      softmax_row(static_cast<const float*>(logits) + r * n, static_cast<float*>(out) + r * n, n, scale);
    } else if (format == SHARPCHECK_BF16) {
      const auto* in = static_cast<const std::uint16_t*>(logits) + r * n;
      auto* result = static_cast<std::uint16_t*>(out) + r * n;
      float wide_in[16384], wide_out[16384];
      if (n > 16384) return 2;
      for (size_t i = 0; i < n; ++i) wide_in[i] = bf16_to_float(in[i]);
      softmax_row(wide_in, wide_out, n, scale);
      for (size_t i = 0; i < n; ++i) result[i] = float_to_bf16(wide_out[i]);
    } else {
      return 1;
    }
  }
  return 0;
}

// Attention in fp32: scores, the same softmax, and the weighted sum (one query at a time).
extern "C" int sharpcheck_attention(uint32_t format, const void* q, const void* k, const void* v, void* out,
                                    size_t queries, size_t keys, size_t dim, size_t value_dim, float scale,
                                    int causal) {
#if SHARPCHECK_TEST_PLUGIN_MODE == 13
  causal = 0;  // declares SHARPCHECK_ATTENTION_CAUSAL, ignores it
#endif
  if (format != SHARPCHECK_FP32 || keys > 16384) return 1;
#if SHARPCHECK_TEST_PLUGIN_MODE == 1
  if (keys >= 64) {
    volatile int* nowhere = nullptr;
    *nowhere = 1;
  }
#endif
  const auto* qf = static_cast<const float*>(q);
  const auto* kf = static_cast<const float*>(k);
  const auto* vf = static_cast<const float*>(v);
  auto* of = static_cast<float*>(out);
  static float scores[16384], weights[16384];
  for (size_t i = 0; i < queries; ++i) {
    const size_t visible = causal != 0 ? (i + 1 < keys ? i + 1 : keys) : keys;
    for (size_t j = 0; j < visible; ++j) {
      float dot = 0;
      for (size_t t = 0; t < dim; ++t) dot += qf[i * dim + t] * kf[j * dim + t];
      scores[j] = dot;
    }
    softmax_row(scores, weights, visible, scale);
    for (size_t c = 0; c < value_dim; ++c) {
      float sum = 0;
      for (size_t j = 0; j < visible; ++j) sum += weights[j] * vf[j * value_dim + c];
      of[i * value_dim + c] = sum;
    }
  }
  return 0;
}
