#include "metrics/backward_emulation.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "metrics/backward_pair_block.hpp"
#include "metrics/tolerance_table.hpp"
#include "reference/enclosed_product.hpp"

namespace sharpcheck::metrics {
namespace {

bool power_of_two(double x) {
  int exponent = 0;
  return std::frexp(x, &exponent) == 0.5;
}

// The factor as the kernel multiplies by it: the held value in fp32 (a format's value is one).
double in_fp32(double factor) { return static_cast<double>(static_cast<float>(factor)); }

double dot(std::span<const double> a, std::span<const double> b, double& magnitude) {
  double sum = 0;
  magnitude = 0;
  for (std::size_t t = 0; t < a.size(); ++t) {
    sum += a[t] * b[t];
    magnitude += std::fabs(a[t] * b[t]);
  }
  return sum;
}

// The problem's operands, scale and extra roundings for `chain` (the file's header gives the table),
// from the first head's emulator (the keys are the group's, alike for every head).
double set_operands(ScoreChain chain, const ScoreEmulator& emulator, EmulatedBackward& out) {
  const double factor = in_fp32(emulator.factor()), root = in_fp32(emulator.key_factor());
  out.keys = emulator.key_operand();
  out.key_deviation = emulator.key_deviation();
  switch (chain) {
    case ScoreChain::product_then_scale:
      out.slack.ds_roundings = power_of_two(factor) ? 1 : 2;  // dS * f rounded again
      return factor;
    case ScoreChain::scaled_accumulator:
      out.extra_dq = out.extra_dk = power_of_two(factor) ? 0 : 1;
      return factor;
    case ScoreChain::query_prescaled: {
      const double prescale = in_fp32(emulator.query_factor());
      for (double& key : out.keys.values) key *= prescale;  // F(k) f: the kernel's k is F's
      out.extra_dq = power_of_two(prescale) ? 0 : 1;
      return 1.0;
    }
    case ScoreChain::both_prescaled:
      out.extra_dq = out.extra_dk = power_of_two(root) ? 0 : 1;
      return root;
  }
  return factor;
}

// Head h's biases and slack (the header's bound) for the scale s', its rows of the operands.
bool emulate_rows(const kernels::BackwardProblem& p, std::size_t h, const ScoreEmulator& emulator,
                  double scale, EmulatedBackward& out) {
  const std::size_t positions = p.positions(), keys = p.keys.rows, d = p.queries.cols;
  const tensor::HeadScores head = p.head(h);
  std::vector<double>& bias = out.biases[h];
  std::vector<double>& slack = out.slack.per_head[h];
  bias.assign(positions * keys, -INFINITY);
  slack.assign(positions * keys, 0.0);
  const bool capped = head.softcap != 0.0;
  if (capped) {
    out.slack.slopes[h].assign(positions * keys, 0.0);
    out.slope_deviation[h].assign(positions * keys, 0.0);
  }
  std::vector<std::size_t> visible;
  EmulatedRow row;
  for (std::size_t i = 0; i < positions; ++i) {
    std::copy_n(emulator.query_operand().row(i).begin(), d, out.queries.row(h * positions + i).begin());
    std::copy_n(emulator.query_deviation().row(i).begin(), d,
                out.query_deviation.row(h * positions + i).begin());
    head.visible_keys(i, visible);
    if (!emulator.row(i, visible, row)) return false;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      double magnitude = 0;
      const double scaled = scale * dot(emulator.query_operand().row(i), out.keys.row(visible[a]), magnitude);
      const std::size_t at = i * keys + visible[a];
      bias[at] = row.z[a] - scaled;
      slack[at] = row.ambiguity[a] + (0x1p-52 * (std::fabs(row.z[a]) + std::fabs(scaled)) +
                                      scale * static_cast<double>(d + 1) * 0x1p-53 * magnitude) *
                                         (1 + 1e-9);
      if (capped) {
        out.slack.slopes[h][at] = row.slope[a];
        out.slope_deviation[h][at] = row.slope_deviation[a];
      }
    }
  }
  tensor::HeadScores emulated = head;
  emulated.scale = scale;
  emulated.softcap = 0;      // the emulated scores are capped; its slope is slack.slopes'
  emulated.bias = bias;      // the emulated scores hold the head's bias and ALiBi terms
  emulated.alibi_slope = 0;  // (ScoreEmulator::add_bias): not added again
  emulated.keep = {};        // its stride is the head's; the bias is -inf wherever the head sees no key
  emulated.row_stride = keys;
  out.heads.push_back(emulated);
  return true;
}

bool any_positive(const Matrix& m) {
  return std::any_of(m.values.begin(), m.values.end(), [](double x) { return x > 0; });
}

}  // namespace

