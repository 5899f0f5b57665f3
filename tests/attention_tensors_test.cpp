// The attention reference with every mask and score modifier, and over batched multi-head
// tensors, against an independent 320-bit cpp_bin_float computation written from the
// definitions (FlashAttention's window and alignment conventions, ALiBi, additive bias, soft-cap
// with Boost's tanh, sinks), plus the structural identities: GQA equals repeated KV bit for bit,
// bottom-right equals top-left on square problems and differs on 113 x 203, packed equals padded,
// bshd equals bhsd.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "reference/attention.hpp"
#include "support/independent_reference.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck {
namespace {

using testing::Exact;
using testing::is_nearest_in_format;

Matrix random_matrix(std::size_t rows, std::size_t cols, DeterministicRandom& random, double sigma) {
  Matrix matrix(rows, cols);
  for (double& x : matrix.values) x = static_cast<float>(random.normal(0, sigma));
  return matrix;
}

// The modifiers one independent row is computed under, stated from scratch (not via HeadScores).
struct Modifiers {
  bool causal = false;
  bool bottom_right = false;
  std::optional<long> left = std::nullopt;
  std::optional<long> right = std::nullopt;
  double softcap = 0;
  double alibi = 0;
  std::optional<double> sink = std::nullopt;
  double theta = 1;
  const Matrix* bias = nullptr;  // queries x keys; -inf masks
};

struct IndependentRow {
  std::vector<Exact> weights;
  std::vector<Exact> output;
  Exact lse = 0;
  bool empty = true;
};

IndependentRow independent_row(const Matrix& q, const Matrix& k, const Matrix& v, std::size_t i,
                               const Modifiers& m) {
  const long offset = m.bottom_right ? static_cast<long>(k.rows) - static_cast<long>(q.rows) : 0;
  const long aligned = static_cast<long>(i) + offset;
  const Exact scale = 1 / sqrt(Exact(q.cols));
  std::vector<std::optional<Exact>> logits(k.rows);
  for (std::size_t j = 0; j < k.rows; ++j) {
    const long jj = static_cast<long>(j);
    if (m.causal && jj > aligned) continue;
    if (m.left && jj < aligned - *m.left) continue;
    if (m.right && jj > aligned + *m.right) continue;
    if (m.bias != nullptr && std::isinf((*m.bias)(i, j))) continue;
    Exact s = 0;
    for (std::size_t t = 0; t < q.cols; ++t) s += Exact(q(i, t)) * Exact(k(j, t));
    s *= scale;
    if (m.softcap != 0) s = Exact(m.softcap) * tanh(s / Exact(m.softcap));
    s -= Exact(m.alibi) * Exact(std::labs(aligned - jj));
    if (m.bias != nullptr) s += Exact((*m.bias)(i, j));
    logits[j] = s / Exact(m.theta);
  }
  IndependentRow row{std::vector<Exact>(k.rows, Exact(0)), std::vector<Exact>(v.cols, Exact(0))};
  Exact sum = m.sink ? exp(Exact(*m.sink) / Exact(m.theta)) : Exact(0);
  for (std::size_t j = 0; j < k.rows; ++j) {
    if (!logits[j]) continue;
    row.weights[j] = exp(*logits[j]);
    sum += row.weights[j];
  }
  if (sum == 0) return row;
  row.empty = false;
  row.lse = log(sum);
  for (std::size_t j = 0; j < k.rows; ++j) {
    row.weights[j] /= sum;
    for (std::size_t c = 0; c < v.cols; ++c) row.output[c] += row.weights[j] * Exact(v(j, c));
  }
  return row;
}

tensor::HeadScores scores_of(const Modifiers& m, const Matrix& q, const Matrix& k) {
  tensor::HeadScores scores;
  scores.queries = q.rows;
  scores.keys = k.rows;
  scores.row_stride = k.rows;
  scores.causal = m.causal;
  scores.alignment =
      m.bottom_right ? tensor::DiagonalAlignment::bottom_right : tensor::DiagonalAlignment::top_left;
  if (m.left) scores.window_left = static_cast<std::size_t>(*m.left);
  if (m.right) scores.window_right = static_cast<std::size_t>(*m.right);
  scores.softcap = m.softcap;
  scores.alibi_slope = m.alibi;
  scores.sink = m.sink;
  scores.theta = m.theta;
  if (m.bias != nullptr) scores.bias = m.bias->values;
  scores.fully_masked = tensor::FullyMaskedRows::zeros;
  return scores;
}

void expect_matches_independent(const Matrix& q, const Matrix& k, const Matrix& v, const Modifiers& m,
                                const FloatFormat& format, const std::string& label) {
  reference::AttentionOptions options;
  options.scores = scores_of(m, q, k);
  options.return_weights = true;
  options.return_lse = true;
  const auto result = reference::attention(q, k, v, format, options);
  options.mpfr_only = true;
  const auto by_mpfr_alone = reference::attention(q, k, v, format, options);
  ASSERT_EQ(by_mpfr_alone.output.values, result.output.values) << label;
  ASSERT_EQ(by_mpfr_alone.lse, result.lse) << label;
  for (std::size_t i = 0; i < q.rows; ++i) {
    const IndependentRow expected = independent_row(q, k, v, i, m);
    if (expected.empty) {
      EXPECT_EQ(result.lse[i], -INFINITY) << label << " row " << i;
      for (std::size_t c = 0; c < v.cols; ++c) EXPECT_EQ(result.output(i, c), 0.0) << label;
      continue;
    }
    for (std::size_t c = 0; c < v.cols; ++c)
      ASSERT_TRUE(is_nearest_in_format(result.output(i, c), expected.output[c], format))
          << label << " row " << i;
    for (std::size_t j = 0; j < k.rows; ++j)
      ASSERT_TRUE(is_nearest_in_format(result.weights->operator()(i, j), expected.weights[j], format))
          << label;
    ASSERT_TRUE(is_nearest_in_format(result.lse[i], expected.lse, format)) << label << " lse row " << i;
  }
}

class EveryModifier : public ::testing::TestWithParam<const FloatFormat*> {};

TEST_P(EveryModifier, AgreesWithTheIndependentBackend) {
  const FloatFormat& format = *GetParam();
  DeterministicRandom random(23);
  const Matrix q = random_matrix(7, 16, random, 1.5);
  const Matrix k = random_matrix(11, 16, random, 1.5);
  const Matrix v = random_matrix(11, 3, random, 2.0);
  Matrix bias(7, 11);
  for (double& b : bias.values)
    b = random.below(5) == 0 ? -INFINITY : static_cast<float>(random.normal(0, 1));
  std::vector<std::pair<std::string, Modifiers>> cases;
  cases.push_back({"causal top-left", {.causal = true}});
  cases.push_back({"causal bottom-right", {.causal = true, .bottom_right = true}});
  cases.push_back({"window (2, 1)", {.left = 2, .right = 1}});
  cases.push_back({"window (3, 0) bottom-right", {.bottom_right = true, .left = 3, .right = 0}});
  cases.push_back({"soft-cap 2", {.softcap = 2.0}});
  cases.push_back({"soft-cap 50, theta -0.75", {.softcap = 50.0, .theta = -0.75}});
  cases.push_back({"ALiBi 0.25", {.alibi = 0.25}});
  cases.push_back(
      {"ALiBi 0.0625 causal bottom-right", {.causal = true, .bottom_right = true, .alibi = 0.0625}});
  cases.push_back({"sink 1.5", {.sink = 1.5}});
  cases.push_back({"sink -3 causal", {.causal = true, .sink = -3.0}});
  cases.push_back({"additive bias with -inf", {.bias = &bias}});
  cases.push_back({"everything",
                   {.causal = true,
                    .bottom_right = true,
                    .left = 4,
                    .softcap = 5.0,
                    .alibi = 0.125,
                    .sink = 0.5,
                    .theta = 1.25,
                    .bias = &bias}});
  for (const auto& [label, modifiers] : cases) expect_matches_independent(q, k, v, modifiers, format, label);
}

const auto format_name = [](const auto& info) { return std::string(info.param->name); };
INSTANTIATE_TEST_SUITE_P(Reference, EveryModifier, ::testing::Values(&fp64, &fp32, &bf16, &fp16, &fp8_e4m3),
                         format_name);

// Mutation check of the independent backend: a wrong alignment, a forgotten cap, a skipped sink
// each give results the reference does not match.
TEST(EveryModifier, TheComparisonDiscriminates) {
  DeterministicRandom random(29);
  const Matrix q = random_matrix(5, 16, random, 1.5);
  const Matrix k = random_matrix(9, 16, random, 1.5);
  const Matrix v = random_matrix(9, 2, random, 2.0);
  const auto differs = [&](const Modifiers& judged, const Modifiers& computed) {
    reference::AttentionOptions options;
    options.scores = scores_of(computed, q, k);
    const auto result = reference::attention(q, k, v, fp32, options);
    for (std::size_t i = 0; i < q.rows; ++i) {
      const IndependentRow expected = independent_row(q, k, v, i, judged);
      for (std::size_t c = 0; c < v.cols; ++c) {
        if (!is_nearest_in_format(result.output(i, c), expected.output[c], fp32)) return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(differs({.causal = true, .bottom_right = true}, {.causal = true}));
  EXPECT_TRUE(differs({.softcap = 1.0}, {}));
  EXPECT_TRUE(differs({.sink = 0.0}, {}));
  EXPECT_TRUE(differs({.alibi = 0.5}, {}));
  EXPECT_TRUE(differs({.left = 1}, {}));
}

// All logits 0 (K = 0) and a sink of 0: each of n keys has weight exactly 1/(n + 1), the output
// is sum_j v_j / (n + 1) and the log-sum-exp ln(n + 1): closed forms on representable inputs.
TEST(Sinks, MatchTheirClosedForm) {
  const std::size_t n = 6;
  const Matrix q(2, 4, 1.0);
  const Matrix k(n, 4, 0.0);
  Matrix v(n, 1);
  for (std::size_t j = 0; j < n; ++j) v(j, 0) = static_cast<double>(j + 1);  // sum 21
  reference::AttentionOptions options;
  options.scores.sink = 0.0;
  options.return_weights = true;
  options.return_lse = true;
  for (const FloatFormat* format : {&fp32, &bf16}) {
    const auto result = reference::attention(q, k, v, *format, options);
    EXPECT_TRUE(is_nearest_in_format(result.output(0, 0), Exact(21) / 7, *format));
    EXPECT_TRUE(is_nearest_in_format(result.weights->operator()(1, 3), Exact(1) / 7, *format));
    EXPECT_TRUE(is_nearest_in_format(result.lse[0], log(Exact(7)), *format));
  }
  // Base 2: with a sink of 0 and n = 7 keys the sum is exactly 8 and log2 is exactly 3.
  const Matrix k7(7, 4, 0.0);
  const Matrix v7(7, 1, 1.0);
  options.lse_base2 = true;
  const auto base2 = reference::attention(q, k7, v7, fp32, options);
  EXPECT_EQ(base2.lse[0], 3.0);
  EXPECT_EQ(base2.output(0, 0), round_to_format(7.0 / 8.0, fp32));  // exactly 7/8
}

TEST(LogSumExp, ExactCasesAreRoundedExactly) {
  // One key with a rational logit: the log-sum-exp is that logit (scale 0.5 given, theta 3).
  Matrix q(1, 2);
  q(0, 0) = 1.0;
  q(0, 1) = 3.0;
  Matrix k(1, 2);
  k(0, 0) = 0.25;
  k(0, 1) = 0.25;  // q . k = 1, logit (0.5 * 1 + 0) / 3 = 1/6
  const Matrix v(1, 1, 2.0);
  reference::AttentionOptions options;
  options.scores.scale = 0.5;
  options.scores.theta = 3.0;
  options.return_lse = true;
  reference::ZivStatistics statistics;
  options.statistics = &statistics;
  const auto result = reference::attention(q, k, v, fp32, options);
  EXPECT_TRUE(is_nearest_in_format(result.lse[0], Exact(1) / 6, fp32));
  EXPECT_EQ(result.output(0, 0), 2.0);
}

TEST(FullyMaskedRows, GiveZerosAndMinusInfinityOrAnError) {
  DeterministicRandom random(31);
  const Matrix q = random_matrix(3, 4, random, 1.0);
  const Matrix k = random_matrix(3, 4, random, 1.0);
  const Matrix v = random_matrix(3, 2, random, 1.0);
  reference::AttentionOptions options;
  options.scores.window_left = 0;
  options.scores.window_right = 0;
  options.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  options.return_lse = true;
  const Matrix short_keys = random_matrix(1, 4, random, 1.0);  // bottom-right with 3 queries, 1 key
  const Matrix short_values = random_matrix(1, 2, random, 1.0);
  EXPECT_THROW((void)reference::attention(q, short_keys, short_values, fp32, options), InputError);
  options.scores.fully_masked = tensor::FullyMaskedRows::zeros;
  const auto result = reference::attention(q, short_keys, short_values, fp32, options);
  EXPECT_EQ(result.lse[0], -INFINITY);  // query 0 aligns with key -2
  EXPECT_EQ(result.output(1, 1), 0.0);
  EXPECT_NE(result.lse[2], -INFINITY);  // query 2 sees key 0
  (void)k;
  (void)v;
}

// ---- Tensors ----

struct Tensors {
  std::vector<double> q, k, v;
};

Tensors random_tensors(const tensor::AttentionProblem& problem, std::uint64_t seed) {
  DeterministicRandom random(seed);
  Tensors t{std::vector<double>(problem.query_elements()), std::vector<double>(problem.key_elements()),
            std::vector<double>(problem.value_elements())};
  for (auto* data : {&t.q, &t.k, &t.v}) {
    for (double& x : *data) x = static_cast<float>(random.normal(0, 1));
  }
  return t;
}

tensor::AttentionProblem problem_of(std::size_t batch, std::size_t heads, std::size_t kv_heads,
                                    std::size_t sq, std::size_t sk, std::size_t d) {
  tensor::AttentionProblem problem;
  problem.shape = {batch, heads, kv_heads, sq, sk, d, d};
  return problem;
}

TEST(Tensors, GroupedQueryAttentionEqualsRepeatedKeysAndValuesBitForBit) {
  tensor::AttentionProblem gqa = problem_of(2, 4, 2, 5, 7, 8);
  gqa.scores.causal = true;
  gqa.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  const Tensors t = random_tensors(gqa, 3);
  tensor::AttentionProblem repeated = gqa;
  repeated.shape.kv_heads = 4;
  Tensors r{t.q, std::vector<double>(repeated.key_elements()),
            std::vector<double>(repeated.value_elements())};
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t h = 0; h < 4; ++h) {
      for (std::size_t s = 0; s < 7; ++s) {
        for (std::size_t c = 0; c < 8; ++c) {  // repeat_interleave: head h reads KV head h / 2
          r.k[repeated.key_offset(b, h, s, c)] = t.k[gqa.key_offset(b, h / 2, s, c)];
          r.v[repeated.value_offset(b, h, s, c)] = t.v[gqa.value_offset(b, h / 2, s, c)];
        }
      }
    }
  }
  const reference::AttentionTensorOptions options{.return_lse = true};
  const auto grouped = reference::attention(gqa, t.q, t.k, t.v, bf16, options);
  const auto plain = reference::attention(repeated, r.q, r.k, r.v, bf16, options);
  EXPECT_EQ(grouped.output, plain.output);
  EXPECT_EQ(grouped.lse, plain.lse);
  // Mutation: reading KV head h % 2 instead (a forgotten mapping) changes the result.
  Tensors wrong = r;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 4; ++h)
      for (std::size_t s = 0; s < 7; ++s)
        for (std::size_t c = 0; c < 8; ++c)
          wrong.k[repeated.key_offset(b, h, s, c)] = t.k[gqa.key_offset(b, h % 2, s, c)];
  EXPECT_NE(reference::attention(repeated, wrong.q, wrong.k, r.v, bf16, options).output, grouped.output);
}

TEST(Tensors, BottomRightEqualsTopLeftWhenSquareAndDiffersOn113By203) {
  for (const auto& [sq, sk, same] : {std::tuple{9u, 9u, true}, std::tuple{113u, 203u, false}}) {
    tensor::AttentionProblem problem = problem_of(1, 1, 1, sq, sk, 16);
    problem.scores.causal = true;
    const Tensors t = random_tensors(problem, 5);
    const auto top_left = reference::attention(problem, t.q, t.k, t.v, fp32);
    problem.scores.alignment = tensor::DiagonalAlignment::bottom_right;
    const auto bottom_right = reference::attention(problem, t.q, t.k, t.v, fp32);
    EXPECT_EQ(top_left.output == bottom_right.output, same) << sq << "x" << sk;
  }
}

TEST(Tensors, PackedVariableLengthsEqualPaddedBatchesAndBshdEqualsBhsd) {
  tensor::AttentionProblem padded = problem_of(2, 2, 1, 6, 9, 8);
  padded.query_lengths = {6, 3};
  padded.key_lengths = {9, 4};
  padded.scores.causal = true;
  padded.scores.alignment = tensor::DiagonalAlignment::bottom_right;
  const Tensors t = random_tensors(padded, 7);
  const reference::AttentionTensorOptions options{.return_lse = true};
  const auto from_padded = reference::attention(padded, t.q, t.k, t.v, fp32, options);
  tensor::AttentionProblem packed = padded;
  packed.layout = tensor::Layout::packed;
  packed.query_lengths.clear();
  packed.key_lengths.clear();
  packed.cu_seqlens_q = {0, 6, 9};
  packed.cu_seqlens_k = {0, 9, 13};
  tensor::AttentionProblem bshd = padded;
  bshd.layout = tensor::Layout::bshd;
  Tensors p{std::vector<double>(packed.query_elements()), std::vector<double>(packed.key_elements()),
            std::vector<double>(packed.value_elements())};
  Tensors s{std::vector<double>(t.q.size()), std::vector<double>(t.k.size()),
            std::vector<double>(t.v.size())};
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t c = 0; c < 8; ++c) {
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t i = 0; i < 6; ++i) {
          s.q[bshd.query_offset(b, h, i, c)] = t.q[padded.query_offset(b, h, i, c)];
          if (i < padded.query_length(b))
            p.q[packed.query_offset(b, h, i, c)] = t.q[padded.query_offset(b, h, i, c)];
        }
      }
      for (std::size_t j = 0; j < 9; ++j) {
        s.k[bshd.key_offset(b, 0, j, c)] = t.k[padded.key_offset(b, 0, j, c)];
        s.v[bshd.value_offset(b, 0, j, c)] = t.v[padded.value_offset(b, 0, j, c)];
        if (j >= padded.key_length(b)) continue;
        p.k[packed.key_offset(b, 0, j, c)] = t.k[padded.key_offset(b, 0, j, c)];
        p.v[packed.value_offset(b, 0, j, c)] = t.v[padded.value_offset(b, 0, j, c)];
      }
    }
  }
  const auto from_packed = reference::attention(packed, p.q, p.k, p.v, fp32, options);
  const auto from_bshd = reference::attention(bshd, s.q, s.k, s.v, fp32, options);
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t i = 0; i < padded.query_length(b); ++i) {
        EXPECT_EQ(from_packed.lse[packed.lse_offset(b, h, i)], from_padded.lse[padded.lse_offset(b, h, i)]);
        EXPECT_EQ(from_bshd.lse[bshd.lse_offset(b, h, i)], from_padded.lse[padded.lse_offset(b, h, i)]);
        for (std::size_t c = 0; c < 8; ++c) {
          EXPECT_EQ(from_packed.output[packed.output_offset(b, h, i, c)],
                    from_padded.output[padded.output_offset(b, h, i, c)]);
          EXPECT_EQ(from_bshd.output[bshd.output_offset(b, h, i, c)],
                    from_padded.output[padded.output_offset(b, h, i, c)]);
        }
      }
    }
  }
  // Padding rows of the padded layout are zeros, not computed.
  EXPECT_EQ(from_padded.output[padded.output_offset(1, 0, 4, 0)], 0.0);
}

