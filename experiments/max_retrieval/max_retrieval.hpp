// The paper's max-retrieval experiment, by role: data (random sets), model (one attention head and
// its folded form), training, evaluation at growing set sizes, and the report (CSV, Markdown
// beside the paper's table, SVG, and --check's claims). main.cpp parses options and calls them.
//
// Every choice the paper's text leaves open is written in README.md ("Max retrieval").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace max_retrieval {

constexpr int classes = 10;
constexpr int width = 128;
// Evaluation sets are drawn 64 at a time (the same random stream whatever the memory budget) and
// read a few at a time, so each activation tensor stays near 8 MiB instead of 64 x n x 128 floats
// (512 MiB at n = 16,384, whose page faults cost more than the arithmetic).
constexpr int sets_per_draw = 64;
constexpr long items_per_pass = 16384;
// The generator of evaluation seed `seed` at set size n: every model is read on the same sets.
[[nodiscard]] inline std::uint64_t evaluation_stream(int seed, int n) {
  return static_cast<std::uint64_t>(1000003 * (seed + 1) + n);
}

// data.cpp. Items: priority u ~ U(0, 1) and a one-hot class; the label is the class of the top priority.
struct Batch {
  torch::Tensor items;   // [batch, n, 1 + classes]
  torch::Tensor labels;  // [batch]
};
[[nodiscard]] Batch make_batch(int batch, int n, torch::Generator& generator);

// model.cpp: item MLP, one softmax attention head with a learned query, and a predictor MLP.
// in -> width -> width -> width -> out, GELU between (the items' and the predictor's MLP).
[[nodiscard]] torch::nn::Sequential deep_mlp(int in, int out);
struct RetrieverImpl : torch::nn::Module {
  RetrieverImpl();
  // Logits e_i = q . k_i / sqrt(width) and values v_i for every item.
  std::pair<torch::Tensor, torch::Tensor> logits_and_values(const torch::Tensor& batch_items);
  torch::Tensor forward(const torch::Tensor& batch_items);

  torch::nn::Sequential items, predictor;
  torch::nn::Linear key, value;
  torch::Tensor query;
};
TORCH_MODULE(Retriever);

// The trained head read without per-item key and value projections, which are linear:
//   q . (W_k h_i + b_k) / sqrt(d) = (W_k^T q / sqrt(d)) . h_i + q . b_k / sqrt(d),
//   sum_i w_i (W_v h_i + b_v)     = W_v (sum_i w_i h_i) + b_v          (the weights sum to 1).
// The same function as RetrieverImpl::forward in exact arithmetic, at 3 instead of 5 width x width
// products per item; --check compares the two on the first batch of every size.
struct FoldedHead {
  explicit FoldedHead(Retriever& model);
  [[nodiscard]] torch::Tensor logits(const torch::Tensor& hidden) const;
  torch::Tensor key_direction, key_offset;
};

// training.cpp: the process's threads and allocator set for speed (returns a note to print), and
// AdamW training on sets of 16 (returns the seconds it took).
[[nodiscard]] std::string configure_runtime(int threads);
double train(Retriever& model, int steps, int seed);
// Any model whose forward maps a batch of sets to class logits, by the same protocol.
double train_module(torch::nn::Module& model,
                    const std::function<torch::Tensor(const torch::Tensor&)>& forward, int steps, int seed);

// evaluation.cpp: accuracy of plain and adaptive softmax at one set size, with the spreads and
// largest coefficients against Lemma 2.1.
struct SizeResult {
  int n = 0;
  std::vector<double> plain, adaptive;  // accuracy per evaluation seed
  double largest_spread = 0, largest_coefficient = 0, worst_lemma_ratio = 0;
  double mean_spread = 0, mean_largest = 0, lemma_at_mean = 0, tight_at_mean = 0;
  // max |folded - unfolded| logit over max(1, max |unfolded|), first pass of each seed.
  double folding_difference = 0;
  double seconds = 0;
};
[[nodiscard]] SizeResult evaluate_size(Retriever& model, const FoldedHead& head, int n, int evaluation_seeds,
                                       int samples);

// report.cpp
// Two-sided paired t-test p-value (Student t with k-1 degrees of freedom, by numerical integration).
[[nodiscard]] double paired_t_test(const std::vector<double>& a, const std::vector<double>& b);
[[nodiscard]] double mean_of(const std::vector<double>& values);
void print_size_line(const SizeResult& result);
// max_retrieval.csv, max_retrieval.md (beside the paper's table) and max_retrieval.svg in `out`.
void write_reports(const std::vector<SizeResult>& results, const std::string& out, int max_size);
// --check: learned (well above chance at 16), disperses with n, within Lemma 2.1, folded head = model.
[[nodiscard]] bool passes_check(const std::vector<SizeResult>& results);

}  // namespace max_retrieval