// dQ's worst-case first order of the emulation's slack (Magnitudes::dq_slack_worst) with its part
// through the row's mean slack, |dQ_ic| slack_mean_i, |dQ_ic| at most the centre's value plus radius.
Matrix worst_dq_slack(const Magnitudes& m, const reference::AttentionGradients& centre,
                      const reference::AttentionGradients& radii) {
  Matrix worst = m.dq_slack_worst;
  for (std::size_t i = 0; i < worst.rows; ++i)
    for (std::size_t c = 0; c < worst.cols; ++c)
      worst(i, c) +=
          (std::fabs(centre.d_queries(i, c)) + radii.d_queries(i, c)) * m.slack_mean[i] * (1 + 0x1p-20);
  return worst;
}

// The slack's first-order charge, over lambda (comparison.cpp's inside_charge multiplies it back):
// Hoeffding's root, or the same perturbations' worst case where that is smaller (few ambiguous
// scores: a root times lambda = 8 is then up to eight times their sum of sizes).
Matrix first_order_slack(const Matrix& root, const Matrix& worst) {
  Matrix charge = root;
  for (std::size_t x = 0; x < charge.values.size(); ++x)
    charge.values[x] = std::min(charge.values[x], worst.values[x] / statistical_lambda * (1 + 0x1p-20));
  return charge;
}

// Two bounds of one charge: the smaller, element by element.
Matrix smaller(const Matrix& a, const Matrix& b) {
  Matrix least = a;
  for (std::size_t x = 0; x < least.values.size(); ++x) least.values[x] = std::min(a.values[x], b.values[x]);
  return least;
}

tensor::AttentionBackwardProblem EmulatedBackward::problem(const kernels::BackwardProblem& p) const {
  return {queries, keys, p.values, p.d_out, p.d_lse, heads[0], p.group, {}, heads};
}

bool backward_emulable(const kernels::BackwardProblem& p) {
  if (!p.d_lse.empty() || !p.group_sinks.empty() || p.group == 0) return false;
  if (p.queries.rows * p.keys.rows > (std::size_t{1} << 25)) return false;
  const std::optional<double> scale = p.head(0).scale;
  const double cap = p.head(0).softcap;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = p.head(h);
    // One scale for the group: the emulated problem's operands and scale are the first head's.
    if (!scores_emulable(head) || head.softcap != cap || head.sink || head.scale != scale) return false;
  }
  return true;
}

bool emulate_backward(const kernels::BackwardProblem& p, const ScoreVariant& variant,
                      const FloatFormat& format, bool fp32_slope, EmulatedBackward& out) {
  const std::size_t positions = p.positions(), d = p.queries.cols;
  out.queries = Matrix(p.queries.rows, d);
  out.query_deviation = Matrix(p.queries.rows, d);
  out.biases.assign(p.group, {});
  out.slack.per_head.assign(p.group, {});
  const double cap = p.head(0).softcap;
  if (cap != 0.0) {
    out.slack.slopes.assign(p.group, {});
    out.slope_deviation.assign(p.group, {});
  }
  double scale = 1;
  for (std::size_t h = 0; h < p.group; ++h) {
    Matrix queries(positions, d);
    std::copy_n(p.queries.values.begin() + static_cast<std::ptrdiff_t>(h * positions * d), positions * d,
                queries.values.begin());
    const tensor::HeadScores head = p.head(h);
    ScoreEmulator emulator(variant.chain, queries, p.keys, head, format, variant.rounding, variant.cap);
    emulator.take_slope_from_fp32_tanh(fp32_slope);
    if (!emulator.distinct()) return false;
    if (h == 0) scale = set_operands(variant.chain, emulator, out);
    if (!emulate_rows(p, h, emulator, scale, out)) return false;
  }
  if (cap != 0.0)  // the cap's backward rounds dS again; once where it runs in fp32
    out.slack.ds_roundings +=
        variant.cap == CapChain::each_step_in_format ? backward_blocks::cap_ds_roundings(cap) : 1;
  out.relative_in_full = variant.rounding == FactorRounding::format_product ? 0.0 : 0x1p-23;
  out.description = describe(variant) + (fp32_slope ? ", its slope from the tanh in fp32" : "");
  return true;
}

