// Judging a whole attention layer (metrics::judge_attention_tensors: the correctly rounded
// reference, the tolerance geometry and the comparison, output and log-sum-exp) against a plain
// double attention of the same shape (dot products, exp, sum, weighted sum; no guarantee) in the
// same run, both on every core. Shapes: bf16 [1, H, S, 128] causal; the target is
// [1, 32, 4096, 128] (run it with --benchmark_filter=32/4096).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "core/random.hpp"
#include "kernels/attention_layer.hpp"
#include "kernels/registry.hpp"
#include "metrics/judge_tensors.hpp"

namespace {

using sharpcheck::tensor::AttentionProblem;

struct Layer {
  AttentionProblem problem;
  std::vector<double> q, k, v, out, lse;
};

Layer make_layer(std::size_t heads, std::size_t seq) {
  Layer layer;
  layer.problem.shape = {1, heads, heads, seq, seq, 128, 128};
  layer.problem.scores.causal = true;
  sharpcheck::DeterministicRandom random(7);
  for (auto [data, count] : {std::pair{&layer.q, layer.problem.query_elements()},
                             std::pair{&layer.k, layer.problem.key_elements()},
                             std::pair{&layer.v, layer.problem.value_elements()}}) {
    data->resize(count);
    for (double& x : *data) x = sharpcheck::round_to_format(random.normal(0, 1), sharpcheck::bf16);
  }
  auto outputs = sharpcheck::kernels::run_attention_layer(
      *sharpcheck::kernels::find_attention_kernel("attention_flash_bf16"), layer.problem, layer.q, layer.k,
      layer.v);
  layer.out = std::move(outputs.out);
  layer.lse = std::move(outputs.lse);
  return layer;
}

// Plain double attention of every row, rows in parallel: the yardstick. Contiguous bhsd with
// pointer arithmetic, so the ratio is against a fair, fast loop.
void plain_double_attention(const Layer& layer, std::vector<double>& out) {
  const auto& p = layer.problem;
  const std::size_t seq = p.shape.queries, d = p.shape.head_dim;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  sharpcheck::parallel_for(p.shape.heads * seq, 0, [&](std::size_t item) {
    const std::size_t h = item / seq, i = item % seq;
    const double* q = layer.q.data() + (h * seq + i) * d;
    const double* k = layer.k.data() + h * seq * d;
    const double* v = layer.v.data() + h * seq * d;
    std::vector<double> w(i + 1), acc(d, 0.0);
    double largest = -INFINITY;
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < d; ++t) dot += q[t] * k[j * d + t];
      w[j] = dot * scale;
      largest = std::max(largest, w[j]);
    }
    double sum = 0;
    for (std::size_t j = 0; j <= i; ++j) {
      const double e = std::exp(w[j] - largest);
      sum += e;
      for (std::size_t c = 0; c < d; ++c) acc[c] += e * v[j * d + c];
    }
    double* o = out.data() + (h * seq + i) * d;
    for (std::size_t c = 0; c < d; ++c) o[c] = acc[c] / sum;
  });
}

void plain_double(benchmark::State& state) {
  const Layer layer =
      make_layer(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  std::vector<double> out(layer.problem.output_elements());
  for (auto _ : state) {
    plain_double_attention(layer, out);
    benchmark::DoNotOptimize(out.data());
  }
}

void judged_layer(benchmark::State& state) {
  const Layer layer =
      make_layer(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const auto& kernel = *sharpcheck::kernels::find_attention_kernel("attention_flash_bf16");
  const sharpcheck::metrics::JudgeSpec spec{sharpcheck::kernels::Operation::attention, &sharpcheck::bf16,
                                            &kernel.tolerance};
  for (auto _ : state) {
    const auto judgement = sharpcheck::metrics::judge_attention_tensors(spec, layer.problem, layer.q, layer.k,
                                                                        layer.v, layer.out, layer.lse);
    if (!judgement.passed()) state.SkipWithError("the flash kernel's layer should pass");
    state.counters["in_double"] = static_cast<double>(judgement.statistics.decided_in_double) /
                                  static_cast<double>(judgement.output.elements + judgement.lse->elements);
  }
}

// Both at the same shapes ([1, H, S, 128]), one timed run each: the large one takes a minute.
void layer_shapes(benchmark::internal::Benchmark* run) {
  run->Args({8, 1024})->Args({32, 4096})->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
}
BENCHMARK(plain_double)->Apply(layer_shapes);
BENCHMARK(judged_layer)->Apply(layer_shapes);

}  // namespace

BENCHMARK_MAIN();
