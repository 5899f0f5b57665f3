// Every softmax kernel on its native storage at n = 1,024, 16,384 and 262,144 (one row) and
// 1,024 rows of 1,024, against a copy of the same bytes and, when built with oneDNN, oneDNN's
// softmax (softmax_v2_forward, softmax_accurate) in f32 and bf16 in the same run.
// Run with OMP_NUM_THREADS=1 for one-thread figures (oneDNN threads with OpenMP).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/random.hpp"
#include "formats/storage.hpp"
#include "kernels/attention_kernels.hpp"
#include "kernels/quantized_softmax.hpp"
#include "kernels/softmax_kernels.hpp"

#ifdef SHARPCHECK_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

using sharpcheck::Bfloat16;
using sharpcheck::Float16;

template <typename Storage>
std::vector<Storage> normal_logits(std::size_t count) {
  sharpcheck::DeterministicRandom random(1);
  std::vector<Storage> logits(count);
  for (auto& x : logits) {
    if constexpr (std::is_same_v<Storage, float>) {
      x = static_cast<float>(random.normal(0, 3));
    } else if constexpr (std::is_same_v<Storage, std::int8_t>) {
      x = static_cast<std::int8_t>(std::clamp(std::lround(random.normal(0, 3) * 16), -127L, 127L));
    } else {
      x = Storage::from_float(static_cast<float>(random.normal(0, 3)));
    }
  }
  return logits;
}

