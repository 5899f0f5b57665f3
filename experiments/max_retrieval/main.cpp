// Reproduces the paper's max-retrieval experiment: a single softmax attention head trained on sets
// of 16 items, read at 16 to 16,384 items with plain softmax and with sharpcheck's own
// adaptive-temperature kernel, and checked against Lemma 2.1 at each size.
//
// Every choice the paper's text leaves open is written in README.md ("Max retrieval").
#include <dlfcn.h>
#include <malloc.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <vector>

#include "bounds/bounds.hpp"
#include "io/svg_plot.hpp"
#include "kernels/softmax_kernels.hpp"

namespace {

constexpr int classes = 10;
constexpr int width = 128;

// Items: priority u ~ U(0, 1) and a one-hot class; the label is the class of the top priority.
struct Batch {
  torch::Tensor items;   // [batch, n, 1 + classes]
  torch::Tensor labels;  // [batch]
};

Batch make_batch(int batch, int n, torch::Generator& generator) {
  const auto priority = torch::rand({batch, n, 1}, generator);
  const auto item_class = torch::randint(0, classes, {batch, n}, generator);
  const auto one_hot = torch::one_hot(item_class, classes).to(torch::kFloat32);
  const auto top = priority.squeeze(-1).argmax(1);
  return {torch::cat({priority, one_hot}, -1), item_class.gather(1, top.unsqueeze(1)).squeeze(1)};
}

torch::nn::Sequential deep_mlp(int in, int out) {
  return torch::nn::Sequential(
      torch::nn::Linear(in, width), torch::nn::GELU(), torch::nn::Linear(width, width), torch::nn::GELU(),
      torch::nn::Linear(width, width), torch::nn::GELU(), torch::nn::Linear(width, out));
}

struct RetrieverImpl : torch::nn::Module {
  RetrieverImpl()
      : items(register_module("items", deep_mlp(1 + classes, width))),
        key(register_module("key", torch::nn::Linear(width, width))),
        value(register_module("value", torch::nn::Linear(width, width))),
        predictor(register_module("predictor", deep_mlp(width, classes))),
        query(register_parameter("query", torch::randn({width}) / std::sqrt(static_cast<double>(width)))) {}

  // Logits e_i = q . k_i / sqrt(width) and values v_i for every item.
  std::pair<torch::Tensor, torch::Tensor> logits_and_values(const torch::Tensor& batch_items) {
    const auto h = items->forward(batch_items);
    const auto k = key->forward(h);
    const auto logits = torch::matmul(k, query) / std::sqrt(static_cast<double>(width));
    return {logits, value->forward(h)};
  }
  torch::Tensor forward(const torch::Tensor& batch_items) {
    auto [logits, values] = logits_and_values(batch_items);
    const auto weights = torch::softmax(logits, -1).unsqueeze(-1);
    return predictor->forward((weights * values).sum(1));
  }

