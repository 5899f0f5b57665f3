#include <algorithm>
#include <chrono>

#include "bounds/bounds.hpp"
#include "experiments/max_retrieval/max_retrieval.hpp"
#include "kernels/softmax_kernels.hpp"

namespace max_retrieval {
namespace {

// Correct answers of one evaluation seed, and the running sums over every row of the size (summed
// in row order, as one pass over all seeds).
struct BatchTally {
  long plain_correct = 0, adaptive_correct = 0;
};
struct RowSums {
  double spread_sum = 0, largest_sum = 0;
  long rows = 0;
};

struct BatchOutputs {
  torch::Tensor logits, plain_weights, plain_pooled, adaptive_pooled;
};

// The batch's logits, plain and adaptive weights and pooled values, a few sets per pass.
BatchOutputs read_batch(Retriever& model, const FoldedHead& head, const Batch& batch, int n) {
  const int batch_size = static_cast<int>(batch.items.size(0));
  const int sets_per_pass = static_cast<int>(std::max(1L, items_per_pass / n));
  BatchOutputs outputs{torch::empty({batch_size, n}), torch::empty({batch_size, n}),
                       torch::empty({batch_size, width}), torch::empty({batch_size, width})};
  for (int first = 0; first < batch_size; first += sets_per_pass) {
    const int count = std::min(sets_per_pass, batch_size - first);
    const auto sets = torch::indexing::Slice(first, first + count);
    const auto hidden = model->items->forward(batch.items.index({sets}));  // [count, n, width]
    const auto pass_logits = head.logits(hidden).contiguous();
    outputs.logits.index_put_({sets}, pass_logits);
    const auto plain = torch::softmax(pass_logits, -1);
    // Adaptive temperature at inference, by sharpcheck's kernel (the code the gate validates).
    auto adaptive = torch::empty_like(pass_logits);
    for (int b = 0; b < count; ++b) {
      sharpcheck::kernels::softmax_adaptive_fp32(pass_logits.data_ptr<float>() + static_cast<long>(b) * n,
                                                 adaptive.data_ptr<float>() + static_cast<long>(b) * n,
                                                 static_cast<std::size_t>(n), 1.0F);
    }
    outputs.plain_weights.index_put_({sets}, plain);
    outputs.plain_pooled.index_put_({sets}, torch::bmm(plain.unsqueeze(1), hidden).squeeze(1));
    outputs.adaptive_pooled.index_put_({sets}, torch::bmm(adaptive.unsqueeze(1), hidden).squeeze(1));
  }
  return outputs;
}

// max |folded - unfolded| logit over the first pass of the batch, relative to max(1, max |unfolded|).
double folding_difference(Retriever& model, const Batch& batch, const torch::Tensor& logits, int n) {
  const int sets_per_pass = static_cast<int>(std::max(1L, items_per_pass / n));
  const auto sets = torch::indexing::Slice(0, std::min(static_cast<int>(batch.items.size(0)), sets_per_pass));
  const auto unfolded = model->logits_and_values(batch.items.index({sets})).first;
  const double scale = std::max(1.0, unfolded.abs().max().item<double>());
  return (unfolded - logits.index({sets})).abs().max().item<double>() / scale;
}

// Accuracy of both operators on the batch, and each row's spread and largest coefficient against
// Lemma 2.1 (the instrumentation).
void tally_batch(Retriever& model, const Batch& batch, const BatchOutputs& outputs, int n, SizeResult& result,
                 BatchTally& tally, RowSums& sums) {
  const auto predict = [&](const torch::Tensor& pooled) {
    return model->predictor->forward(model->value->forward(pooled)).argmax(1);
  };
  tally.plain_correct += predict(outputs.plain_pooled).eq(batch.labels).sum().item<long>();
  tally.adaptive_correct += predict(outputs.adaptive_pooled).eq(batch.labels).sum().item<long>();
  const auto spreads = std::get<0>(outputs.logits.max(1)) - std::get<0>(outputs.logits.min(1));
  const auto largest = std::get<0>(outputs.plain_weights.max(1));
  for (int b = 0; b < static_cast<int>(batch.items.size(0)); ++b) {
    const double delta = spreads[b].item<double>();
    const double top = largest[b].item<double>();
    const double lemma = sharpcheck::bounds::lemma_2_1(n, delta, 1.0).upper;
    result.worst_lemma_ratio = std::max(result.worst_lemma_ratio, top / lemma);
    result.largest_spread = std::max(result.largest_spread, delta);
    result.largest_coefficient = std::max(result.largest_coefficient, top);
    sums.spread_sum += delta;
    sums.largest_sum += top;
    ++sums.rows;
  }
}

}  // namespace

SizeResult evaluate_size(Retriever& model, const FoldedHead& head, int n, int evaluation_seeds, int samples) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  SizeResult result;
  result.n = n;
  RowSums total;
  for (int seed = 0; seed < evaluation_seeds; ++seed) {
    auto generator = at::detail::createCPUGenerator(evaluation_stream(seed, n));
    BatchTally tally;
    for (int first = 0; first < samples; first += sets_per_draw) {
      const Batch batch = make_batch(std::min(sets_per_draw, samples - first), n, generator);
      const BatchOutputs outputs = read_batch(model, head, batch, n);
      if (first == 0) {
        result.folding_difference =
            std::max(result.folding_difference, folding_difference(model, batch, outputs.logits, n));
      }
      tally_batch(model, batch, outputs, n, result, tally, total);
    }
    result.plain.push_back(static_cast<double>(tally.plain_correct) / samples);
    result.adaptive.push_back(static_cast<double>(tally.adaptive_correct) / samples);
  }
  result.mean_spread = total.spread_sum / static_cast<double>(total.rows);
  result.mean_largest = total.largest_sum / static_cast<double>(total.rows);
  result.lemma_at_mean = sharpcheck::bounds::lemma_2_1(n, result.mean_spread, 1.0).upper;
  result.tight_at_mean = sharpcheck::bounds::tight_largest_coefficient(n, result.mean_spread, 1.0);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace max_retrieval