// Shapes: (rows, n). Counters: bytes read and written per second, and ns per element.
void report(benchmark::State& state, std::size_t elements, std::size_t bytes_per_element) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2 * bytes_per_element));
  state.counters["ns_per_element"] =
      benchmark::Counter(static_cast<double>(elements),
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

template <typename Storage, void (*Kernel)(const Storage*, Storage*, std::size_t, float)>
void softmax_kernel(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto n = static_cast<std::size_t>(state.range(1));
  const auto logits = normal_logits<Storage>(rows * n);
  std::vector<Storage> out(rows * n);
  for (auto _ : state) {
    for (std::size_t r = 0; r < rows; ++r) Kernel(logits.data() + r * n, out.data() + r * n, n, 1.0F);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report(state, rows * n, sizeof(Storage));
}

template <typename Storage>
void copy_of_the_same_bytes(benchmark::State& state) {
  const auto elements = static_cast<std::size_t>(state.range(0) * state.range(1));
  const auto logits = normal_logits<Storage>(elements);
  std::vector<Storage> out(elements);
  for (auto _ : state) {
    std::memcpy(out.data(), logits.data(), elements * sizeof(Storage));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report(state, elements, sizeof(Storage));
}

void blocked(const float* logits, float* out, std::size_t n, float scale) {
  sharpcheck::kernels::softmax_blocked_fp32(logits, out, n, scale);
}

void shapes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Args({1, 1024})->Args({1, 16384})->Args({1, 262144})->Args({1024, 1024});
  benchmark->ArgNames({"rows", "n"});
}

namespace k = sharpcheck::kernels;
BENCHMARK(copy_of_the_same_bytes<float>)->Apply(shapes);
BENCHMARK(softmax_kernel<float, k::softmax_naive_fp32>)->Name("naive_fp32")->Apply(shapes);
BENCHMARK(softmax_kernel<float, k::softmax_safe3_fp32>)->Name("safe3_fp32")->Apply(shapes);
BENCHMARK(softmax_kernel<float, k::softmax_online2_fp32>)->Name("online2_fp32")->Apply(shapes);
BENCHMARK(softmax_kernel<float, blocked>)->Name("blocked_fp32")->Apply(shapes);
BENCHMARK(softmax_kernel<float, k::softmax_adaptive_fp32>)->Name("adaptive_fp32")->Apply(shapes);
BENCHMARK(softmax_kernel<float, k::softmax_adaptive_streaming_fp32>)
    ->Name("adaptive_streaming_fp32")
    ->Apply(shapes);
BENCHMARK(copy_of_the_same_bytes<Bfloat16>)->Apply(shapes);
BENCHMARK(softmax_kernel<Bfloat16, k::softmax_safe3_bf16>)->Name("safe3_bf16")->Apply(shapes);
BENCHMARK(softmax_kernel<Bfloat16, k::softmax_online2_bf16>)->Name("online2_bf16")->Apply(shapes);
BENCHMARK(softmax_kernel<Bfloat16, k::softmax_bf16_accumulator>)->Name("bf16acc")->Apply(shapes);
BENCHMARK(softmax_kernel<Float16, k::softmax_safe3_fp16>)->Name("safe3_fp16")->Apply(shapes);
BENCHMARK(softmax_kernel<Float16, k::softmax_online2_fp16>)->Name("online2_fp16")->Apply(shapes);
BENCHMARK(softmax_kernel<std::int8_t, k::softmax_int8>)->Name("int8_lut")->Apply(shapes);

#ifdef SHARPCHECK_HAVE_DNNL
void onednn_softmax(benchmark::State& state, dnnl::memory::data_type type, std::size_t bytes_per_element) {
  const auto rows = static_cast<dnnl::memory::dim>(state.range(0));
  const auto n = static_cast<dnnl::memory::dim>(state.range(1));
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc layout({rows, n}, type, dnnl::memory::format_tag::ab);
  const dnnl::softmax_v2_forward::desc description(dnnl::prop_kind::forward_inference,
                                                   dnnl::algorithm::softmax_accurate, layout, layout, 1);
  const dnnl::softmax_v2_forward primitive(dnnl::softmax_v2_forward::primitive_desc(description, engine));
  dnnl::memory source(layout, engine);
  dnnl::memory destination(layout, engine);
  const auto elements = static_cast<std::size_t>(rows * n);
  if (type == dnnl::memory::data_type::f32) {
    const auto logits = normal_logits<float>(elements);
    std::memcpy(source.get_data_handle(), logits.data(), elements * sizeof(float));
  } else {
    const auto logits = normal_logits<Bfloat16>(elements);
    std::memcpy(source.get_data_handle(), logits.data(), elements * sizeof(Bfloat16));
  }
  for (auto _ : state) {
    primitive.execute(stream, {{DNNL_ARG_SRC, source}, {DNNL_ARG_DST, destination}});
    stream.wait();
  }
  report(state, elements, bytes_per_element);
}
void onednn_f32(benchmark::State& state) { onednn_softmax(state, dnnl::memory::data_type::f32, 4); }
void onednn_bf16(benchmark::State& state) { onednn_softmax(state, dnnl::memory::data_type::bf16, 2); }
BENCHMARK(onednn_f32)->Apply(shapes);
BENCHMARK(onednn_bf16)->Apply(shapes);
#endif

void attention(benchmark::State& state, bool flash) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const sharpcheck::kernels::AttentionShape shape{1, n, 128, 128};
  const auto q = normal_logits<float>(128);
  const auto keys = normal_logits<float>(n * 128);
  const auto values = normal_logits<float>(n * 128);
  std::vector<float> out(128);
  sharpcheck::tensor::HeadScores scores;
  scores.scale = 0.0884;
  scores.queries = 1;
  scores.keys = n;
  scores.row_stride = n;
  for (auto _ : state) {
    if (flash) {
      sharpcheck::kernels::attention_flash_fp32(q.data(), keys.data(), values.data(), out.data(), nullptr,
                                                shape, scores);
    } else {
      sharpcheck::kernels::attention_naive_fp32(q.data(), keys.data(), values.data(), out.data(), nullptr,
                                                shape, scores);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK_CAPTURE(attention, naive_fp32, false)->Arg(16384);
BENCHMARK_CAPTURE(attention, flash_fp32, true)->Arg(16384);

}  // namespace

BENCHMARK_MAIN();
