#include <cmath>

#include "experiments/max_retrieval/max_retrieval.hpp"

namespace max_retrieval {

torch::nn::Sequential deep_mlp(int in, int out) {
  return torch::nn::Sequential(
      torch::nn::Linear(in, width), torch::nn::GELU(), torch::nn::Linear(width, width), torch::nn::GELU(),
      torch::nn::Linear(width, width), torch::nn::GELU(), torch::nn::Linear(width, out));
}

RetrieverImpl::RetrieverImpl()
    : items(register_module("items", deep_mlp(1 + classes, width))),
      predictor(register_module("predictor", deep_mlp(width, classes))),
      key(register_module("key", torch::nn::Linear(width, width))),
      value(register_module("value", torch::nn::Linear(width, width))),
      query(register_parameter("query", torch::randn({width}) / std::sqrt(static_cast<double>(width)))) {}

std::pair<torch::Tensor, torch::Tensor> RetrieverImpl::logits_and_values(const torch::Tensor& batch_items) {
  const auto h = items->forward(batch_items);
  const auto k = key->forward(h);
  const auto logits = torch::matmul(k, query) / std::sqrt(static_cast<double>(width));
  return {logits, value->forward(h)};
}

torch::Tensor RetrieverImpl::forward(const torch::Tensor& batch_items) {
  auto [logits, values] = logits_and_values(batch_items);
  const auto weights = torch::softmax(logits, -1).unsqueeze(-1);
  return predictor->forward((weights * values).sum(1));
}

FoldedHead::FoldedHead(Retriever& model)
    : key_direction(torch::matmul(model->key->weight.t(), model->query) /
                    std::sqrt(static_cast<double>(width))),
      key_offset((model->key->bias * model->query).sum() / std::sqrt(static_cast<double>(width))) {}

torch::Tensor FoldedHead::logits(const torch::Tensor& hidden) const {
  return torch::matmul(hidden, key_direction) + key_offset;
}

}  // namespace max_retrieval
