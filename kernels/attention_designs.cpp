#include "kernels/attention_designs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <span>
#include <string>

#include "core/errors.hpp"
#include "kernels/float_arithmetic.hpp"
#include "kernels/logit_maker.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
constexpr std::size_t tile = 64;         // keys per tile of the flash loop
constexpr std::size_t tail_block = 128;  // nan_key_tail: the block whose remainder is unmasked

std::vector<float> values_of(const Matrix& matrix, const FloatFormat& format, const char* what) {
  std::vector<float> values(matrix.values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!is_representable(matrix.values[i], format)) {
      throw InputError(InputProblem::out_of_range, std::string(what) + " " + std::to_string(i) + " (" +
                                                       hex_float(matrix.values[i]) + ") is not a value of " +
                                                       std::string(format.name));
    }
    values[i] = static_cast<float>(matrix.values[i]);
  }
  return values;
}

// The head's scores as a kernel with this bug reads them (the masks and modifiers it gets wrong).
tensor::HeadScores as_read_by(tensor::HeadScores scores, ForwardBug bug) {
  using tensor::DiagonalAlignment;
  if (bug == ForwardBug::swapped_causal_alignment) {
    scores.alignment = scores.alignment == DiagonalAlignment::top_left ? DiagonalAlignment::bottom_right
                                                                       : DiagonalAlignment::top_left;
  } else if (bug == ForwardBug::window_off_by_one && scores.window_left) {
    ++*scores.window_left;
  } else if (bug == ForwardBug::alibi_sign_flipped) {
    scores.alibi_slope = -scores.alibi_slope;
  } else if (bug == ForwardBug::sink_in_log2_units && scores.sink) {
    *scores.sink *= std::numbers::log2e;
  }
  return scores;
}

struct Head {
  Head(const AttentionDesign& design, const Matrix& queries, const Matrix& keys, const Matrix& values,
       const tensor::HeadScores& given)
      : m(queries.rows),
        n(keys.rows),
        d(queries.cols),
        dv(values.cols),
        q(values_of(queries, *design.input, "Q entry")),
        k(values_of(keys, *design.input, "K entry")),
        v(values_of(values, *design.input, "V entry")),
        scores(as_read_by(given, design.bug)),
        logit(scores, d),
        bug(design.bug) {
    scale = static_cast<float>(scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(d)));
  }
  // The logit of (i, j) from the fp32 dot product, as the kernel forms it.
  [[nodiscard]] float logit_of(float raw, std::size_t i, std::size_t j) const {
    if (bug == ForwardBug::nan_key_tail && n % tail_block != 0 && j >= n / tail_block * tail_block)
      return std::numeric_limits<float>::quiet_NaN();
    if (bug == ForwardBug::softcap_after_bias && scores.softcap != 0 && scores.has_bias()) {
      const auto cap = static_cast<float>(scores.softcap);
      const float biased = raw * scale + static_cast<float>(scores.bias_of(i, j));
      return cap * std::tanh(biased / cap) * static_cast<float>(1.0 / scores.theta);
    }
    return logit(raw, i, j);
  }
  [[nodiscard]] float raw(std::size_t i, std::size_t j) const { return dot(&q[i * d], &k[j * d], d); }

  std::size_t m, n, d, dv;
  std::vector<float> q, k, v;
  tensor::HeadScores scores;
  LogitMaker logit;
  ForwardBug bug;
  float scale = 1;
};

