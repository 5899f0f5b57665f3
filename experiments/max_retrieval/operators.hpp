// The max-retrieval model with the attention operator chosen (issue 19): the same item MLP, keys,
// values, learned query and predictor as model.cpp, with the head's softmax replaced by one of the
// escapes from dispersion, present during training as well as reading. What each operator
// computes, and where our single-query model forces a choice, is written beside its code in
// operators.cpp and in docs/escapes_trained.md.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace max_retrieval {

enum class Operator {
  softmax,         // softmax(e)
  adaptive,        // the paper's adaptive temperature, in training too
  ssmax,           // softmax(s ln(n) e), s learned (Nakanishi 2025)
  length_scaled,   // softmax(max(1, ln n / ln 16) e) (Qwen's logn attention, trained at 16)
  sigmoid,         // sigmoid(e - ln n) per item (Ramapuram et al. 2024)
  stick_breaking,  // beta_j prod_{k > j} (1 - beta_k), beta = sigmoid(e) (Tan et al. 2024)
  selective,       // softmax(e - F), F from a selection head (Leviathan et al. 2024)
  differential,  // (softmax(e1) - lambda softmax(e2)), RMS-normalised, times 1 - lambda_init (Ye et al. 2024)
  qk_norm,       // softmax of RMS-normalised q and k with learned gains
  softcap,       // softmax(50 tanh(e / 50)) (Gemma 2)
  entmax15,      // 1.5-entmax (Peters et al. 2019), exact sort-based threshold
};

inline constexpr Operator all_operators[] = {
    Operator::softmax, Operator::adaptive,       Operator::ssmax,     Operator::length_scaled,
    Operator::sigmoid, Operator::stick_breaking, Operator::selective, Operator::differential,
    Operator::qk_norm, Operator::softcap,        Operator::entmax15};

[[nodiscard]] std::string_view operator_name(Operator op);
[[nodiscard]] std::optional<Operator> parse_operator(std::string_view name);
// Whether the head's weights are a softmax of some logits (Lemma 2.1 then bounds every weight by
// e^delta / n, delta the spread of those logits).
[[nodiscard]] bool is_softmax_of_logits(Operator op);

// What the head read from one batch of sets: the logits the operator normalises (for a softmax,
// its argument; for Differential the larger-spread of its two) and the weights on each item.
struct HeadReading {
  torch::Tensor logits;   // [sets, n]
  torch::Tensor weights;  // [sets, n]
};

struct OperatorRetrieverImpl : torch::nn::Module {
  explicit OperatorRetrieverImpl(Operator op);
  [[nodiscard]] HeadReading read(const torch::Tensor& hidden);  // hidden: [sets, n, width]
  // The predictor's class logits from the items' hidden vectors and the head's weights.
  [[nodiscard]] torch::Tensor classify(const torch::Tensor& hidden, const torch::Tensor& weights);
  torch::Tensor forward(const torch::Tensor& batch_items);

  Operator op;
  torch::nn::Sequential items, predictor;
  torch::nn::Linear key, value;
  torch::Tensor query;
  torch::Tensor ssmax_s;                                             // SSMax
  torch::nn::Linear key2{nullptr};                                   // Differential's second head
  torch::Tensor query2, lambda_q1, lambda_k1, lambda_q2, lambda_k2;  // and its lambda
  torch::nn::Linear select_query{nullptr}, select_key{nullptr};      // selective's selection head
  torch::Tensor gain_q, gain_k;                                      // QK-norm's gains

 private:
  [[nodiscard]] torch::Tensor head_logits(const torch::Tensor& hidden, const torch::nn::Linear& keys,
                                          const torch::Tensor& q) const;
};
TORCH_MODULE(OperatorRetriever);

// Differential's lambda_init for a single layer: 0.8 - 0.6 exp(-0.3 (l - 1)) with l = 1.
inline constexpr double differential_lambda_init = 0.2;

// training.cpp: AdamW on sets of 16, as train() (returns the seconds it took).
double train(OperatorRetriever& model, int steps, int seed);

// evaluation_operators.cpp: accuracy per evaluation seed at one set size (the same sets as
// evaluate_size), each row's spread delta of the head's logits, its largest weight, and, for the
// operators that are a softmax of logits, the largest weight over Lemma 2.1's bound at its spread.
struct OperatorSizeResult {
  int n = 0;
  std::vector<double> accuracy;  // per evaluation seed
  double mean_spread = 0, largest_spread = 0, mean_largest = 0, largest_weight = 0;
  double worst_lemma_ratio = 0;  // NaN where Lemma 2.1 does not apply
  double seconds = 0;
};
[[nodiscard]] OperatorSizeResult evaluate_operator_size(OperatorRetriever& model, int n, int evaluation_seeds,
                                                        int samples);

// report_operators.cpp: one run's CSV (operator_<name>_seed<k>.csv in `out`), its --check (learned
// at 16: accuracy above 0.5; Lemma 2.1 holds where the operator is a softmax), and the summary of
// every such CSV in a directory (escapes_trained.{csv,md,svg}).
void write_operator_run(const std::vector<OperatorSizeResult>& results, Operator op, int training_seed,
                        const std::string& out);
[[nodiscard]] bool passes_operator_check(const std::vector<OperatorSizeResult>& results, Operator op,
                                         double spread_bound);

// The spread every row's logits must stay within, whatever the inputs: QK-norm's 2 sqrt(width)
// max|g_q| max|g_k| (|q^ . k^| <= |g_q|_inf |g_k|_inf |q / rms(q)| |k / rms(k)| = width max max,
// divided by sqrt(width)); the soft-cap's 2 x 50; +inf for the others.
[[nodiscard]] double spread_bound(OperatorRetriever& model);

// Selective attention reads with a blocked penalty (no gradients) and trains with the direct masked
// form: their largest difference on random 2,500-item sets, relative to the largest penalty.
[[nodiscard]] double selective_penalty_discrepancy();
void summarise_operator_runs(const std::string& directory);

}  // namespace max_retrieval
