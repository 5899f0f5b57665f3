// The operation registry (ops/registry.hpp) as the front ends read it: every operation the docs
// promise is listed, every built-in kernel belongs to exactly one operation, the schema parser
// refuses what it must, and every operation's judge passes the correctly rounded result and fails
// a result one element of which is off by 1% (so no judge passes everything).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/random.hpp"
#include "gate/judge_backward_arrays.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/attention_escape_kernels.hpp"
#include "kernels/registry.hpp"
#include "kernels/softmax_backward.hpp"
#include "ops/attention_merge/merge_kernels.hpp"
#include "ops/paged_attention/paged_kernels.hpp"
#include "ops/registry.hpp"
#include "reference/attention.hpp"
#include "reference/attention_escapes.hpp"
#include "reference/dispersion_escapes.hpp"
#include "reference/softmax.hpp"
#include "reference/softmax_backward.hpp"

namespace sharpcheck {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

using gate::MemoryArray;

const gate::Operation& op(std::string_view name) { return gate::find_operation(ops::all_operations(), name); }

Matrix normal(std::size_t rows, std::size_t cols, std::uint64_t seed, const FloatFormat& format = fp32) {
  DeterministicRandom random(seed);
  Matrix m(rows, cols);
  for (double& x : m.values) x = round_to_format(random.normal(0, 1), format);
  return m;
}

MemoryArray array_of(const std::string& name, const Matrix& m) {
  return MemoryArray(name, {m.rows, m.cols}, m.values);
}

// The same array with element `index` moved by 1% (rounded to the format: still a value of it).
MemoryArray off_by_a_percent(const MemoryArray& array, std::size_t index, const FloatFormat& format = fp32) {
  std::vector<double> values = array.values();
  values[index] = round_to_format(values[index] * 1.01 + (values[index] == 0 ? 1e-3 : 0), format);
  return MemoryArray(array.name(), array.shape(), values);
}

// Judges `call` twice: as given (must pass), and with the judged tensor `judged` replaced by
// `wrong` (must fail).
void expect_pass_then_fail(const gate::Operation& operation, gate::OpCall call, const std::string& judged,
                           const MemoryArray& wrong) {
  const gate::CaseOutcome right = operation.judge(call);
  EXPECT_TRUE(right.passed()) << operation.name << ": " << (right.failures.empty() ? "" : right.failures[0]);
  call.tensors[judged] = &wrong;
  const gate::CaseOutcome broken = operation.judge(call);
  EXPECT_FALSE(broken.passed()) << operation.name << " passed a result off by 1%";
  EXPECT_EQ(broken.worst_array, judged) << operation.name;
}

TEST(Operations, TheRegistryListsEveryOperationTheDocsPromiseOnce) {
  std::set<std::string> names;
  for (const gate::Operation* operation : ops::all_operations()) {
    EXPECT_TRUE(names.insert(std::string(operation->name)).second) << operation->name << " listed twice";
    EXPECT_NE(operation->judge, nullptr) << operation->name << " cannot be judged from arrays";
    std::set<std::string_view> keys;
    for (const auto& tensor : operation->tensors) EXPECT_TRUE(keys.insert(tensor.name).second) << tensor.name;
    for (const auto& option : operation->options) EXPECT_TRUE(keys.insert(option.name).second) << option.name;
    for (const auto& option : gate::common_options())
      EXPECT_TRUE(keys.insert(option.name).second) << option.name;
  }
  for (const char* promised : {"softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
                               "attention", "attention_backward", "linear_attention", "selective_attention",
                               "differential_attention", "adaptive_temperature", "scalable_softmax",
                               "length_scaled_softmax", "sigmoid_attention", "stick_breaking_attention"})
    EXPECT_TRUE(names.contains(promised)) << promised;
}

// A kernel no operation lists would never be swept by the gate: every registry row is in exactly one.
TEST(Operations, EveryBuiltInKernelBelongsToExactlyOneOperation) {
  std::multiset<std::string> listed;
  for (const gate::Operation* operation : ops::all_operations()) {
    for (const auto& row : operation->kernels()) listed.insert(std::string(row.name));
  }
  std::vector<std::string> registered;
  for (const auto& k : kernels::softmax_kernels()) registered.emplace_back(k.name);
  for (const auto& k : kernels::attention_kernels()) registered.emplace_back(k.name);
  for (const auto& k : kernels::softmax_backward_kernels()) registered.emplace_back(k.name);
  for (const auto& k : kernels::attention_escape_kernels()) registered.emplace_back(k.name);
  for (const auto& k : kernels::attention_backward_kernels()) registered.emplace_back(k.name);
  for (const auto& k : ops::paged::kernels()) registered.emplace_back(k.name);  // an operation's own folder
  for (const auto& k : ops::merge::kernels()) registered.emplace_back(k.name);
  EXPECT_EQ(listed.size(), registered.size());
  for (const auto& name : registered) EXPECT_EQ(listed.count(name), 1U) << name;
}

TEST(Operations, TheSchemaRefusesUnknownRepeatedMissingAndIllFormedArguments) {
  const auto refused = [](std::string_view name, const Pairs& pairs, const std::string& says) {
    try {
      (void)gate::parse_op_arguments(op(name), pairs);
      ADD_FAILURE() << "accepted " << pairs.back().first << "=" << pairs.back().second;
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(says), std::string::npos) << error.what();
    }
  };
  const Pairs softmax{{"logits", "x"}, {"probs", "y"}};
  auto with = [](Pairs pairs, std::string key, std::string value) {
    pairs.emplace_back(std::move(key), std::move(value));
    return pairs;
  };
  refused("softmax", with(softmax, "colour", "red"), "softmax: colour is neither a tensor nor an option");
  refused("softmax", with(softmax, "logits", "z"), "logits is given twice");
  refused("softmax", {{"logits", "x"}}, "the tensor 'probs'");
  refused("softmax", with(softmax, "dim", "1.5"), "dim wants an integer");
  refused("softmax", with(softmax, "theta", "nan"), "theta wants a finite real");
  refused("softmax", with(softmax, "proven_only", "maybe"), "is a flag");
  refused("softmax", with(softmax, "format", "fp12"), "fp12");
  refused("attention", {{"q", "q"}, {"k", "k"}, {"v", "v"}, {"out", "o"}, {"key_lengths", "3,-1"}}, "counts");
  refused("attention", {{"q", "q"}, {"k", "k"}, {"v", "v"}, {"out", "o"}, {"align", "middle"}},
          "align must be");
  refused("linear_attention", {{"q", "q"}, {"k", "k"}, {"v", "v"}, {"out", "o"}, {"lambda", "1"}}, "lambda");
  // The backward's judge reads no log-sum-exp option: taking one would ignore it silently.
  refused("attention_backward",
          {{"q", "q"},
           {"k", "k"},
           {"v", "v"},
           {"d_out", "o"},
           {"dq", "a"},
           {"dk", "b"},
           {"dv", "c"},
           {"lse_base2", "true"}},
          "lse_base2 is neither a tensor nor an option");
}

