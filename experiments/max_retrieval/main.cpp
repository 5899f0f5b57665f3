// Reproduces the paper's max-retrieval experiment: a single softmax attention head trained on sets
// of 16 items, read at 16 to 16,384 items with plain softmax and with sharpcheck's own
// adaptive-temperature kernel, and checked against Lemma 2.1 at each size. The roles live beside
// this file (max_retrieval.hpp): data, model, training, evaluation, report.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "experiments/max_retrieval/max_retrieval.hpp"
#include "experiments/max_retrieval/operators.hpp"
#include "io/atomic_file.hpp"

namespace {

// --operator: the chosen operator trained in the head (issue 19), read at every size, one CSV.
int run_operator(const std::string& name, int steps, int evaluation_seeds, int samples, int max_size,
                 int training_seed, const std::string& out, bool check) {
  const auto op = max_retrieval::parse_operator(name);
  if (!op) {
    std::fprintf(stderr, "max_retrieval: no operator named '%s'\n", name.c_str());
    return 2;
  }
  max_retrieval::OperatorRetriever model(*op);
  const double training_seconds = max_retrieval::train(model, steps, training_seed);
  model->eval();
  torch::InferenceMode inference;
  std::vector<max_retrieval::OperatorSizeResult> results;
  for (int n = 16; n <= max_size; n *= 2)
    results.push_back(max_retrieval::evaluate_operator_size(model, n, evaluation_seeds, samples));
  double evaluation_seconds = 0;
  for (const auto& r : results) evaluation_seconds += r.seconds;
  std::printf("training %.1f s, evaluation %.1f s\n", training_seconds, evaluation_seconds);
  max_retrieval::write_operator_run(results, *op, training_seed, out);
  if (*op == max_retrieval::Operator::selective) {
    const double discrepancy = max_retrieval::selective_penalty_discrepancy();
    std::printf("selective penalty, blocked against direct: %.3g of its scale\n", discrepancy);
    if (check && !(discrepancy < 1e-5)) {
      std::printf("CHECK FAILED: the blocked selective penalty differs from the direct one\n");
      return 1;
    }
  }
  const double bound = max_retrieval::spread_bound(model);
  if (std::isfinite(bound)) std::printf("spread bound of the trained head: %.4g\n", bound);
  return !check || max_retrieval::passes_operator_check(results, *op, bound) ? 0 : 1;
}

}  // namespace

// The program; main() below only guarantees that no exception leaves it.
int run(int argc, char** argv) {
  CLI::App app{"Max retrieval: train at 16 items, read at up to 16,384 (Velickovic et al. 2024)"};
  int steps = 20000, evaluation_seeds = 10, samples = 256, max_size = 16384, training_seed = 1;
  // One thread by default: the ops are too small to gain from two here (300 steps: 4.9 s on one,
  // 5.2 s on two), and one thread makes the figures independent of the machine's core count.
  int threads = 1;
  std::string out = "max_retrieval", operator_name, summarise;
  bool check = false;
  app.add_option("--steps", steps, "Training steps (batch 128, 16 items)")->check(CLI::NonNegativeNumber);
  app.add_option("--seeds", evaluation_seeds, "Evaluation seeds per size")->check(CLI::Range(1, 1000));
  app.add_option("--samples", samples, "Sets per size and seed")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-size", max_size, "Largest set size (powers of two from 16)")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--training-seed", training_seed, "Seed of the model's initialisation and data");
  app.add_option("--out", out, "Output directory");
  app.add_option("--threads", threads, "Torch threads")->check(CLI::Range(1, 1024));
  app.add_flag("--check", check,
               "Exit 1 unless accuracy at 16 is well above chance, falls with n, and no coefficient exceeds "
               "Lemma 2.1's bound at its row's spread, and the folded head's logits equal the model's");
  app.add_option(
      "--operator", operator_name,
      "Train this operator in the head instead (softmax, adaptive, ssmax, length_scaled, sigmoid, "
      "stick_breaking, selective, differential, qk_norm, softcap, entmax15) and write "
      "operator_<name>_seed<k>.csv; --check then asks: learned at 16, within Lemma 2.1 where a softmax");
  app.add_option("--summarise", summarise,
                 "Summarise every operator_*.csv in this directory (escapes_trained.md/.csv/.svg) and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!summarise.empty()) {
      max_retrieval::summarise_operator_runs(summarise);
      return 0;
    }
    torch::manual_seed(training_seed);
    std::printf("%s\n", max_retrieval::configure_runtime(threads).c_str());
    sharpcheck::io::make_writable_directory(out);
    if (!operator_name.empty())
      return run_operator(operator_name, steps, evaluation_seeds, samples, max_size, training_seed, out,
                          check);
    max_retrieval::Retriever model;
    const double training_seconds = max_retrieval::train(model, steps, training_seed);
    model->eval();
    torch::InferenceMode inference;
    const max_retrieval::FoldedHead head(model);
    std::vector<max_retrieval::SizeResult> results;
    double evaluation_seconds = 0;
    for (int n = 16; n <= max_size; n *= 2) {
      results.push_back(max_retrieval::evaluate_size(model, head, n, evaluation_seeds, samples));
      max_retrieval::print_size_line(results.back());
      evaluation_seconds += results.back().seconds;
    }
    std::printf("training %.1f s, evaluation %.1f s\n", training_seconds, evaluation_seconds);
    max_retrieval::write_reports(results, out, max_size);
    if (!check) return 0;
    return max_retrieval::passes_check(results) ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "max_retrieval: %s\n", error.what());
    return 2;
  }
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "max_retrieval: %s\n", error.what());
  } catch (...) {
    std::fprintf(stderr, "max_retrieval: an unknown error\n");
  }
  return 2;
}
