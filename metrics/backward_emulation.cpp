#include "metrics/backward_emulation.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>

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
    }
  }
  tensor::HeadScores emulated = head;
  emulated.scale = scale;
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

tensor::AttentionBackwardProblem EmulatedBackward::problem(const kernels::BackwardProblem& p) const {
  return {queries, keys, p.values, p.d_out, p.d_lse, heads[0], p.group, {}, heads};
}

bool backward_emulable(const kernels::BackwardProblem& p) {
  if (!p.d_lse.empty() || !p.group_sinks.empty() || p.group == 0) return false;
  if (p.queries.rows * p.keys.rows > (std::size_t{1} << 25)) return false;
  const std::optional<double> scale = p.head(0).scale;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = p.head(h);
    // One scale for the group: the emulated problem's operands and scale are the first head's.
    if (!scores_emulable(head) || head.softcap != 0.0 || head.sink || head.scale != scale) return false;
  }
  return true;
}

bool emulate_backward(const kernels::BackwardProblem& p, ScoreChain chain, FactorRounding rounding,
                      const FloatFormat& format, EmulatedBackward& out) {
  const std::size_t positions = p.positions(), d = p.queries.cols;
  out.queries = Matrix(p.queries.rows, d);
  out.query_deviation = Matrix(p.queries.rows, d);
  out.biases.assign(p.group, {});
  out.slack.per_head.assign(p.group, {});
  double scale = 1;
  for (std::size_t h = 0; h < p.group; ++h) {
    Matrix queries(positions, d);
    std::copy_n(p.queries.values.begin() + static_cast<std::ptrdiff_t>(h * positions * d), positions * d,
                queries.values.begin());
    const tensor::HeadScores head = p.head(h);
    const ScoreEmulator emulator(chain, queries, p.keys, head, format, rounding);
    if (!emulator.distinct()) return false;
    if (h == 0) scale = set_operands(chain, emulator, out);
    if (!emulate_rows(p, h, emulator, scale, out)) return false;
  }
  out.relative_in_full = rounding == FactorRounding::format_product ? 0.0 : 0x1p-23;
  out.description = std::string(describe(chain)) + ", " + std::string(describe(rounding));
  return true;
}

void add_deviation_radii(const kernels::BackwardProblem& p, const EmulatedBackward& e,
                         const reference::AttentionGradients& centre, reference::AttentionGradients& radii) {
  const bool keys_deviate = any_positive(e.key_deviation);
  if (!keys_deviate && !any_positive(e.query_deviation)) return;
  const tensor::AttentionBackwardProblem problem = e.problem(p);
  const std::size_t positions = p.positions(), d = p.queries.cols;
  std::vector<std::size_t> visible;
  std::vector<double> z, ds;
  for (std::size_t h = 0; h < p.group; ++h) {
    const tensor::HeadScores head = problem.head(h);
    const double scale = *head.scale;
    for (std::size_t position = 0; position < positions; ++position) {
      const std::size_t i = h * positions + position;
      const bool row_deviates = std::any_of(e.query_deviation.row(i).begin(), e.query_deviation.row(i).end(),
                                            [](double x) { return x > 0; });
      if (!row_deviates && !keys_deviate) continue;
      head.visible_keys(position, visible);
      z.assign(visible.size(), 0.0);
      double largest = -INFINITY, magnitude = 0;
      for (std::size_t a = 0; a < visible.size(); ++a) {
        z[a] = scale * dot(e.queries.row(i), e.keys.row(visible[a]), magnitude) +
               head.bias_of(position, visible[a]);
        largest = std::max(largest, z[a]);
      }
      double sum = 0;
      for (const double x : z) sum += std::exp(x - largest);
      const double lse = largest + std::log(sum);
      const double d_row = centre.d_rows[i], d_radius = radii.d_rows.empty() ? 0.0 : radii.d_rows[i];
      ds.assign(visible.size(), 0.0);
      for (std::size_t a = 0; a < visible.size(); ++a) {  // |dS_ij| s', 1e-6 over its double arithmetic
        const double dp = dot(p.d_out.row(i), p.values.row(visible[a]), magnitude);
        ds[a] = std::exp(z[a] - lse) * (std::fabs(dp - d_row) + d_radius + 1e-12 * magnitude) * scale *
                (1 + 1e-6);
      }
      for (std::size_t a = 0; a < visible.size(); ++a) {
        const std::size_t j = visible[a];
        for (std::size_t t = 0; t < d; ++t) {
          radii.d_keys(j, t) += ds[a] * e.query_deviation(i, t);
          radii.d_queries(i, t) += ds[a] * e.key_deviation(j, t);
        }
      }
    }
  }
}

}  // namespace sharpcheck::metrics