TEST(Operations, TheSchemaAppliesEachOptionToTheJudgesOptions) {
  const auto parsed = gate::parse_op_arguments(op("attention"), {{"q", "a"},
                                                                 {"k", "b"},
                                                                 {"v", "c"},
                                                                 {"out", "d"},
                                                                 {"causal", "true"},
                                                                 {"align", "bottom-right"},
                                                                 {"window", "4,-1"},
                                                                 {"scale", "0x1p-3"},
                                                                 {"key_lengths", "3,5"},
                                                                 {"format", "bf16"},
                                                                 {"proven_only", "1"}});
  const auto& judge = parsed.options.judge;
  EXPECT_TRUE(judge.scores.causal);
  EXPECT_EQ(judge.scores.alignment, tensor::DiagonalAlignment::bottom_right);
  EXPECT_EQ(judge.scores.window_left, std::optional<std::size_t>(4));
  EXPECT_EQ(judge.scores.window_right, std::nullopt);
  EXPECT_EQ(judge.scores.scale, 0.125);
  EXPECT_EQ(judge.key_lengths, (std::vector<std::size_t>{3, 5}));
  EXPECT_EQ(judge.format, "bf16");
  EXPECT_EQ(judge.strictest, metrics::Tier::proven);
  EXPECT_EQ(parsed.tensors.at("out"), "d");
  EXPECT_EQ(
      gate::parse_op_arguments(op("differential_attention"),
                               {{"logits", "a"}, {"logits2", "b"}, {"weights", "c"}, {"lambda", "0.25"}})
          .options.lambda,
      0.25);
}

