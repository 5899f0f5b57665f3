#include <dlfcn.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>

#include "experiments/max_retrieval/max_retrieval.hpp"
#include "experiments/max_retrieval/operators.hpp"

namespace max_retrieval {
namespace {

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

}  // namespace

std::string configure_runtime(int threads) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen, also in a pipe
  const char* blas_note = keep_blas_single_threaded();
  // Activations of 1 to 8 MiB are above glibc's mmap threshold: each was mapped, page-faulted in and
  // unmapped again on every use, which took half the training step. Keeping them in the heap makes a
  // 300-step run 2.2x faster here (10.5 s against 4.8 s).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  torch::set_num_threads(threads);
  return std::string(blas_note) + "; " + std::to_string(torch::get_num_threads()) + " torch threads";
}

double train(Retriever& model, int steps, int seed) {
  return train_module(
      *model, [&](const torch::Tensor& items) { return model->forward(items); }, steps, seed);
}

double train(OperatorRetriever& model, int steps, int seed) {
  return train_module(
      *model, [&](const torch::Tensor& items) { return model->forward(items); }, steps, seed);
}

double train_module(torch::nn::Module& model,
                    const std::function<torch::Tensor(const torch::Tensor&)>& forward, int steps, int seed) {
  using Clock = std::chrono::steady_clock;
  // AdamW (decoupled weight decay): with Adam's L2 decay the query collapsed to 0 and the head stayed
  // uniform (loss ln 10 after 3,000 steps).
  torch::optim::AdamW optimiser(model.parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(1e-3));
  auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(seed));
  const auto start = Clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (int step = 1; step <= steps; ++step) {
    const Batch batch = make_batch(128, 16, generator);
    optimiser.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(forward(batch.items), batch.labels);
    loss.backward();
    optimiser.step();
    if (step % 1000 == 0 || step == steps)
      std::printf("step %d loss %.4f (%.0f s)\n", step, loss.item<double>(), seconds());
  }
  return seconds();
}

}  // namespace max_retrieval
