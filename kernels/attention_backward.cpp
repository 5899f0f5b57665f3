#include "kernels/attention_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "kernels/attention_kernels.hpp"
#include "kernels/float_arithmetic.hpp"
#include "kernels/logit_maker.hpp"

namespace sharpcheck::kernels {
namespace {

constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

std::vector<float> floats_of(const Matrix& matrix) { return {matrix.values.begin(), matrix.values.end()}; }

// The problem as floats, with the head's defaults filled in and the logit arithmetic of the
// forward kernels (kernels/logit_maker.hpp).
struct Floats {
  explicit Floats(const BackwardProblem& p)
      : m(p.queries.rows),
        n(p.keys.rows),
        d(p.queries.cols),
        dv(p.values.cols),
        q(floats_of(p.queries)),
        k(floats_of(p.keys)),
        v(floats_of(p.values)),
        dout(floats_of(p.d_out)),
        head(p.head(0)),
        logit(head, d) {
    if (p.group != 1)
      throw InputError(InputProblem::out_of_range, "attention backward kernels: one head at a time");
    for (std::size_t i = 0; i < m; ++i)
      d_lse.push_back(p.d_lse.empty() ? 0.0F : static_cast<float>(p.d_lse[i]));
    const double scale = head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(d));
    scale_ = static_cast<float>(scale);
    inverse_theta_ = static_cast<float>(1.0 / head.theta);
    cap_ = static_cast<float>(head.softcap);
  }
  [[nodiscard]] float raw(std::size_t i, std::size_t j) const { return dot(&q[i * d], &k[j * d], d); }
  // dz/dr at raw score r: scale (1 - tanh^2(scale r / cap)) / theta, or scale / theta.
  [[nodiscard]] float slope(float r, bool with_cap_derivative) const {
    if (cap_ == 0.0F || !with_cap_derivative) return scale_ * inverse_theta_;
    const float t = std::tanh(r * scale_ / cap_);
    return scale_ * (1.0F - t * t) * inverse_theta_;
  }

  std::size_t m, n, d, dv;
  std::vector<float> q, k, v, dout, d_lse;
  tensor::HeadScores head;
  LogitMaker logit;
  float scale_ = 1, inverse_theta_ = 1, cap_ = 0;
};

struct Accumulators {
  explicit Accumulators(const Floats& f)
      : dq(f.m * f.d), dk(f.n * f.d), dv(f.n * f.dv), has_sink(f.logit.has_sink()), d_rows(f.m, 0.0) {}
  std::vector<float> dq, dk, dv;
  float d_sink = 0;
  bool has_sink = false;
  std::vector<double> d_rows;  // D per query, as kept (fp32)

  KernelGradients rounded(const Floats& f, const FloatFormat& format) const {
    KernelGradients g{Matrix(f.m, f.d), Matrix(f.n, f.d), Matrix(f.n, f.dv), {}, d_rows};
    const auto round_all = [&](const std::vector<float>& from, Matrix& to) {
      for (std::size_t e = 0; e < from.size(); ++e) to.values[e] = round_to_format(from[e], format);
    };
    round_all(dq, g.d_queries);
    round_all(dk, g.d_keys);
    round_all(dv, g.d_values);
    if (has_sink) g.d_sinks = {round_to_format(d_sink, format)};
    return g;
  }
};

// One key's contribution to the gradients: dr = dS dz/dr with dS = P (dP - D + g); p as it
// multiplies dO into dV.
void add_key(const Floats& f, std::size_t i, std::size_t j, float p, float dr, Accumulators& acc,
             const FloatFormat* dq_format) {
  for (std::size_t c = 0; c < f.d; ++c) {
    float& dq = acc.dq[i * f.d + c];
    dq += dr * f.k[j * f.d + c];
    if (dq_format != nullptr) dq = round_to(dq, *dq_format);
    acc.dk[j * f.d + c] += dr * f.q[i * f.d + c];
  }
  for (std::size_t c = 0; c < f.dv; ++c) acc.dv[j * f.dv + c] += p * f.dout[i * f.dv + c];
}

}  // namespace

KernelGradients attention_backward_plain(const BackwardProblem& problem, const FloatFormat& format) {
  const Floats f(problem);
  Accumulators acc(f);
  std::vector<std::size_t> visible;
  std::vector<float> z, p, dp, raw;
  for (std::size_t i = 0; i < f.m; ++i) {
    f.head.visible_keys(i, visible);
    if (visible.empty() && !f.logit.has_sink()) continue;
    z.clear();
    raw.clear();
    for (const std::size_t j : visible) {
      raw.push_back(f.raw(i, j));
      z.push_back(f.logit(raw.back(), i, j));
    }
    float top = f.logit.has_sink() ? f.logit.sink() : minus_infinity;
    for (const float x : z) top = std::max(top, x);
    float sum = f.logit.has_sink() ? std::exp(f.logit.sink() - top) : 0.0F;
    p.assign(z.size(), 0.0F);
    for (std::size_t a = 0; a < z.size(); ++a) sum += p[a] = std::exp(z[a] - top);
    float big_d = 0;
    dp.assign(z.size(), 0.0F);
    for (std::size_t a = 0; a < z.size(); ++a) {
      p[a] /= sum;
      dp[a] = dot(&f.dout[i * f.dv], &f.v[visible[a] * f.dv], f.dv);
      big_d += p[a] * dp[a];
    }
    acc.d_rows[i] = big_d;
    for (std::size_t a = 0; a < z.size(); ++a)
      add_key(f, i, visible[a], p[a], p[a] * (dp[a] - big_d + f.d_lse[i]) * f.slope(raw[a], true), acc,
              nullptr);
    if (f.logit.has_sink())
      acc.d_sink += std::exp(f.logit.sink() - top) / sum * (f.d_lse[i] - big_d) * f.inverse_theta_;
  }
  return acc.rounded(f, format);
}

