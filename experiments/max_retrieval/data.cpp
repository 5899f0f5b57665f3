#include "experiments/max_retrieval/max_retrieval.hpp"

namespace max_retrieval {

Batch make_batch(int batch, int n, torch::Generator& generator) {
  const auto priority = torch::rand({batch, n, 1}, generator);
  const auto item_class = torch::randint(0, classes, {batch, n}, generator);
  const auto one_hot = torch::one_hot(item_class, classes).to(torch::kFloat32);
  const auto top = priority.squeeze(-1).argmax(1);
  return {torch::cat({priority, one_hot}, -1), item_class.gather(1, top.unsqueeze(1)).squeeze(1)};
}

}  // namespace max_retrieval