TEST(Operations, RowOperationsPassTheReferenceAndFailOneElementOffByAPercent) {
  const Matrix logits = normal(3, 40, 11);
  const MemoryArray x = array_of("logits", logits);
  for (const char* name : {"softmax", "log_softmax", "scalable_softmax", "sigmoid_attention"}) {
    Matrix expected(3, 40);
    for (std::size_t r = 0; r < 3; ++r) {
      const auto row = std::string(name) == "softmax"       ? reference::softmax(logits.row(r), fp32)
                       : std::string(name) == "log_softmax" ? reference::log_softmax(logits.row(r), fp32)
                       : std::string(name) == "scalable_softmax"
                           ? reference::scalable_softmax(logits.row(r), fp32)
                           : reference::sigmoid_attention_weights(logits.row(r), fp32);
      std::copy(row.begin(), row.end(), expected.row(r).begin());
    }
    const std::string judged(op(name).tensors[1].name);
    const MemoryArray got = array_of(judged, expected);
    gate::OpCall call;
    call.tensors = {{"logits", &x}, {judged, &got}};
    expect_pass_then_fail(op(name), call, judged, off_by_a_percent(got, 45));
  }
}

TEST(Operations, SoftmaxBackwardOperationsPassTheReferenceAndFailOneElementOffByAPercent) {
  const Matrix logits = normal(2, 30, 12), dy = normal(2, 30, 13);
  const MemoryArray x = array_of("logits", logits), g = array_of("dy", dy);
  for (const bool log : {false, true}) {
    Matrix expected(2, 30);
    for (std::size_t r = 0; r < 2; ++r) {
      const auto row = log ? reference::log_softmax_backward(logits.row(r), dy.row(r), fp32)
                           : reference::softmax_backward(logits.row(r), dy.row(r), fp32);
      std::copy(row.begin(), row.end(), expected.row(r).begin());
    }
    const MemoryArray dx = array_of("dx", expected);
    gate::OpCall call;
    call.tensors = {{"logits", &x}, {"dy", &g}, {"dx", &dx}};
    expect_pass_then_fail(op(log ? "log_softmax_backward" : "softmax_backward"), call, "dx",
                          off_by_a_percent(dx, 31));
  }
}

TEST(Operations, AttentionPassesTheReferenceAndFailsOneElementOffByAPercent) {
  const Matrix q = normal(5, 8, 21), k = normal(9, 8, 22), v = normal(9, 4, 23);
  reference::AttentionOptions options;
  options.scores.causal = true;
  const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v);
  const MemoryArray out = array_of("out", reference::attention(q, k, v, fp32, options).output);
  gate::OpCall call;
  call.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"out", &out}};
  call.options = gate::parse_op_arguments(op("attention"),
                                          {{"q", ""}, {"k", ""}, {"v", ""}, {"out", ""}, {"causal", "true"}})
                     .options;
  expect_pass_then_fail(op("attention"), call, "out", off_by_a_percent(out, 9));
}

TEST(Operations, AttentionBackwardPassesTheReferenceAndFailsOneElementOffByAPercent) {
  const Matrix q = normal(6, 8, 31), k = normal(7, 8, 32), v = normal(7, 8, 33), d_out = normal(6, 8, 34);
  const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v),
                    da = array_of("d_out", d_out);
  gate::BackwardArrays arrays;
  arrays.q = &qa;
  arrays.k = &ka;
  arrays.v = &va;
  arrays.d_out = &da;
  const gate::BackwardGradients exact = gate::attention_backward_of_arrays({}, arrays);
  const MemoryArray dq("dq", {6, 8}, exact.dq), dk("dk", {7, 8}, exact.dk), dv("dv", {7, 8}, exact.dv);
  gate::OpCall call;
  call.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"d_out", &da}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  expect_pass_then_fail(op("attention_backward"), call, "dk", off_by_a_percent(dk, 20));
}

