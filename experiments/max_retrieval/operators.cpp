#include "experiments/max_retrieval/operators.hpp"

#include <cmath>

#include "experiments/max_retrieval/max_retrieval.hpp"

namespace max_retrieval {
namespace {

constexpr int selection_width = 16;  // the selection head's query and key width
constexpr int lambda_width = 16;     // Differential's lambda vectors
constexpr double training_size = 16;

torch::Tensor small_normal(std::initializer_list<int64_t> shape, double sigma) {
  return torch::randn(shape) * sigma;
}

// The paper's adaptive temperature (its published code; gradients flow through beta as there).
torch::Tensor adaptive_logits(const torch::Tensor& e) {
  const auto p = torch::softmax(e, -1);
  const auto entropy = -(p * torch::log(p + 1e-9)).sum(-1, true);
  const auto poly = (((-0.037 * entropy + 0.481) * entropy - 2.3) * entropy + 4.917) * entropy - 1.791;
  const auto beta = torch::where(entropy > 0.5, torch::clamp_min(poly, 1.0), torch::ones_like(poly));
  return beta * e;
}

// Stick-breaking in log space: log A_j = log sigmoid(e_j) + sum_{k > j} log sigmoid(-e_k); the
// last item is nearest the query and breaks the stick first.
torch::Tensor stick_breaking(const torch::Tensor& e) {
  const auto rest = torch::log_sigmoid(-e);
  const auto later = torch::flip(torch::cumsum(torch::flip(rest, {-1}), -1), {-1}) - rest;
  return torch::exp(torch::log_sigmoid(e) + later);
}

// Selective attention's penalty at the readout position, after all n items (Leviathan et al.
// 2024): S_ij = ReLU(a_i . b_j / sqrt(w)) for item i selecting an earlier item j, with the first
// column and the diagonal zeroed and the row shift (item i masks j from i + 1 on), so the readout
// sees F_j = sum_{i > j} S_ij for j >= 1 and F_0 = 0. This is the definition as written: a masked
// n x n matrix, used in training (n = 16, with gradients).
torch::Tensor selective_penalty_direct(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t n = a.size(1);
  const auto s =
      torch::relu(torch::bmm(a, b.transpose(1, 2)) / std::sqrt(static_cast<double>(selection_width)));
  const auto j = torch::arange(n, torch::kLong).view({1, 1, n}),
             i = torch::arange(n, torch::kLong).view({1, n, 1});
  return (s * ((j < i) & (j >= 1)).to(s.dtype())).sum(1);
}

// The same sum without gradients, in blocks of rows: only the lower triangle is formed (row block
// against the columns before it, then its own strictly lower triangle), so reading at n = 16,384
// costs n^2 w / 2 and never holds the n x n matrix. --check compares it with the direct form.
torch::Tensor selective_penalty_blocked(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t n = a.size(1);
  const double root = std::sqrt(static_cast<double>(selection_width));
  auto penalty = torch::zeros({a.size(0), n}, a.options());
  constexpr int64_t block = 1024;
  for (int64_t first = 0; first < n; first += block) {
    const int64_t count = std::min(block, n - first);
    const auto rows = a.narrow(1, first, count);
    if (first > 0) {
      penalty.narrow(1, 0, first)
          .add_(torch::relu(torch::bmm(rows, b.narrow(1, 0, first).transpose(1, 2))).sum(1) / root);
    }
    const auto own = torch::relu(torch::bmm(rows, b.narrow(1, first, count).transpose(1, 2))) *
                     torch::ones({count, count}, a.options()).tril(-1);  // j < i
    penalty.narrow(1, first, count).add_(own.sum(1) / root);
  }
  penalty.select(1, 0).zero_();
  return penalty;
}

torch::Tensor selective_penalty(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::GradMode::is_enabled() ? selective_penalty_direct(a, b) : selective_penalty_blocked(a, b);
}

// 1.5-entmax, the exact sort-based threshold of Peters, Niculae and Martins 2019 (Algorithm 2):
// p = [z/2 - tau]_+^2 with tau making sum p = 1. Autograd through the closed form is the exact
// gradient where the support is locally constant (everywhere but a null set).
torch::Tensor entmax15(const torch::Tensor& z) {
  auto x = z / 2;
  x = x - std::get<0>(x.max(-1, true));
  const auto sorted = std::get<0>(torch::sort(x, -1, true));
  const int64_t n = x.size(-1);
  const auto rho = torch::arange(1, n + 1, x.options());
  const auto mean = sorted.cumsum(-1) / rho;
  const auto mean_square = (sorted * sorted).cumsum(-1) / rho;
  const auto ss = rho * (mean_square - mean * mean);
  const auto delta = torch::clamp_min((1 - ss) / rho, 0.0);
  const auto tau = mean - torch::sqrt(delta);
  const auto support = (tau <= sorted).sum(-1, true);
  const auto tau_star = tau.gather(-1, support - 1);
  const auto y = torch::clamp_min(x - tau_star, 0.0);
  return y * y;
}

torch::Tensor rms_normalised(const torch::Tensor& x) {
  return x * torch::rsqrt((x * x).mean(-1, true) + 1e-6);
}

}  // namespace

std::string_view operator_name(Operator op) {
  switch (op) {
    case Operator::softmax:
      return "softmax";
    case Operator::adaptive:
      return "adaptive";
    case Operator::ssmax:
      return "ssmax";
    case Operator::length_scaled:
      return "length_scaled";
    case Operator::sigmoid:
      return "sigmoid";
    case Operator::stick_breaking:
      return "stick_breaking";
    case Operator::selective:
      return "selective";
    case Operator::differential:
      return "differential";
    case Operator::qk_norm:
      return "qk_norm";
    case Operator::softcap:
      return "softcap";
    case Operator::entmax15:
      return "entmax15";
  }
  return "?";
}

std::optional<Operator> parse_operator(std::string_view name) {
  for (const Operator op : all_operators) {
    if (operator_name(op) == name) return op;
  }
  return std::nullopt;
}

bool is_softmax_of_logits(Operator op) {
  switch (op) {
    case Operator::sigmoid:
    case Operator::stick_breaking:
    case Operator::differential:
    case Operator::entmax15:
      return false;
    default:
      return true;
  }
}

OperatorRetrieverImpl::OperatorRetrieverImpl(Operator chosen)
    : op(chosen),
      items(register_module("items", deep_mlp(1 + classes, width))),
      predictor(register_module("predictor", deep_mlp(width, classes))),
      key(register_module("key", torch::nn::Linear(width, width))),
      value(register_module("value", torch::nn::Linear(width, width))),
      query(register_parameter("query", torch::randn({width}) / std::sqrt(static_cast<double>(width)))) {
  if (op == Operator::ssmax)  // s ln(16) = 1 at the training length: training starts as softmax
    ssmax_s = register_parameter("ssmax_s", torch::full({1}, 1 / std::log(training_size)));
  if (op == Operator::differential) {
    key2 = register_module("key2", torch::nn::Linear(width, width));
    query2 = register_parameter("query2", torch::randn({width}) / std::sqrt(static_cast<double>(width)));
    lambda_q1 = register_parameter("lambda_q1", small_normal({lambda_width}, 0.1));
    lambda_k1 = register_parameter("lambda_k1", small_normal({lambda_width}, 0.1));
    lambda_q2 = register_parameter("lambda_q2", small_normal({lambda_width}, 0.1));
    lambda_k2 = register_parameter("lambda_k2", small_normal({lambda_width}, 0.1));
  }
  if (op == Operator::selective) {
    select_query = register_module("select_query", torch::nn::Linear(width, selection_width));
    select_key = register_module("select_key", torch::nn::Linear(width, selection_width));
  }
  if (op == Operator::qk_norm) {
    gain_q = register_parameter("gain_q", torch::ones({width}));
    gain_k = register_parameter("gain_k", torch::ones({width}));
  }
}

// q . (W h_i + b) / sqrt(width) for every item, folded (W^T q) . h_i + q . b: the same function
// with one product per item instead of width.
torch::Tensor OperatorRetrieverImpl::head_logits(const torch::Tensor& hidden, const torch::nn::Linear& keys,
                                                 const torch::Tensor& q) const {
  const double root = std::sqrt(static_cast<double>(width));
  return (torch::matmul(hidden, torch::matmul(keys->weight.t(), q)) + (keys->bias * q).sum()) / root;
}

HeadReading OperatorRetrieverImpl::read(const torch::Tensor& hidden) {
  const double n = static_cast<double>(hidden.size(1));
  if (op == Operator::qk_norm) {  // RMS norm needs every key: no folding
    const auto k = rms_normalised(key->forward(hidden)) * gain_k;
    const auto e = torch::matmul(k, rms_normalised(query) * gain_q) / std::sqrt(static_cast<double>(width));
    return {e, torch::softmax(e, -1)};
  }
  const auto e = head_logits(hidden, key, query);
  switch (op) {
    case Operator::adaptive: {
      const auto z = adaptive_logits(e);
      return {z, torch::softmax(z, -1)};
    }
    case Operator::ssmax: {
      const auto z = ssmax_s * std::log(n) * e;
      return {z, torch::softmax(z, -1)};
    }
    case Operator::length_scaled: {
      const auto z = std::max(1.0, std::log(n) / std::log(training_size)) * e;
      return {z, torch::softmax(z, -1)};
    }
    case Operator::sigmoid:
      return {e, torch::sigmoid(e - std::log(n))};
    case Operator::stick_breaking:
      return {e, stick_breaking(e)};
    case Operator::selective: {
      const auto z = e - selective_penalty(select_query->forward(hidden), select_key->forward(hidden));
      return {z, torch::softmax(z, -1)};
    }
    case Operator::differential: {
      const auto e2 = head_logits(hidden, key2, query2);
      const auto lambda = torch::exp((lambda_q1 * lambda_k1).sum()) -
                          torch::exp((lambda_q2 * lambda_k2).sum()) + differential_lambda_init;
      const auto spread = [](const torch::Tensor& x) {
        return std::get<0>(x.max(-1)) - std::get<0>(x.min(-1));
      };
      const auto wider = torch::where((spread(e) >= spread(e2)).unsqueeze(-1), e, e2);
      return {wider, torch::softmax(e, -1) - lambda * torch::softmax(e2, -1)};
    }
    case Operator::softcap: {
      const auto z = 50 * torch::tanh(e / 50);
      return {z, torch::softmax(z, -1)};
    }
    case Operator::entmax15:
      return {e, entmax15(e)};
    default:
      return {e, torch::softmax(e, -1)};
  }
}

// sum_i w_i (W_v h_i + b_v) = W_v (sum_i w_i h_i) + (sum_i w_i) b_v: exact whatever the weights sum
// to (sigmoid, stick-breaking and Differential do not sum to 1).
torch::Tensor OperatorRetrieverImpl::classify(const torch::Tensor& hidden, const torch::Tensor& weights) {
  const auto pooled_hidden = torch::bmm(weights.unsqueeze(1), hidden).squeeze(1);
  const auto mass = weights.sum(-1, true);
  auto pooled = value->forward(pooled_hidden) + (mass - 1) * value->bias;
  if (op == Operator::differential)  // the head's normalisation, then the fixed 1 - lambda_init
    pooled = rms_normalised(pooled) * (1 - differential_lambda_init);
  return predictor->forward(pooled);
}

torch::Tensor OperatorRetrieverImpl::forward(const torch::Tensor& batch_items) {
  const auto hidden = items->forward(batch_items);
  return classify(hidden, read(hidden).weights);
}

double spread_bound(OperatorRetriever& model) {
  if (model->op == Operator::softcap) return 100;
  if (model->op != Operator::qk_norm) return INFINITY;
  return 2 * std::sqrt(static_cast<double>(width)) * model->gain_q.abs().max().item<double>() *
         model->gain_k.abs().max().item<double>();
}

double selective_penalty_discrepancy() {
  const torch::NoGradGuard no_gradients;
  auto generator = at::detail::createCPUGenerator(7);
  const auto a = torch::randn({2, 2500, selection_width}, generator),
             b = torch::randn({2, 2500, selection_width}, generator);
  const auto direct = selective_penalty_direct(a, b), blocked = selective_penalty_blocked(a, b);
  return ((direct - blocked).abs().max() / direct.abs().max()).item<double>();
}

}  // namespace max_retrieval
