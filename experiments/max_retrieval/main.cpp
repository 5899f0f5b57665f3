// Reproduces the paper's max-retrieval experiment: a single softmax attention head trained on sets
// of 16 items, read at 16 to 16,384 items with plain softmax and with sharpcheck's own
// adaptive-temperature kernel, and checked against Lemma 2.1 at each size. The roles live beside
// this file (max_retrieval.hpp): data, model, training, evaluation, report.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "experiments/max_retrieval/max_retrieval.hpp"
#include "io/atomic_file.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Max retrieval: train at 16 items, read at up to 16,384 (Velickovic et al. 2024)"};
  int steps = 20000, evaluation_seeds = 10, samples = 256, max_size = 16384, training_seed = 1;
  // One thread by default: the ops are too small to gain from two here (300 steps: 4.9 s on one,
  // 5.2 s on two), and one thread makes the figures independent of the machine's core count.
  int threads = 1;
  std::string out = "max_retrieval";
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
  CLI11_PARSE(app, argc, argv);
  try {
    torch::manual_seed(training_seed);
    std::printf("%s\n", max_retrieval::configure_runtime(threads).c_str());
    sharpcheck::io::make_writable_directory(out);
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
