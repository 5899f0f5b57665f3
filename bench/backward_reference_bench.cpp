// The attention backward reference (reference/attention_backward.hpp: correctly rounded dQ, dK,
// dV; the certified double stage with BLAS products first, Arb balls for what it leaves) for bf16
// [1, H, S, D] causal, against a plain double backward of the same shape (no guarantee) in the
// same run, both on every core. Args are {H, S, D}; the training shape [1, 8, 2048, 128] is
// --benchmark_filter=8/2048/128. torch's fp64 autograd on the same shape: bench/golden_vs_torch.py.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "core/matrix.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "reference/attention_backward.hpp"

namespace {

using sharpcheck::Matrix;

struct Head {
  Matrix q, k, v, d_out;
};

std::vector<Head> make_heads(std::size_t heads, std::size_t seq, std::size_t dim) {
  sharpcheck::DeterministicRandom random(11);
  std::vector<Head> result;
  for (std::size_t h = 0; h < heads; ++h) {
    Head head{Matrix(seq, dim), Matrix(seq, dim), Matrix(seq, dim), Matrix(seq, dim)};
    for (Matrix* m : {&head.q, &head.k, &head.v, &head.d_out}) {
      for (double& x : m->values) x = sharpcheck::round_to_format(random.normal(0, 1), sharpcheck::bf16);
    }
    result.push_back(std::move(head));
  }
  return result;
}

// Plain double causal backward of one query row into per-row dQ and shared dK/dV (per head).
void plain_double_backward(const Head& head, Matrix& dq, Matrix& dk, Matrix& dv) {
  const std::size_t seq = head.q.rows, d = head.q.cols;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(seq), dp(seq);
  for (std::size_t i = 0; i < seq; ++i) {
    double top = -INFINITY, sum = 0, big_d = 0;
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < d; ++t) dot += head.q(i, t) * head.k(j, t);
      p[j] = dot * scale;
      top = std::max(top, p[j]);
    }
    for (std::size_t j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - top);
    for (std::size_t j = 0; j <= i; ++j) {
      p[j] /= sum;
      double dot = 0;
      for (std::size_t c = 0; c < d; ++c) dot += head.d_out(i, c) * head.v(j, c);
      dp[j] = dot;
      big_d += p[j] * dot;
    }
    for (std::size_t j = 0; j <= i; ++j) {
      const double dr = p[j] * (dp[j] - big_d) * scale;
      for (std::size_t t = 0; t < d; ++t) {
        dq(i, t) += dr * head.k(j, t);
        dk(j, t) += dr * head.q(i, t);
      }
      for (std::size_t c = 0; c < d; ++c) dv(j, c) += p[j] * head.d_out(i, c);
    }
  }
}

void BM_PlainDoubleBackward(benchmark::State& state) {
  const auto heads =
      make_heads(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)),
                 static_cast<std::size_t>(state.range(2)));
  for (auto _ : state) {
    std::vector<Matrix> gradients(heads.size() * 3, Matrix(heads[0].q.rows, heads[0].q.cols));
    sharpcheck::parallel_for(heads.size(), 0, [&](std::size_t h) {
      plain_double_backward(heads[h], gradients[3 * h], gradients[3 * h + 1], gradients[3 * h + 2]);
    });
    benchmark::DoNotOptimize(gradients.data());
  }
}

void BM_BackwardReference(benchmark::State& state) {
  const auto heads =
      make_heads(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)),
                 static_cast<std::size_t>(state.range(2)));
  sharpcheck::tensor::HeadScores causal;
  causal.causal = true;
  for (auto _ : state) {
    for (const Head& head : heads) {  // each call uses every core over its queries
      auto gradients = sharpcheck::reference::attention_backward(
          {head.q, head.k, head.v, head.d_out, {}, causal}, sharpcheck::bf16);
      benchmark::DoNotOptimize(gradients.d_queries.values.data());
    }
  }
}

BENCHMARK(BM_PlainDoubleBackward)
    ->Args({8, 256, 64})
    ->Args({8, 1024, 64})
    ->Args({8, 2048, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BackwardReference)
    ->Args({8, 256, 64})
    ->Args({8, 1024, 64})
    ->Args({8, 2048, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