  torch::nn::Sequential items, predictor;
  torch::nn::Linear key, value;
  torch::Tensor query;
};
TORCH_MODULE(Retriever);

// Debian's libtorch calls the system BLAS (OpenBLAS through the alternatives link) from its own
// OpenMP threads; OpenBLAS's pthread pool then competes with them for the same cores. One BLAS
// thread per caller is 2.8x faster here (300 training steps: 11.2 s against 31.7 s on 2 cores).
// Looked up at run time: with another BLAS the symbol is absent and nothing changes.
const char* keep_blas_single_threaded() {
  using SetThreads = void (*)(int);
  if (auto* set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_threads(1);
    return "OpenBLAS held to 1 thread per caller";
  }
  return "BLAS threads left as they are (not OpenBLAS)";
}

// The trained head read without per-item key and value projections, which are linear:
//   q . (W_k h_i + b_k) / sqrt(d) = (W_k^T q / sqrt(d)) . h_i + q . b_k / sqrt(d),
//   sum_i w_i (W_v h_i + b_v)     = W_v (sum_i w_i h_i) + b_v          (the weights sum to 1).
// The same function as RetrieverImpl::forward in exact arithmetic, at 3 instead of 5 width x width
// products per item; --check compares the two on the first batch of every size.
struct FoldedHead {
  explicit FoldedHead(Retriever& model)
      : key_direction(torch::matmul(model->key->weight.t(), model->query) /
                      std::sqrt(static_cast<double>(width))),
        key_offset((model->key->bias * model->query).sum() / std::sqrt(static_cast<double>(width))) {}
  torch::Tensor logits(const torch::Tensor& hidden) const {
    return torch::matmul(hidden, key_direction) + key_offset;
  }
  torch::Tensor key_direction, key_offset;
};

struct SizeResult {
  int n = 0;
  std::vector<double> plain, adaptive;  // accuracy per evaluation seed
  double largest_spread = 0, largest_coefficient = 0, worst_lemma_ratio = 0;
  double mean_spread = 0, mean_largest = 0, lemma_at_mean = 0, tight_at_mean = 0;
  // max |folded - unfolded| logit over max(1, max |unfolded|), first pass of each seed.
  double folding_difference = 0;
  double seconds = 0;
};

// Two-sided paired t-test p-value (Student t with k-1 degrees of freedom, by numerical integration).
double paired_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  const std::size_t k = a.size();
  if (k < 2) return std::numeric_limits<double>::quiet_NaN();  // one seed: no variance, no test
  std::vector<double> d(k);
  for (std::size_t i = 0; i < k; ++i) d[i] = a[i] - b[i];
  const double mean = std::accumulate(d.begin(), d.end(), 0.0) / static_cast<double>(k);
  double variance = 0;
  for (const double x : d) variance += (x - mean) * (x - mean);
  variance /= static_cast<double>(k - 1);
  if (variance == 0) return mean == 0 ? 1.0 : 0.0;
  const double t = std::fabs(mean) / std::sqrt(variance / static_cast<double>(k));
  const double nu = static_cast<double>(k - 1);
  // P(|T| > t) = I_{nu/(nu+t^2)}(nu/2, 1/2); integrate the t density instead (Simpson, fine grid).
  const auto density = [nu](double x) {
    return std::exp(std::lgamma((nu + 1) / 2) - std::lgamma(nu / 2)) / std::sqrt(nu * M_PI) *
           std::pow(1 + x * x / nu, -(nu + 1) / 2);
  };
  const int steps = 20000;
  const double h = t / steps;
  double area = density(0) + density(t);
  for (int i = 1; i < steps; ++i) area += (i % 2 == 1 ? 4 : 2) * density(i * h);
  return std::clamp(1 - 2 * area * h / 3, 0.0, 1.0);
}

}  // namespace

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
  torch::manual_seed(training_seed);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen, also in a pipe
  const char* blas_note = keep_blas_single_threaded();
  // Activations of 1 to 8 MiB are above glibc's mmap threshold: each was mapped, page-faulted in and
  // unmapped again on every use, which took half the training step. Keeping them in the heap makes a
  // 300-step run 2.2x faster here (10.5 s against 4.8 s).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  torch::set_num_threads(threads);
  std::printf("%s; %d torch threads\n", blas_note, torch::get_num_threads());
  std::filesystem::create_directories(out);
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };

  Retriever model;
  // AdamW (decoupled weight decay): with Adam's L2 decay the query collapsed to 0 and the head stayed
  // uniform (loss ln 10 after 3,000 steps).
  torch::optim::AdamW optimiser(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(1e-3));
  auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(training_seed));
  const auto training_start = Clock::now();
  for (int step = 1; step <= steps; ++step) {
    const Batch batch = make_batch(128, 16, generator);
    optimiser.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(model->forward(batch.items), batch.labels);
    loss.backward();
    optimiser.step();
    if (step % 1000 == 0 || step == steps)
      std::printf("step %d loss %.4f (%.0f s)\n", step, loss.item<double>(), seconds_since(training_start));
  }
  const double training_seconds = seconds_since(training_start);
  model->eval();
  torch::InferenceMode inference;
  const FoldedHead head(model);

  // Sets are drawn 64 at a time (the same random stream whatever the memory budget) and read a few
  // at a time, so each activation tensor stays near 8 MiB instead of 64 x n x 128 floats (512 MiB at
  // n = 16,384, whose page faults cost more than the arithmetic).
  constexpr int sets_per_draw = 64;
  constexpr long items_per_pass = 16384;
  std::vector<SizeResult> results;
  for (int n = 16; n <= max_size; n *= 2) {
    const auto size_start = Clock::now();
    SizeResult result;
    result.n = n;
    double spread_sum = 0, largest_sum = 0;
    long rows = 0;
    const int sets_per_pass = static_cast<int>(std::max(1L, items_per_pass / n));
    for (int seed = 0; seed < evaluation_seeds; ++seed) {
      auto eval_generator =
          at::detail::createCPUGenerator(static_cast<std::uint64_t>(1000003 * (seed + 1) + n));
      long plain_correct = 0, adaptive_correct = 0;
      for (int start = 0; start < samples; start += sets_per_draw) {
        const int batch_size = std::min(sets_per_draw, samples - start);
        const Batch batch = make_batch(batch_size, n, eval_generator);
        auto logits = torch::empty({batch_size, n});
        auto plain_weights = torch::empty({batch_size, n});
        auto adaptive_weights = torch::empty({batch_size, n});
        auto plain_pooled = torch::empty({batch_size, width});
        auto adaptive_pooled = torch::empty({batch_size, width});
        for (int first = 0; first < batch_size; first += sets_per_pass) {
          const int count = std::min(sets_per_pass, batch_size - first);
          const auto sets = torch::indexing::Slice(first, first + count);
          const auto hidden = model->items->forward(batch.items.index({sets}));  // [count, n, width]
          const auto pass_logits = head.logits(hidden).contiguous();
          logits.index_put_({sets}, pass_logits);
          const auto plain = torch::softmax(pass_logits, -1);
          // Adaptive temperature at inference, by sharpcheck's kernel (the code the gate validates).
          auto adaptive = torch::empty_like(pass_logits);
          for (int b = 0; b < count; ++b) {
            sharpcheck::kernels::softmax_adaptive_fp32(
                pass_logits.data_ptr<float>() + static_cast<long>(b) * n,
                adaptive.data_ptr<float>() + static_cast<long>(b) * n, static_cast<std::size_t>(n), 1.0F);
          }
          plain_weights.index_put_({sets}, plain);
          adaptive_weights.index_put_({sets}, adaptive);
          plain_pooled.index_put_({sets}, torch::bmm(plain.unsqueeze(1), hidden).squeeze(1));
          adaptive_pooled.index_put_({sets}, torch::bmm(adaptive.unsqueeze(1), hidden).squeeze(1));
        }
        if (start == 0) {
          const auto sets = torch::indexing::Slice(0, std::min(batch_size, sets_per_pass));
          const auto unfolded = model->logits_and_values(batch.items.index({sets})).first;
          const double scale = std::max(1.0, unfolded.abs().max().item<double>());
          result.folding_difference =
              std::max(result.folding_difference,
                       (unfolded - logits.index({sets})).abs().max().item<double>() / scale);
        }
        const auto predict = [&](const torch::Tensor& pooled) {
          return model->predictor->forward(model->value->forward(pooled)).argmax(1);
        };
        plain_correct += predict(plain_pooled).eq(batch.labels).sum().item<long>();
        adaptive_correct += predict(adaptive_pooled).eq(batch.labels).sum().item<long>();
        // Instrumentation: each row's spread and largest coefficient against Lemma 2.1.
        const auto spreads = std::get<0>(logits.max(1)) - std::get<0>(logits.min(1));
        const auto largest = std::get<0>(plain_weights.max(1));
        for (int b = 0; b < batch_size; ++b) {
          const double delta = spreads[b].item<double>();
          const double top = largest[b].item<double>();
          const double lemma = sharpcheck::bounds::lemma_2_1(n, delta, 1.0).upper;
          result.worst_lemma_ratio = std::max(result.worst_lemma_ratio, top / lemma);
          result.largest_spread = std::max(result.largest_spread, delta);
          result.largest_coefficient = std::max(result.largest_coefficient, top);
          spread_sum += delta;
          largest_sum += top;
          ++rows;
        }
      }
      result.plain.push_back(static_cast<double>(plain_correct) / samples);
      result.adaptive.push_back(static_cast<double>(adaptive_correct) / samples);
    }
    result.mean_spread = spread_sum / static_cast<double>(rows);
    result.mean_largest = largest_sum / static_cast<double>(rows);
    result.lemma_at_mean = sharpcheck::bounds::lemma_2_1(n, result.mean_spread, 1.0).upper;
    result.tight_at_mean = sharpcheck::bounds::tight_largest_coefficient(n, result.mean_spread, 1.0);
    result.seconds = seconds_since(size_start);
    results.push_back(result);
    const double plain = std::accumulate(result.plain.begin(), result.plain.end(), 0.0) / evaluation_seeds;
    const double adaptive =
        std::accumulate(result.adaptive.begin(), result.adaptive.end(), 0.0) / evaluation_seeds;
    std::printf(
        "n=%6d plain %.3f adaptive %.3f p=%.3g mean spread %.3f mean max coefficient %.4g (tight %.4g, "
        "lemma %.4g), worst coefficient/lemma %.4f, folding %.2g (%.1f s)\n",
        n, plain, adaptive, paired_t_test(result.plain, result.adaptive), result.mean_spread,
        result.mean_largest, result.tight_at_mean, result.lemma_at_mean, result.worst_lemma_ratio,
        result.folding_difference, result.seconds);
  }
  double evaluation_seconds = 0;
  for (const auto& r : results) evaluation_seconds += r.seconds;
  std::printf("training %.1f s, evaluation %.1f s\n", training_seconds, evaluation_seconds);

  // CSV, Markdown beside the paper's table, SVG of accuracy against n.
  const std::vector<std::pair<int, std::pair<double, double>>> paper{
      {16, {98.6, 98.6}},   {64, {94.3, 94.5}},   {128, {89.7, 89.9}},
      {256, {81.3, 82.1}},  {512, {70.1, 72.5}},  {1024, {53.8, 57.7}},
      {2048, {35.7, 39.4}}, {4096, {22.6, 24.9}}, {16384, {12.4, 14.0}}};
  std::ofstream csv(out + "/max_retrieval.csv");
  csv << "n,plain_mean,adaptive_mean,p_value,mean_spread,mean_largest_coefficient,tight_bound_at_mean_spread,"
         "lemma_bound_at_mean_spread,worst_coefficient_over_lemma,folding_difference,seconds\n";
  std::ofstream markdown(out + "/max_retrieval.md");
  markdown << "| n | plain (ours) | adaptive (ours) | p (paired t) | plain (paper) | adaptive (paper) |\n"
              "|---:|---:|---:|---:|---:|---:|\n";
  sharpcheck::io::Chart chart{"Max retrieval: accuracy against set size (trained at 16)",
                              "items n",
                              "accuracy (%)",
                              true,
                              false,
                              {},
                              {}};
  sharpcheck::io::Series ours_plain{"plain softmax (ours)", {}, {}, "#1f77b4", false, true};
  sharpcheck::io::Series ours_adaptive{"adaptive temperature (ours)", {}, {}, "#ff7f0e", false, true};
  sharpcheck::io::Series paper_plain{"plain (paper)", {}, {}, "#1f77b4", true, true};
  sharpcheck::io::Series paper_adaptive{"adaptive (paper)", {}, {}, "#ff7f0e", true, true};
  for (const auto& r : results) {
    const double plain = 100 * std::accumulate(r.plain.begin(), r.plain.end(), 0.0) / evaluation_seeds;
    const double adaptive =
        100 * std::accumulate(r.adaptive.begin(), r.adaptive.end(), 0.0) / evaluation_seeds;
    const double p = paired_t_test(r.plain, r.adaptive);
    csv << r.n << "," << plain << "," << adaptive << "," << p << "," << r.mean_spread << "," << r.mean_largest
        << "," << r.tight_at_mean << "," << r.lemma_at_mean << "," << r.worst_lemma_ratio << ","
        << r.folding_difference << "," << r.seconds << "\n";
    ours_plain.x.push_back(r.n);
    ours_plain.y.push_back(plain);
    ours_adaptive.x.push_back(r.n);
    ours_adaptive.y.push_back(adaptive);
    std::string paper_cells = "| - | - |";
    for (const auto& [size, figures] : paper) {
      if (size != r.n) continue;
      char text[64];
      std::snprintf(text, sizeof text, "| %.1f | %.1f |", figures.first, figures.second);
      paper_cells = text;
    }
    char p_text[32] = "n/a";
    if (!std::isnan(p)) std::snprintf(p_text, sizeof p_text, "%.3g", p);
    char row[160];
    std::snprintf(row, sizeof row, "| %d | %.1f | %.1f | %s %s\n", r.n, plain, adaptive, p_text,
                  paper_cells.c_str());
    markdown << row;
  }
  for (const auto& [size, figures] : paper) {
    if (size > max_size) continue;
    paper_plain.x.push_back(size);
    paper_plain.y.push_back(figures.first);
    paper_adaptive.x.push_back(size);
    paper_adaptive.y.push_back(figures.second);
  }
  chart.series = {ours_plain, ours_adaptive, paper_plain, paper_adaptive};
  std::ofstream(out + "/max_retrieval.svg") << sharpcheck::io::render_svg(chart);
  std::printf("written to %s: max_retrieval.csv, max_retrieval.md, max_retrieval.svg\n", out.c_str());
  if (!check) return 0;
  // The run's own numbers: chance is 1/10; the fp32 softmax may exceed the exact bound by rounding
  // only (relative 1e-5 is far above fp32's error for these rows).
  const auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  };
  bool ok = true;
  if (!(mean(results.front().plain) > 0.5)) {
    std::printf("CHECK FAILED: accuracy at n = 16 is %.3f, not well above chance (0.1)\n",
                mean(results.front().plain));
    ok = false;
  }
  if (!(mean(results.back().plain) < mean(results.front().plain))) {
    std::printf("CHECK FAILED: accuracy does not fall from n = 16 to n = %d\n", results.back().n);
    ok = false;
  }
  for (const auto& r : results) {
    if (r.worst_lemma_ratio > 1 + 1e-5) {
      std::printf("CHECK FAILED: at n = %d a coefficient is %.6g times Lemma 2.1's bound\n", r.n,
                  r.worst_lemma_ratio);
      ok = false;
    }
    // A dot product of length 128 in fp32 errs by at most about 128 u = 7.6e-6 of its scale per
    // order of summation; a wrong fold (transpose, bias) errs by O(1).
    if (!(r.folding_difference <= 1e-4)) {
      std::printf(
          "CHECK FAILED: at n = %d the folded head's logits differ from the model's by %.3g of their scale\n",
          r.n, r.folding_difference);
      ok = false;
    }
  }
  std::printf("%s\n", ok ? "check passed: learned, disperses with n, within Lemma 2.1, folded head = model"
                         : "check failed");
  return ok ? 0 : 1;
}