namespace {

// One row of the emulated problem in double: its visible keys, P_ij, dP_ij (and sum_c |dO_ic
// v_jc|), from the problem's logits (scale s' Q~ K~ + bias, the emulated scores).
struct RowInDouble {
  std::vector<std::size_t> visible;
  std::vector<double> p, dp, dp_magnitude;
};

void row_in_double(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                   const tensor::HeadScores& head, std::size_t i, RowInDouble& row) {
  head.visible_keys(i % p.positions(), row.visible);
  const std::size_t n = row.visible.size();
  row.p.assign(n, 0.0), row.dp.assign(n, 0.0), row.dp_magnitude.assign(n, 0.0);
  double largest = -INFINITY, magnitude = 0;
  for (std::size_t a = 0; a < n; ++a) {
    const std::size_t j = row.visible[a];
    row.p[a] =
        *head.scale * dot(e.queries.row(i), e.keys.row(j), magnitude) + head.bias_of(i % p.positions(), j);
    largest = std::max(largest, row.p[a]);
    row.dp[a] = dot(p.d_out.row(i), p.values.row(j), row.dp_magnitude[a]);
  }
  double sum = 0;
  for (const double z : row.p) sum += std::exp(z - largest);
  const double lse = largest + std::log(sum);
  for (double& x : row.p) x = std::exp(x - lse);
}

}  // namespace

void apply_cap_slopes(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                      reference::AttentionGradients& centre, reference::AttentionGradients& radii) {
  if (e.slack.slopes.empty()) return;
  const tensor::AttentionBackwardProblem problem = e.problem(p);
  const std::size_t positions = p.positions(), keys = p.keys.rows, d = p.queries.cols;
  for (Matrix* m : {&centre.d_queries, &centre.d_keys, &radii.d_queries, &radii.d_keys})
    std::fill(m->values.begin(), m->values.end(), 0.0);
  RowInDouble row;
  std::vector<double> ds, reach;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = problem.head(h);
    const double scale = *head.scale;
    for (std::size_t position = 0; position < positions; ++position) {
      const std::size_t i = h * positions + position;
      row_in_double(p, e, head, i, row);
      const double d_row = centre.d_rows[i], d_radius = radii.d_rows.empty() ? 0.0 : radii.d_rows[i];
      double a_row = 0;  // A_i = sum_j P_ij |dP_ij|
      for (std::size_t a = 0; a < row.visible.size(); ++a) a_row += row.p[a] * std::fabs(row.dp[a]);
      ds.assign(row.visible.size(), 0.0), reach.assign(row.visible.size(), 0.0);
      // An ambiguous score's kernel may hold P and D moved by the row's slack: P_ij by at most
      // exp(2 eps), A_i likewise, so its |dS_ij| <= exp(4 eps) P_ij (|dP_ij| + A_i).
      double slack = 0;
      for (const std::size_t j : row.visible)
        slack = std::max(slack, e.slack.per_head[h][position * keys + j]);
      const double moved = std::exp(4 * slack) * (1 + 1e-9);
      for (std::size_t a = 0; a < row.visible.size(); ++a) {  // dS_ij t'_ij s' and its reach, over |K~|
        const std::size_t at = position * keys + row.visible[a];
        const double slope = e.slack.slopes[h][at], deviation = e.slope_deviation[h][at];
        const double exact_ds = row.p[a] * (row.dp[a] - d_row);
        const double ds_error = row.p[a] * (d_radius + 1e-9 * (std::fabs(row.dp[a]) + std::fabs(d_row)) +
                                            0x1p-40 * row.dp_magnitude[a]) +
                                1e-9 * std::fabs(exact_ds);
        ds[a] = exact_ds * slope * scale;
        // fp32's steps: five relative 2^-24s of dS t', and 1 - t t's rounding, absolute (2^-24 t^2).
        reach[a] = scale *
                   ((ds_error + 5 * 0x1p-24 * std::fabs(exact_ds)) * slope + 0x1p-23 * std::fabs(exact_ds) +
                    deviation * moved * row.p[a] * (std::fabs(row.dp[a]) + a_row)) *
                   (1 + 1e-9);
      }
      for (std::size_t a = 0; a < row.visible.size(); ++a) {
        const std::size_t j = row.visible[a];
        for (std::size_t t = 0; t < d; ++t) {
          centre.d_queries(i, t) += ds[a] * e.keys(j, t);
          radii.d_queries(i, t) += reach[a] * std::fabs(e.keys(j, t));
          centre.d_keys(j, t) += ds[a] * e.queries(i, t);
          radii.d_keys(j, t) += reach[a] * std::fabs(e.queries(i, t));
        }
      }
    }
  }
  // The sums' own double rounding: n 2^-53 of the terms' absolute sum, far within 1e-9 of it for
  // the sizes judged (the reach's 1e-9 |dS_ij| share).
}