// FlashAttention 2/3's loop for query i; returns the log-sum-exp (-inf for a row with nothing).
float flash_row(const AttentionDesign& design, const Head& h, std::size_t i,
                std::span<const std::size_t> keys, std::span<float> out) {
  const bool sum_in_bf16 = design.bug == ForwardBug::row_sum_in_bf16;
  const auto add = [&](float sum, float w) { return sum_in_bf16 ? round_to(sum + w, bf16) : sum + w; };
  float running_max = h.logit.has_sink() ? h.logit.sink() : minus_infinity;
  float sum = h.logit.has_sink() ? 1.0F : 0.0F;
  std::vector<float> accumulator(h.dv, 0.0F), tile_scores(tile);
  for (std::size_t start = 0; start < keys.size(); start += tile) {
    const std::size_t length = std::min(tile, keys.size() - start);
    float tile_max = minus_infinity;
    for (std::size_t a = 0; a < length; ++a) {
      tile_scores[a] = h.logit_of(h.raw(i, keys[start + a]), i, keys[start + a]);
      tile_max = std::max(tile_max, tile_scores[a]);
    }
    const float new_max = std::max(running_max, tile_max);
    const float rescale = std::exp(running_max - new_max);
    sum = add(sum * rescale, 0.0F);
    if (design.bug != ForwardBug::skipped_late_rescale || start == 0) {
      for (float& x : accumulator) x *= rescale;
    }
    for (std::size_t a = 0; a < length; ++a) {
      const float w = std::exp(tile_scores[a] - new_max);
      sum = add(sum, w);
      // P in the input format before P V
      const float p = round_to(w, design.bug == ForwardBug::p_in_e4m3 ? fp8_e4m3 : *design.input);
      const float* value = &h.v[keys[start + a] * h.dv];
      for (std::size_t c = 0; c < h.dv; ++c) accumulator[c] += p * value[c];
    }
    running_max = new_max;
  }
  if (sum == 0.0F) {
    std::fill(out.begin(), out.end(), 0.0F);
    return minus_infinity;
  }
  for (std::size_t c = 0; c < h.dv; ++c) out[c] = accumulator[c] / sum;
  float lse = running_max + std::log(sum);
  if (design.bug == ForwardBug::lse_off_by_1e_3) lse += 1e-3F;
  if (design.bug == ForwardBug::lse_in_log2) lse *= std::numbers::log2e_v<float>;
  return lse;
}

// PyTorch's math path for query i: scores rounded twice, an fp32 softmax, P rounded.
void math_row(const AttentionDesign& design, const Head& h, std::size_t i, std::span<const std::size_t> keys,
              std::span<float> out) {
  const FloatFormat& format = *design.input;
  std::vector<float> z(keys.size());
  float top = h.logit.has_sink() ? round_to(h.logit.sink(), format) : minus_infinity;
  const float sink = top;
  for (std::size_t a = 0; a < keys.size(); ++a) {
    z[a] = round_to(h.logit_of(round_to(h.raw(i, keys[a]), format), i, keys[a]), format);
    top = std::max(top, z[a]);
  }
  std::fill(out.begin(), out.end(), 0.0F);
  if (top == minus_infinity) return;
  float sum = h.logit.has_sink() ? std::exp(sink - top) : 0.0F;
  for (float& x : z) sum += x = std::exp(x - top);
  for (std::size_t a = 0; a < keys.size(); ++a) {
    const float p = round_to(z[a] / sum, format);
    for (std::size_t c = 0; c < h.dv; ++c) out[c] += p * h.v[keys[a] * h.dv + c];
  }
}

}  // namespace

void attention_by_design(const AttentionDesign& design, const Matrix& queries, const Matrix& keys,
                         const Matrix& values, const tensor::HeadScores& scores, Matrix& out,
                         std::vector<double>* lse) {
  tensor::HeadScores head = scores;
  if (head.queries == 0) head.queries = queries.rows;
  if (head.keys == 0) head.keys = keys.rows;
  if (head.row_stride == 0) head.row_stride = keys.rows;
  const Head h(design, queries, keys, values, head);
  out = Matrix(h.m, h.dv);
  if (lse != nullptr) lse->assign(design.math_path ? 0 : h.m, 0.0);
  std::vector<std::size_t> visible;
  std::vector<float> row(h.dv);
  for (std::size_t i = 0; i < h.m; ++i) {
    h.scores.visible_keys(i, visible);
    if (design.math_path) {
      math_row(design, h, i, visible, row);
    } else {
      const float row_lse = flash_row(design, h, i, visible, row);
      if (lse != nullptr) (*lse)[i] = row_lse;
    }
    for (std::size_t c = 0; c < h.dv; ++c) out(i, c) = round_to_format(row[c], *design.output);
  }
}

}  // namespace sharpcheck::kernels