// The backward's geometry at the same extremes: q . k near 2^1026 at theta 2^1021.
TEST(Operations, AttentionBackwardBeyondDoublesRangeStillDiscriminates) {
  Matrix q = normal(4, 4, 35, fp64), k = normal(5, 4, 36, fp64);
  const Matrix v = normal(5, 4, 37, fp64), d_out = normal(4, 4, 38, fp64);
  for (double& x : q.values) x = std::ldexp(x, 513);
  for (double& x : k.values) x = std::ldexp(x, 513);
  const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v),
                    da = array_of("d_out", d_out);
  gate::BackwardArrays arrays;
  arrays.q = &qa;
  arrays.k = &ka;
  arrays.v = &va;
  arrays.d_out = &da;
  gate::JudgeOptions options;
  options.format = "fp64";
  options.theta = options.scores.theta = 0x1p1021;
  options.scores.scale = 1.0;
  const gate::BackwardGradients exact = gate::attention_backward_of_arrays(options, arrays);
  const MemoryArray dq("dq", {4, 4}, exact.dq), dk("dk", {5, 4}, exact.dk), dv("dv", {5, 4}, exact.dv);
  gate::OpCall call;
  call.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"d_out", &da}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  call.options.judge = options;
  EXPECT_FALSE(op("attention_backward").judge(call).inconclusive());
  expect_pass_then_fail(op("attention_backward"), call, "dv", off_by_a_percent(dv, 6, fp64));
}

TEST(Operations, MatrixEscapesPassTheReferenceAndFailOneElementOffByAPercent) {
  const Matrix q = normal(5, 6, 41), k = normal(8, 6, 42), v = normal(8, 3, 43);
  const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v);
  const MemoryArray out = array_of("out", reference::linear_attention(q, k, v, false, fp32).outputs);
  gate::OpCall linear;
  linear.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"out", &out}};
  expect_pass_then_fail(op("linear_attention"), linear, "out", off_by_a_percent(out, 7));

  const Matrix first = normal(6, 6, 44), second = normal(6, 6, 45);
  const MemoryArray la = array_of("logits", first), lb = array_of("logits2", second);
  const MemoryArray weights =
      array_of("weights", reference::differential_attention_weights(first, second, 0.5, fp32));
  gate::OpCall differential;
  differential.tensors = {{"logits", &la}, {"logits2", &lb}, {"weights", &weights}};
  differential.options.lambda = 0.5;
  expect_pass_then_fail(op("differential_attention"), differential, "weights", off_by_a_percent(weights, 8));

  const MemoryArray selection = array_of("selection", second);
  const MemoryArray selected =
      array_of("weights", reference::selective_attention_weights(first, second, fp32));
  gate::OpCall selective;
  selective.tensors = {{"logits", &la}, {"selection", &selection}, {"weights", &selected}};
  expect_pass_then_fail(op("selective_attention"), selective, "weights", off_by_a_percent(selected, 13));
}

TEST(Operations, AGateWithNoOperationsPlansNothingAndSaysSo) {
  gate::GateSettings settings;
  EXPECT_THROW((void)gate::plan_cases(settings), InputError);
  settings.operations = ops::all_operations();
  settings.sizes = {16};
  for (const auto& c : gate::plan_cases(settings))
    EXPECT_NO_THROW((void)gate::find_operation(settings.operations, c.operation)) << c.id();
}

}  // namespace
}  // namespace sharpcheck

namespace sharpcheck {
namespace {

// A masked column written as masked_fill(-1e9) is negligible, not a spread of 1e9 that would widen
// every allowance until zeros pass (softmax backward, the row escapes, Differential attention).
TEST(Operations, AMinusOneE9ColumnDoesNotLetZerosPass) {
  Matrix logits = normal(4, 33, 51), dy = normal(4, 33, 52);
  for (std::size_t r = 0; r < 4; ++r) logits(r, 0) = -1e9;
  const MemoryArray x = array_of("logits", logits), g = array_of("dy", dy);
  Matrix exact(4, 33), weights(4, 33);
  for (std::size_t r = 0; r < 4; ++r) {
    const auto dx = reference::softmax_backward(logits.row(r), dy.row(r), fp32);
    const auto w = reference::scalable_softmax(logits.row(r), fp32);
    std::copy(dx.begin(), dx.end(), exact.row(r).begin());
    std::copy(w.begin(), w.end(), weights.row(r).begin());
  }
  const MemoryArray dx = array_of("dx", exact), zeros("dx", {4, 33}, std::vector<double>(4 * 33, 0.0));
  gate::OpCall backward;
  backward.tensors = {{"logits", &x}, {"dy", &g}, {"dx", &dx}};
  expect_pass_then_fail(op("softmax_backward"), backward, "dx", zeros);
  const MemoryArray w = array_of("weights", weights),
                    zero_weights("weights", {4, 33}, std::vector<double>(4 * 33));
  gate::OpCall scalable;
  scalable.tensors = {{"logits", &x}, {"weights", &w}};
  expect_pass_then_fail(op("scalable_softmax"), scalable, "weights", zero_weights);

  Matrix first = normal(6, 20, 53), second = normal(6, 20, 54);
  for (std::size_t r = 0; r < 6; ++r) first(r, 19) = second(r, 19) = -1e9;
  const MemoryArray la = array_of("logits", first), lb = array_of("logits2", second);
  const MemoryArray dw =
      array_of("weights", reference::differential_attention_weights(first, second, 0.5, fp32));
  gate::OpCall differential;
  differential.tensors = {{"logits", &la}, {"logits2", &lb}, {"weights", &dw}};
  differential.options.lambda = 0.5;
  expect_pass_then_fail(op("differential_attention"), differential, "weights",
                        MemoryArray("weights", {6, 20}, std::vector<double>(6 * 20)));
}

// Scores that overflow double (scale 1e308) give NaN weights: the judge must finish (it once spun
// grouping equal weights, NaN never equal to itself) and not pass.
TEST(Operations, ScoresThatOverflowDoubleFinishAndDoNotPass) {
  const Matrix q = normal(4, 8, 61), k = normal(6, 8, 62), v = normal(6, 8, 63);
  const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v),
                    out("out", {4, 8}, std::vector<double>(32, 0.0));
  gate::OpCall call;
  call.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"out", &out}};
  call.options.judge.scores.scale = 1e308;
  const gate::CaseOutcome outcome = op("attention").judge(call);
  EXPECT_FALSE(outcome.passed() && !outcome.inconclusive()) << "zeros passed at scale 1e308";
}