void add_deviation_radii(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                         const reference::AttentionGradients& centre, reference::AttentionGradients& radii) {
  const bool keys_deviate = any_positive(e.key_deviation);
  if (!keys_deviate && !any_positive(e.query_deviation)) return;
  const tensor::AttentionBackwardProblem problem = e.problem(p);
  const std::size_t positions = p.positions(), keys = p.keys.rows, d = p.queries.cols;
  const bool capped = !e.slack.slopes.empty();
  RowInDouble row;
  std::vector<double> ds;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = problem.head(h);
    const double scale = *head.scale;
    for (std::size_t position = 0; position < positions; ++position) {
      const std::size_t i = h * positions + position;
      const bool row_deviates = std::any_of(e.query_deviation.row(i).begin(), e.query_deviation.row(i).end(),
                                            [](double x) { return x > 0; });
      if (!row_deviates && !keys_deviate) continue;
      row_in_double(p, e, head, i, row);
      const double d_row = centre.d_rows[i], d_radius = radii.d_rows.empty() ? 0.0 : radii.d_rows[i];
      ds.assign(row.visible.size(), 0.0);  // |dS_ij| dz/dr, 1e-6 over its double arithmetic
      for (std::size_t a = 0; a < row.visible.size(); ++a) {
        const std::size_t at = position * keys + row.visible[a];
        const double slope = capped ? e.slack.slopes[h][at] + e.slope_deviation[h][at] : 1.0;
        ds[a] = row.p[a] * (std::fabs(row.dp[a] - d_row) + d_radius + 1e-12 * row.dp_magnitude[a]) * scale *
                slope * (1 + 1e-6);
      }
      for (std::size_t a = 0; a < row.visible.size(); ++a) {
        const std::size_t j = row.visible[a];
        for (std::size_t t = 0; t < d; ++t) {
          radii.d_keys(j, t) += ds[a] * e.query_deviation(i, t);
          radii.d_queries(i, t) += ds[a] * e.key_deviation(j, t);
        }
      }
    }
  }
}

}  // namespace sharpcheck::metrics

