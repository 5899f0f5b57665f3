#include <chrono>
#include <cmath>
#include <limits>

#include "bounds/bounds.hpp"
#include "experiments/max_retrieval/max_retrieval.hpp"
#include "experiments/max_retrieval/operators.hpp"

namespace max_retrieval {
namespace {

struct RowSums {
  double spread = 0, largest = 0;
  long rows = 0;
};

// One pass of a few sets: their predictions, and each row's spread and largest weight folded into
// the result (Lemma 2.1's ratio where it applies).
long read_pass(OperatorRetriever& model, const Batch& batch, const torch::indexing::Slice& sets, int n,
               OperatorSizeResult& result, RowSums& sums) {
  const auto hidden = model->items->forward(batch.items.index({sets}));
  const HeadReading reading = model->read(hidden);
  const long correct =
      model->classify(hidden, reading.weights).argmax(1).eq(batch.labels.index({sets})).sum().item<long>();
  const auto spreads = std::get<0>(reading.logits.max(1)) - std::get<0>(reading.logits.min(1));
  const auto largest = std::get<0>(reading.weights.abs().max(1));
  const auto spread_values = spreads.contiguous();
  const auto largest_values = largest.contiguous();
  for (int64_t r = 0; r < spread_values.size(0); ++r) {
    const double delta = spread_values[r].item<double>(), top = largest_values[r].item<double>();
    result.largest_spread = std::max(result.largest_spread, delta);
    result.largest_weight = std::max(result.largest_weight, top);
    if (is_softmax_of_logits(model->op)) {
      result.worst_lemma_ratio =
          std::max(result.worst_lemma_ratio, top / sharpcheck::bounds::lemma_2_1(n, delta, 1.0).upper);
    }
    sums.spread += delta;
    sums.largest += top;
    ++sums.rows;
  }
  return correct;
}

}  // namespace

OperatorSizeResult evaluate_operator_size(OperatorRetriever& model, int n, int evaluation_seeds,
                                          int samples) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  OperatorSizeResult result;
  result.n = n;
  if (!is_softmax_of_logits(model->op)) result.worst_lemma_ratio = std::numeric_limits<double>::quiet_NaN();
  RowSums sums;
  const int sets_per_pass = static_cast<int>(std::max(1L, items_per_pass / n));
  for (int seed = 0; seed < evaluation_seeds; ++seed) {
    auto generator = at::detail::createCPUGenerator(evaluation_stream(seed, n));
    long correct = 0;
    for (int first = 0; first < samples; first += sets_per_draw) {
      const Batch batch = make_batch(std::min(sets_per_draw, samples - first), n, generator);
      const int drawn = static_cast<int>(batch.items.size(0));
      for (int pass = 0; pass < drawn; pass += sets_per_pass) {
        const auto sets = torch::indexing::Slice(pass, std::min(drawn, pass + sets_per_pass));
        correct += read_pass(model, batch, sets, n, result, sums);
      }
    }
    result.accuracy.push_back(static_cast<double>(correct) / samples);
  }
  result.mean_spread = sums.spread / static_cast<double>(sums.rows);
  result.mean_largest = sums.largest / static_cast<double>(sums.rows);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace max_retrieval