TEST(Tensors, BadProblemsAreNamed) {
  const auto message_of = [](const tensor::AttentionProblem& problem) -> std::string {
    try {
      problem.validate();
    } catch (const InputError& error) {
      return error.what();
    }
    return "no error";
  };
  tensor::AttentionProblem problem = problem_of(1, 6, 4, 3, 3, 8);
  EXPECT_NE(message_of(problem).find("KV heads (4) must divide the query heads (6)"), std::string::npos);
  problem.shape.kv_heads = 3;
  problem.key_lengths = {4};
  EXPECT_NE(message_of(problem).find("key_lengths[0] = 4 exceeds"), std::string::npos);
  problem.key_lengths.clear();
  problem.sinks = {1.0};
  EXPECT_NE(message_of(problem).find("1 sinks for 6 heads"), std::string::npos);
  problem.sinks.clear();
  const std::vector<double> bias(9, NAN);
  problem.bias = bias;
  EXPECT_NE(message_of(problem).find("bias[0][0] is NaN"), std::string::npos);
  problem.bias = {};
  problem.scores.softcap = -1;
  EXPECT_NE(message_of(problem).find("soft-cap"), std::string::npos);
  EXPECT_THROW((void)tensor::parse_layout("bsdh"), InputError);
  problem.scores.softcap = 0;
  const std::vector<double> short_q(3);
  EXPECT_THROW((void)reference::attention(problem, short_q, short_q, short_q, fp32), InputError);
  Tensors t = random_tensors(problem, 1);
  t.k[5] = NAN;
  try {
    (void)reference::attention(problem, t.q, t.k, t.v, fp32);
    ADD_FAILURE() << "no error";
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(), "attention: K[0, 0, 0, 5] (bhsd) is NaN");  // its index in the layout
  }
}

}  // namespace
}  // namespace sharpcheck