namespace sharpcheck::metrics::backward_blocks {

// A soft-cap's slope as a kernel forms it, 1 - t'^2, against dz/dr's 1 - t^2 (t = tanh(s / c)), over
// |scale / theta|: the kernel's score s' is within ds of s (its roundings, 2 u_S |s| each as the
// table charges them, and the fp32 dot product's (d + 2) 2^-24 sum |q k| |scale|), its quotient
// by c (held in fp32 or F) within 2 u_S |s| / c more; tanh moves by at most the interval's largest
// sech^2 times that; the tanh is rounded to F (u_S |t|: each step in F) and within 2^-20 relative in
// fp32; then |t'^2 - t^2| <= dt (2 |t| + dt). A kernel that forms its slope from the rounded tanh
// (autograd through torch.tanh on bf16 tensors) differs from dz/dr by that much, not by fp32's
// 2^-20, which failed such honest kernels in the proven tier (ratios up to 6.8).
double cap_slope_error(double s, double cap, double dot_error, double u_s) {
  const double x = s / cap, t = std::tanh(x);
  const double dx = (2 * 2 * u_s * std::fabs(s) + 2 * u_s * std::fabs(s) + dot_error) / cap * (1 + 1e-6);
  const double nearest = std::max(0.0, std::fabs(x) - dx);
  const double steepest = 1 - std::tanh(nearest) * std::tanh(nearest);
  const double dt =
      ((dx * steepest + 0x1p-20 * std::fabs(t)) * (1 + u_s) + u_s * std::fabs(t)) * (1 + 1e-6) + 0x1p-149;
  return dt * (2 * std::fabs(t) + dt) + 0x1p-20;
}

// A soft-capped emulation's slopes (EmulatedScoreSlack::slopes, head's positions x keys): dz/dr is
// s' times the kernel's slope 1 - t^2, not s'.
void apply_slopes(const kernels::BackwardProblem& p, const std::vector<double>& slopes, PairBlock& block) {
  const std::size_t keys = p.keys.rows;
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t position = (block.first + r) % p.positions();
    for (std::size_t a = 0; a < block.visible[r].size(); ++a)
      block.geometry[r].slope[a] *= slopes[position * keys + block.visible[r][a]];
  }
}