// Dot products beyond double's range, whose logits (over theta) are ordinary: q . k near 2^1026
// at theta 2^1021, and near 2^-1076 (every product underflows double) at theta 2^-1074. The
// allowance used to be NaN (d |q.k| overflowed before the division by theta) or built on zero
// logits, so every output was inconclusive, twice the exact one included; now the exact output
// passes and one off by a percent fails.
TEST(Operations, DotProductsBeyondDoublesRangeStillDiscriminate) {
  for (const int exponent : {513, -538}) {
    Matrix q = normal(3, 4, 64, fp64), k = normal(5, 4, 65, fp64);
    const Matrix v = normal(5, 2, 66, fp64);
    for (double& x : q.values) x = std::ldexp(x, exponent);
    for (double& x : k.values) x = std::ldexp(x, exponent);
    reference::AttentionOptions options;
    options.scores.scale = 1.0;
    options.scores.theta = exponent > 0 ? 0x1p1021 : 0x1p-1074;
    const MemoryArray qa = array_of("q", q), ka = array_of("k", k), va = array_of("v", v);
    const MemoryArray out = array_of("out", reference::attention(q, k, v, fp64, options).output);
    gate::OpCall call;
    call.tensors = {{"q", &qa}, {"k", &ka}, {"v", &va}, {"out", &out}};
    call.options.judge.scores = options.scores;
    call.options.judge.theta = options.scores.theta;
    call.options.judge.format = "fp64";
    const gate::CaseOutcome exact = op("attention").judge(call);
    EXPECT_FALSE(exact.inconclusive()) << exponent;
    expect_pass_then_fail(op("attention"), call, "out", off_by_a_percent(out, 3, fp64));
  }
}

}  // namespace
}  // namespace sharpcheck

namespace sharpcheck {
namespace {

// Selective attention with a -1e9 additive mask: its argument error u 1e9 once became every
// element's allowance, and weights 1.5 times too large passed.
TEST(Operations, SelectiveAttentionWithAMinusOneE9MaskFailsWeightsOffByHalf) {
  Matrix logits = normal(8, 8, 71), selection(8, 8);
  for (std::size_t r = 1; r < 8; ++r) logits(r, 0) = -1e9;
  const MemoryArray la = array_of("logits", logits), sa = array_of("selection", selection);
  const MemoryArray exact =
      array_of("weights", reference::selective_attention_weights(logits, selection, fp32));
  std::vector<double> scaled = exact.values();
  for (std::size_t x = 8; x < scaled.size(); ++x) scaled[x] = round_to_format(scaled[x] * 1.5, fp32);
  gate::OpCall call;
  call.tensors = {{"logits", &la}, {"selection", &sa}, {"weights", &exact}};
  expect_pass_then_fail(op("selective_attention"), call, "weights", MemoryArray("weights", {8, 8}, scaled));
}

}  // namespace
}  // namespace sharpcheck