KernelGradients attention_backward_flash(const BackwardProblem& problem, const FloatFormat& format,
                                         const FlashBackwardOptions& options) {
  const BackwardBug bug = options.bug;
  const std::size_t tile = options.tile;
  const auto intermediate = [&](float x) {
    return options.intermediates != nullptr ? round_to(x, *options.intermediates) : x;
  };
  const Floats f(problem);
  // The forward: O saved in the format, L in fp32.
  std::vector<float> out(f.m * f.dv), lse(f.m);
  attention_flash_fp32(f.q.data(), f.k.data(), f.v.data(), out.data(), lse.data(), {f.m, f.n, f.d, f.dv},
                       f.head);
  for (float& o : out) o = round_to(o, format);
  std::vector<float> big_d(f.m, 0.0F);
  const std::size_t d_columns = bug == BackwardBug::stale_d ? f.dv / 2 : f.dv;
  for (std::size_t i = 0; i < f.m; ++i) big_d[i] = dot(&f.dout[i * f.dv], &out[i * f.dv], d_columns);
  Accumulators acc(f);
  acc.d_rows.assign(big_d.begin(), big_d.end());
  std::vector<std::vector<std::size_t>> visible(f.m);
  for (std::size_t i = 0; i < f.m; ++i) f.head.visible_keys(i, visible[i]);
  const FloatFormat* dq_format = bug == BackwardBug::dq_in_output ? &format : nullptr;
  for (std::size_t first = 0; first < f.n; first += tile) {  // FlashAttention 2: key tiles outside
    const std::size_t last = std::min(f.n, first + tile);
    for (std::size_t i = 0; i < f.m; ++i) {
      if (lse[i] == minus_infinity && bug != BackwardBug::nan_on_masked_rows) continue;
      for (std::size_t j = first; j < last; ++j) {
        const bool seen = std::binary_search(visible[i].begin(), visible[i].end(), j);
        if (!seen && !visible[i].empty()) continue;  // a masked key of a row that sees some
        const float raw = f.raw(i, j);
        const float z = seen ? f.logit(raw, i, j) : minus_infinity;  // an all-masked row's -inf scores
        const float p = std::exp(z - lse[i]);
        const float dp = dot(&f.dout[i * f.dv], &f.v[j * f.dv], f.dv);
        const float ds = intermediate(p * (dp - big_d[i] + f.d_lse[i]));
        const float dr = ds * f.slope(raw, bug != BackwardBug::no_softcap_grad);
        add_key(f, i, j, intermediate(p), dr, acc, dq_format);
      }
    }
  }
  if (f.logit.has_sink()) {
    for (std::size_t i = 0; i < f.m; ++i)
      acc.d_sink += std::exp(f.logit.sink() - lse[i]) * (f.d_lse[i] - big_d[i]) * f.inverse_theta_;
  }
  return acc.rounded(f, format);
}

KernelGradients attention_backward_math_lowp(const BackwardProblem& problem, const FloatFormat& format) {
  const Floats f(problem);
  const auto rn = [&](float x) { return round_to(x, format); };
  Accumulators acc(f);
  std::vector<std::size_t> visible;
  std::vector<float> z, p, dp, tanh_of;
  for (std::size_t i = 0; i < f.m; ++i) {
    f.head.visible_keys(i, visible);
    if (visible.empty() && !f.logit.has_sink()) continue;
    z.clear();
    tanh_of.clear();
    for (const std::size_t j : visible) {  // scores: each matmul and elementwise op rounded
      float s = rn(rn(f.raw(i, j)) * rn(f.scale_));
      tanh_of.push_back(f.cap_ != 0 ? rn(std::tanh(rn(s / f.cap_))) : 0.0F);
      if (f.cap_ != 0) s = rn(f.cap_ * tanh_of.back());
      if (f.head.has_bias()) s = rn(s + rn(static_cast<float>(f.head.bias_of(i, j))));
      z.push_back(rn(s * f.inverse_theta_));
    }
    const float sink = f.logit.has_sink() ? rn(f.logit.sink()) : minus_infinity;
    float top = sink;
    for (const float x : z) top = std::max(top, x);
    float sum = std::exp(sink - top);
    p.assign(z.size(), 0.0F);
    for (std::size_t a = 0; a < z.size(); ++a) sum += p[a] = std::exp(z[a] - top);
    for (float& x : p) x = rn(x / sum);
    float big_d = 0;
    dp.assign(z.size(), 0.0F);
    for (std::size_t a = 0; a < z.size(); ++a) {
      dp[a] = rn(dot(&f.dout[i * f.dv], &f.v[visible[a] * f.dv], f.dv));
      big_d += p[a] * dp[a];
    }
    acc.d_rows[i] = big_d;
    for (std::size_t a = 0; a < z.size(); ++a) {
      float ds = rn(rn(p[a] * (dp[a] - big_d + f.d_lse[i])) * f.inverse_theta_);
      // Autograd's steps back through s = F(F(tanh(F(r / c))) * c): the product by c, tanh's
      // backward (its slope 1 - t^2 formed in fp32, one rounding of the product), the quotient by c.
      if (f.cap_ != 0) ds = rn(rn(rn(ds * f.cap_) * (1.0F - tanh_of[a] * tanh_of[a])) / f.cap_);
      add_key(f, i, visible[a], p[a], rn(ds * rn(f.scale_)), acc, nullptr);
    }
    if (f.logit.has_sink())
      acc.d_sink += rn(std::exp(sink - top) / sum) * (f.d_lse[i] - big_d) * f.inverse_theta_;
  }
  return acc.rounded(f, format);
}

}  // namespace sharpcheck::kernels