// The slack in the worst case, per key (Magnitudes::dq_slack_worst, dq_slack_second). A score moved
// by e_il, |e_il| <= zeta_il, moves P_ij to P'_ij = P_ij exp(x_ij), x_ij = e_ij - e~_i - r_i with
// e~_i = sum_l P_il e_il and 0 <= r_i = ln(sum_l P_il exp(e_il)) - e~_i <= rho_i = sum_l P_il
// (expm1(zeta_il) - zeta_il) (Jensen; ln(1 + y) <= y), so |x_ij| <= a_ij = zeta_ij + zbar_i + rho_i,
// zbar_i = sum_l P_il zeta_il. First order: P_ij (e_ij - e~_i); D_i = sum_l P_il dP_il by
// sum_l P_il e_il H_il (H = dP - D); dS_ij = s P_ij G_ij (G = H + g, s = dz/dr, alike for a row's
// keys: emulated heads have no cap) by s P_ij ((e_ij - e~_i) G_ij - sum_l P_il e_il H_il). The
// coefficient of e_il in dQ_ic is s P_il (G_il k_lc - H_il kbar_ic) - P_il dQ_ic, so with
// Z_i = sum_l P_il zeta_il |H_il| and w_i = s sum_j P_ij k_j (D's direction, signed_dq):
//   |d dQ_ic| <= s sum_l zeta_il P_il |G_il| |k_lc| + |w_ic| Z_i + |dQ_ic| zbar_i,
//   |d dK_kc| <= s sum_i |q_ic| P_ik ((zeta_ik + zbar_i) |G_ik| + Z_i),
//   |d dV_kc| <= sum_i P_ik (zeta_ik + zbar_i) |dO_ic|,
// dQ's last part added by the judgement with the centre's dQ (slack_mean holds zbar_i). The rest:
// P'_ij / P_ij - 1 - (e_ij - e~_i) = (exp(x) - 1 - x) - r_i is at most sigma_ij = exp(a_ij) a_ij^2 / 2
// + rho_i, |P'_ij - P_ij| at most P_ij (exp(a_ij) - 1), and dS'_ij - dS_ij less its first order is
// s [(P' - P - dP1) G - P (D' - D - dD1) - (P' - P)(D' - D)]_ij (the P' - P sum to 0, so D's terms
// take H), at most s P_ij (sigma_ij |G_ij| + S_i + (exp(a_ij) - 1) E_i), S_i = sum_l P_il sigma_il
// |H_il|, E_i = sum_l P_il (exp(a_il) - 1) |H_il|; dV's, sum_i P_ik sigma_ik |dO_ic|. Where few
// scores are ambiguous, and those of small weight, these are far below Hoeffding's lambda root of
// the same perturbations and the second order at the row's largest slack.
void add_slack_worst_case(const kernels::BackwardProblem& p, const Images& images,
                          const std::vector<std::vector<double>>& zeta, PairBlock& block, Magnitudes& m) {
  const std::size_t size = block.rows * block.width, d = p.queries.cols;
  for (auto* v : {&block.slack_q, &block.slack_k, &block.slack_v, &block.second_ds, &block.second_v})
    zero(*v, size);
  std::vector<double> moved(block.rows);
  for (std::size_t r = 0; r < block.rows; ++r) {
    const std::size_t i = block.first + r;
    const double lse_gradient = p.d_lse.empty() ? 0.0 : p.d_lse[i];
    const std::vector<std::size_t>& visible = block.visible[r];
    const auto at = [&](std::size_t a) { return block.at(r, visible[a]); };
    const auto h_of = [&](std::size_t e) { return std::fabs(block.dp_signed[e] - block.exact_d[r]); };
    double mean = 0, rho = 0;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const double w = block.weight[at(a)];
      if (w == 0) continue;  // a huge additive mask: nothing moves
      mean += w * zeta[r][a];
      moved[r] += w * zeta[r][a] * h_of(at(a));
      rho += w * (std::expm1(zeta[r][a]) - zeta[r][a]);
    }
    const auto reach = [&](std::size_t a) { return zeta[r][a] + mean + rho; };
    const auto sigma = [&](std::size_t a) { return std::exp(reach(a)) * reach(a) * reach(a) / 2 + rho; };
    double rest = 0, shift = 0;  // S_i and E_i
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const double w = block.weight[at(a)];
      rest += w * sigma(a) * h_of(at(a));
      shift += w * std::expm1(reach(a)) * h_of(at(a));
    }
    m.slack_mean[i] = mean;
    for (std::size_t a = 0; a < visible.size(); ++a) {
      const std::size_t e = at(a);
      const double w = block.weight[e], s = block.slope[e];
      if (w == 0) continue;
      const double g = std::fabs(block.dp_signed[e] - block.exact_d[r] + lse_gradient);
      block.slack_q[e] = s * w * zeta[r][a] * g;
      block.slack_k[e] = s * w * ((zeta[r][a] + mean) * g + moved[r]);
      block.slack_v[e] = w * (zeta[r][a] + mean);
      block.second_ds[e] = s * w * (sigma(a) * g + rest + std::expm1(reach(a)) * shift);
      block.second_v[e] = w * sigma(a);
    }
  }
  if (block.width > 0) {
    const auto add = [&](const std::vector<double>& pairs, bool transposed, const Matrix& image, Matrix& c) {
      const std::size_t first = transposed ? block.first : block.key_first;
      reference::plain_product(block_of(pairs, block.rows, block.width, transposed),
                               rows_of(image, first, transposed ? block.rows : block.width),
                               c.values.data() + (transposed ? block.key_first : block.first) * c.cols,
                               c.cols, true);
    };
    add(block.slack_q, false, images.k_abs, m.dq_slack_worst);
    add(block.slack_k, true, images.q_abs, m.dk_slack_worst);
    add(block.slack_v, true, images.dout_abs, m.dv_slack_worst);
    add(block.second_ds, false, images.k_abs, m.dq_slack_second);
    add(block.second_ds, true, images.q_abs, m.dk_slack_second);
    add(block.second_v, true, images.dout_abs, m.dv_slack_second);
  }
  for (std::size_t r = 0; r < block.rows; ++r)
    for (std::size_t t = 0; t < d; ++t)
      m.dq_slack_worst(block.first + r, t) += std::fabs(block.signed_dq[r * d + t]) * moved[r];
}

}  // namespace sharpcheck::metrics::backward_blocks
