// The correctly rounded reference against a plain 256-bit MPFR softmax loop, in the same run.
// Inputs: random normal logits, sigma = 3, rounded to fp32 (a kernel's inputs).
#include <benchmark/benchmark.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "reference/attention.hpp"
#include "reference/softmax.hpp"

namespace {

std::vector<double> normal_row(std::size_t n, std::uint64_t seed) {
  sharpcheck::DeterministicRandom random(seed);
  std::vector<double> row(n);
  for (double& e : row) e = static_cast<float>(random.normal(0, 3));
  return row;
}

// Which stage decided the results, as fractions of them, as benchmark counters.
void report_stages(benchmark::State& state, const sharpcheck::reference::ZivStatistics& statistics,
                   double results) {
  state.counters["in_double"] = static_cast<double>(statistics.decided_in_double) / results;
  state.counters["by_balls"] = static_cast<double>(statistics.decided_by_balls) / results;
  state.counters["escalations"] = static_cast<double>(statistics.escalations);
}

// The rows change each iteration (8 seeds in turn), so that one row with an element near a
// rounding boundary (which sends the row on to the ball stage) does not decide the figure alone.
void correctly_rounded_softmax_fp32(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<std::vector<double>> rows;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) rows.push_back(normal_row(n, seed));
  sharpcheck::reference::ZivStatistics statistics;
  sharpcheck::reference::RowOptions options;
  options.statistics = &statistics;
  std::size_t next = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        sharpcheck::reference::softmax(rows[next++ % rows.size()], sharpcheck::fp32, options));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  report_stages(state, statistics, static_cast<double>(state.iterations() * n));
}
BENCHMARK(correctly_rounded_softmax_fp32)->Arg(1024)->Arg(16384)->Arg(262144)->Unit(benchmark::kMillisecond);

// The comparison: max, exp, sum, divide at 256 bits, rounded to nearest at each step (not a
// correctly rounded result: this is the cost of "just use lots of bits").
void plain_mpfr_256_softmax(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<double> row = normal_row(n, 1);
  std::vector<double> out(n);
  mpfr_t best, sum, term;
  mpfr_inits2(256, best, sum, term, static_cast<mpfr_ptr>(nullptr));
  for (auto _ : state) {
    mpfr_set_d(best, *std::max_element(row.begin(), row.end()), MPFR_RNDN);
    mpfr_set_zero(sum, 1);
    std::vector<__mpfr_struct> exps(n);
    for (std::size_t j = 0; j < n; ++j) {
      mpfr_init2(&exps[j], 256);
      mpfr_set_d(&exps[j], row[j], MPFR_RNDN);
      mpfr_sub(&exps[j], &exps[j], best, MPFR_RNDN);
      mpfr_exp(&exps[j], &exps[j], MPFR_RNDN);
      mpfr_add(sum, sum, &exps[j], MPFR_RNDN);
    }
    for (std::size_t j = 0; j < n; ++j) {
      mpfr_div(term, &exps[j], sum, MPFR_RNDN);
      out[j] = mpfr_get_d(term, MPFR_RNDN);
      mpfr_clear(&exps[j]);
    }
    benchmark::DoNotOptimize(out.data());
  }
  mpfr_clears(best, sum, term, static_cast<mpfr_ptr>(nullptr));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(plain_mpfr_256_softmax)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

// A plain double softmax: the floor any reference is measured against.
void plain_double_softmax(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<double> row = normal_row(n, 1);
  std::vector<double> out(n);
  for (auto _ : state) {
    const double best = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += out[j] = std::exp(row[j] - best);
    for (double& p : out) p /= sum;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(plain_double_softmax)->Arg(16384);

void correctly_rounded_attention_row(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t d = 128;
  sharpcheck::DeterministicRandom random(2);
  sharpcheck::Matrix q(1, d), k(n, d), v(n, d);
  for (auto* matrix : {&q, &k, &v}) {
    for (double& x : matrix->values) x = static_cast<float>(random.normal(0, 1));
  }
  sharpcheck::reference::ZivStatistics statistics;
  sharpcheck::reference::AttentionOptions options;
  options.statistics = &statistics;
  for (auto _ : state)
    benchmark::DoNotOptimize(sharpcheck::reference::attention(q, k, v, sharpcheck::fp32, options));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  report_stages(state, statistics, static_cast<double>(state.iterations() * d));  // d outputs a row
}
BENCHMARK(correctly_rounded_attention_row)->Arg(16384)->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
