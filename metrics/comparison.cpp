#include "metrics/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "metrics/quantized_weights.hpp"

namespace sharpcheck::metrics {
namespace {
constexpr std::size_t max_described_violations = 8;

void add_violation(Comparison& comparison, std::string text) {
  ++comparison.violation_count;
  if (comparison.violations.size() < max_described_violations)
    comparison.violations.push_back(std::move(text));
}
void add_statistical_violation(Comparison& comparison, std::string text) {
  ++comparison.statistical_violation_count;
  if (comparison.statistical_violations.size() < max_described_violations)
    comparison.statistical_violations.push_back(std::move(text));
}

// A finding about a whole row, head or gradient (a scale, D's direction): it names a cause, so it
// is described ahead of the elements' findings, and kept when they have filled the list.
void add_whole_finding(Comparison& comparison, std::string text) {
  ++comparison.statistical_violation_count;
  auto& described = comparison.statistical_violations;
  if (comparison.whole_findings >= max_described_violations) return;  // the list holds only such findings
  described.insert(described.begin() + static_cast<std::ptrdiff_t>(comparison.whole_findings),
                   std::move(text));
  ++comparison.whole_findings;
  if (described.size() > max_described_violations) described.pop_back();
}
}  // namespace

double alike_roundings_noise(std::vector<ValueAndBound>& elements) {
  std::sort(elements.begin(), elements.end(), [](const ValueAndBound& a, const ValueAndBound& b) {
    return std::isnan(b.value) ? !std::isnan(a.value) : a.value < b.value;  // NaNs last: a strict order
  });
  double squares = 0;
  for (std::size_t first = 0; first < elements.size();) {
    double alike = elements[first].bound;
    std::size_t last = first + 1;  // a NaN value stands alone
    while (last < elements.size() && elements[last].value == elements[first].value)
      alike += elements[last++].bound;
    squares += alike * alike;
    first = last;
  }
  return squares;
}

std::string ElementReport::describe() const {
  std::ostringstream text;
  text << "row " << row << " index " << index << ": expected " << hex_float(expected) << " got "
       << hex_float(actual);
  if (ulps) {
    text << " (" << *ulps << " ulp";
  } else {
    text << " (no ulp distance";
  }
  text << ", |error| " << std::fabs(actual - expected) << " vs allowed " << allowed << ", bound ratio "
       << bound_ratio << ")";
  return text.str();
}

std::string Comparison::failure_summary(Tier strictest) const {
  if (violation_count > 0) {
    return "tolerance table, proven tier: " + std::to_string(violation_count) + " violations; worst " +
           worst.describe();
  }
  if (strictest == Tier::proven || statistical_violation_count == 0) return "";
  std::ostringstream text;
  text << "tolerance table, statistical tier (within the proven bound: ratio " << max_bound_ratio
       << "): " << statistical_violation_count << " violations; first " << statistical_violations.front();
  return text.str();
}

void Comparison::merge(const Comparison& other) {
  const bool take_worst = elements == 0 || other.max_bound_ratio > max_bound_ratio;
  const bool take_worst_statistical = elements == 0 || other.max_statistical_ratio > max_statistical_ratio;
  const double total_ulps =
      mean_ulps * static_cast<double>(elements) + other.mean_ulps * static_cast<double>(other.elements);
  rows += other.rows;
  elements += other.elements;
  mean_ulps = elements == 0 ? 0 : total_ulps / static_cast<double>(elements);
  max_ulps = std::max(max_ulps, other.max_ulps);
  max_absolute_error = std::max(max_absolute_error, other.max_absolute_error);
  max_relative_error = std::max(max_relative_error, other.max_relative_error);
  max_sum_error = std::max(max_sum_error, other.max_sum_error);
  argmax_disagreements += other.argmax_disagreements;
  max_kl_divergence = std::max(max_kl_divergence, other.max_kl_divergence);
  false_zeros += other.false_zeros;
  non_finite += other.non_finite;
  if (take_worst) worst = other.worst;
  max_bound_ratio = std::max(max_bound_ratio, other.max_bound_ratio);
  violation_count += other.violation_count;
  element_violation_count += other.element_violation_count;
  for (const auto& text : other.violations) {
    if (violations.size() < max_described_violations) violations.push_back(text);
  }
  if (take_worst_statistical) worst_statistical = other.worst_statistical;
  max_statistical_ratio = std::max(max_statistical_ratio, other.max_statistical_ratio);
  max_bias_ratio = std::max(max_bias_ratio, other.max_bias_ratio);
  max_row_scale_ratio = std::max(max_row_scale_ratio, other.max_row_scale_ratio);
  statistical_violation_count += other.statistical_violation_count;
  // Whole-row, head and gradient findings stay ahead of the elements' (add_whole_finding): the
  // other's come after this one's and before this one's element findings.
  const auto whole_end = [](const Comparison& c) {
    return c.statistical_violations.cbegin() +
           static_cast<std::ptrdiff_t>(std::min(c.whole_findings, c.statistical_violations.size()));
  };
  std::vector<std::string> described(statistical_violations.cbegin(), whole_end(*this));
  described.insert(described.end(), other.statistical_violations.cbegin(), whole_end(other));
  const std::size_t whole = described.size();
  described.insert(described.end(), whole_end(*this), statistical_violations.cend());
  described.insert(described.end(), whole_end(other), other.statistical_violations.cend());
  if (described.size() > max_described_violations) described.resize(max_described_violations);
  statistical_violations = std::move(described);
  whole_findings = std::min(whole, max_described_violations);
  informative += other.informative;
}

namespace {

// Argmax of row r: judged only where the reference's top two are farther apart than their bounds.
void judge_argmax(const Matrix& expected, const Matrix& actual, std::size_t r,
                  const std::vector<double>& allowed, std::size_t row_number, Comparison& result) {
  std::size_t top = 0;
  for (std::size_t j = 1; j < expected.cols; ++j) {
    if (expected(r, j) > expected(r, top)) top = j;
  }
  double runner_up = -INFINITY;
  std::size_t runner_up_index = top;
  for (std::size_t j = 0; j < expected.cols; ++j) {
    if (j != top && expected(r, j) > runner_up) {
      runner_up = expected(r, j);
      runner_up_index = j;
    }
  }
  if (runner_up_index == top || expected(r, top) - runner_up <= allowed[top] + allowed[runner_up_index])
    return;
  const double kernel_best = *std::max_element(actual.row(r).begin(), actual.row(r).end());
  if (!(actual(r, top) >= kernel_best)) {
    ++result.argmax_disagreements;
    add_violation(result,
                  "row " + std::to_string(row_number) + ": argmax moved from index " + std::to_string(top));
  }
}

// A distribution row's sums, gathered element by element.
struct RowSums {
  double actual = 0;               // sum_j a_j
  double allowed = 0;              // the proven allowance of |sum - 1|
  double signed_error = 0;         // sum_j (a_j - e_j)
  double magnitude = 0;            // sum_j |e_j|
  std::vector<double> magnitudes;  // each |e_j|: equal ones round alike (judge_bias groups them)
  double kl = 0;
  void add(double e, double a, double allowed_error, const FloatFormat& output) {
    actual += a;
    allowed += allowed_error + std::fabs(e) * output.unit_roundoff();
    signed_error += a - e;
    magnitude += std::fabs(e);
    magnitudes.push_back(std::fabs(e));
    if (e > 0) kl += a > 0 ? e * std::log(e / a) : std::numeric_limits<double>::infinity();
  }
};

void judge_row_sum(const RowSums& sums, std::size_t columns, std::size_t row_number, Comparison& result) {
  const double sum_error = std::fabs(sums.actual - 1);
  result.max_sum_error = std::max(result.max_sum_error, std::isnan(sum_error) ? INFINITY : sum_error);
  const double allowed_sum = sums.allowed + static_cast<double>(columns) * 0x1p-52;
  if (!(sum_error <= allowed_sum)) {
    add_violation(result, "row " + std::to_string(row_number) + ": |sum - 1| = " + std::to_string(sum_error) +
                              " exceeds " + std::to_string(allowed_sum));
  }
}

// The bias test of the statistical tier: the signed errors of a softmax row summed. Why it is
// bounded: a kernel's p~_j = w~_j / S~ (or w~_j fl(1 / S~)), so sum_j p~_j = (sum_j w~_j) / S~ times
// the common rounding of a reciprocal: every exp's and every argument's error cancels, and what is
// left is S~'s own summation error, the common factors (a reciprocal, a tile's rescaling), and each
// element's output rounding (the kernel's and the reference's). The first two are at most the
// entry's statistical relative allowance at z_j = 0 (its per_item, constant and spread terms) times
// sum_j |e_j|. The roundings, bounded by c_j = (2 u + 2 u_out) |e_j|, are independent between
// distinct values but identical between equal ones (a uniform row rounds every 1/n alike), so they
// are summed as one variable per group g of equal |e_j|, bounded by m_g c_g: by Hoeffding's
// inequality their sum exceeds lambda sqrt(sum_g (m_g c_g)^2) with probability at most
// 2 exp(-lambda^2 / 2) (below 2.6e-14 at lambda = 8). The absolute floor is one-sided where the
// exact value is below it (a probability is never negative), so it counts in full: n floor (it
// makes the test void on grids as coarse as int8's, and costs nothing in fp32). A kernel that
// scales every output by (1 + b) shows as b sum_j |e_j| here even where b is inside each
// element's allowance.
double rounding_noise(const std::vector<double>& magnitudes, double per_element) {
  std::vector<ValueAndBound> elements;
  elements.reserve(magnitudes.size());
  for (const double m : magnitudes) elements.push_back({m, per_element * m});
  return statistical_lambda * std::sqrt(alike_roundings_noise(elements));
}

void judge_bias(RowSums& sums, std::size_t columns, const Tolerance& tolerance, const RowScale& row,
                const FloatFormat& output, std::size_t row_number, Comparison& result) {
  const double floor = absolute_floor(tolerance, row, output);
  const double common = allowed_error(tolerance, 1.0, 0.0, row, output, Tier::statistical) - floor;
  const double per_element = 2 * tolerance.accumulation->unit_roundoff() + 2 * output.unit_roundoff();
  const double allowed = (common * sums.magnitude + rounding_noise(sums.magnitudes, per_element) +
                          static_cast<double>(columns) * floor) *
                         (1 + 0x1p-20);
  const double ratio = std::isnan(sums.signed_error) ? INFINITY : std::fabs(sums.signed_error) / allowed;
  result.max_bias_ratio = std::max(result.max_bias_ratio, ratio);
  if (!(ratio <= 1)) {
    add_statistical_violation(result, "row " + std::to_string(row_number) + ": signed errors sum to " +
                                          std::to_string(sums.signed_error) +
                                          ", a systematic bias (allowed " + std::to_string(allowed) +
                                          ", bias ratio " + std::to_string(ratio) + ")");
  }
}

// One element under both tiers: its report (proven allowance) and its statistical bound ratio.
struct JudgedElement {
  ElementReport report;
  double statistical_allowed = 0;
  double statistical_ratio = 0;
};

// An expected NaN is the correctly rounded value in a format whose overflow is NaN (fp8 e4m3): a
// NaN output matches it exactly, as an infinite output matches the same infinity.
double bound_ratio(double expected, double actual, double allowed) {
  if (actual == expected || (std::isnan(actual) && std::isnan(expected))) return 0;
  if (!std::isfinite(actual) && std::isfinite(expected)) return std::numeric_limits<double>::infinity();
  const double error = std::fabs(actual - expected);
  return error == 0 ? 0 : error / allowed;
}

// The statistical allowance with the recipe's inside roundings charged for this element's data
// (ComparisonInput::inside): the recipe's other terms (statistical tier), plus Hoeffding's charge
// of P's roundings (lambda u_P spread, p grown by at most exp(2 eps) by the scores' roundings)
// and of the scores' (lambda 2.0001 u_S spread plus the second order, over W >= exp(-eps)), plus
// the second order of a rounded P (a product of two roundings, at most 4 u_P^2 M).
double inside_charge(const ComparisonInput& input, const Tolerance& tolerance, const FloatFormat& output,
                     std::size_t r, std::size_t j) {
  const InsideSpreads& inside = *input.inside;
  const bool centred = inside.centre.cols > 0;
  Tolerance rest = centred && inside.centre_tolerance != nullptr ? *inside.centre_tolerance : tolerance;
  const bool p_charged = tolerance.probabilities_in_output > 0 && inside.p.cols > 0;
  const bool s_charged = tolerance.scores_in_output > 0 && inside.s.cols > 0;
  if (p_charged) rest.probabilities_in_output = 0;
  if (s_charged) rest.scores_in_output = 0;
  if (inside.weights_emulated) rest = around_emulated_weights(rest);
  const double magnitude = centred ? inside.centre_magnitude(r, j) : (*input.magnitudes)(r, j);
  double rounded = input.output_rounding_of_expected ? std::fabs((*input.expected)(r, j)) : -1;
  // Judged around the emulated centre o~, the kernel's own output rounding is u_out |y| with
  // |y| near |o~|, which may exceed |expected| where o cancels: the larger is charged.
  if (centred && rounded >= 0) rounded = std::max(rounded, std::fabs(inside.centre(r, j)));
  const auto unit = [&](const FloatFormat* format) {
    return (format != nullptr ? *format : output).unit_roundoff();
  };
  const double u_p = p_charged ? unit(tolerance.probability_format) : 0.0;
  const double u_s = s_charged ? unit(tolerance.score_format) : 0.0;
  const double growth = std::exp(2.0001 * u_s * input.scales[r].largest_score);
  // Around an emulated centre, P's spread is the emulated weights' own (no growth), and the fp32
  // terms, evaluated at the exact row's |z|, are grown instead: the emulated |z~| exceed them by
  // at most the scores' two roundings.
  const double p_growth = centred ? 1.0 : growth;
  double charge = 0;
  // The roundings' products, in full: 4 u_P^2 M for P's rounding (and its row sum's); the math
  // path's backward rounds P, dP and dS (dS twice after an inexact scale): 9 u^2 (1 + u) <= 10 u^2.
  const double second_order = tolerance.probabilities_in_output >= 3 ? 10.0 : 4.0;
  if (p_charged)
    charge += statistical_lambda * u_p * inside.p(r, j) * p_growth * p_growth +
              second_order * u_p * u_p * magnitude;
  if (centred)  // the emulation's ambiguity: spreads already in the scores' units and over W
    charge += statistical_lambda * inside.s(r, j) + inside.s_second(r, j) +
              (inside.centre_slack.cols > 0 ? inside.centre_slack(r, j) : 0.0);
  else if (s_charged)
    charge += growth * (statistical_lambda * 2.0001 * u_s * inside.s(r, j) + inside.s_second(r, j));
  return allowed_error(rest, magnitude, (*input.z_magnitudes)(r, j), input.scales[r], output,
                       Tier::statistical, rounded) *
             (centred ? growth : 1.0) +
         charge * (1 + 0x1p-20);
}

// A kernel that flushes results below the normal range to zero (a GPU's -ftz, oneDNN's and MKL's
// denormals modes, in fp32 arithmetic) returns 0 where its own result, within `reach` (a tier's
// allowance) of the exact one, is subnormal in fp32's range (fp32, bf16 outputs): that zero is
// allowed (flushed_output), and the element then informs nothing (is_informative); fp16's and the FP8
// formats' own subnormals are not flushed by those modes. Its fp32 sums may drop each of their n
// terms that falls below 2^-126 as well: (n + 1) 2^-126 more, absolute (flushed_terms), for any output of
// at most fp32's precision.
double flushed_terms(const FloatFormat& output, std::size_t n) {
  return output.precision() <= 24 ? static_cast<double>(n + 1) * 0x1p-126 : 0.0;
}
double flushed_output(double expected, double reach, const FloatFormat& output) {
  const bool flushable = output.precision() <= 24 && output.min_normal_exponent <= -126 && expected != 0 &&
                         std::fabs(expected) - reach < std::ldexp(1.0, output.min_normal_exponent);
  return flushable ? std::fabs(expected) * (1 + 0x1p-20) : 0.0;
}

JudgedElement judge_element(const ComparisonInput& input, const Tolerance& tolerance,
                            const FloatFormat& output, std::size_t r, std::size_t j) {
  const double e = (*input.expected)(r, j);
  const double a = (*input.actual)(r, j);
  const double magnitude = (*input.magnitudes)(r, j);
  const double z_magnitude = (*input.z_magnitudes)(r, j);
  const double additional = input.additional != nullptr ? (*input.additional)(r, j) : 0.0;
  const RowScale& scale = input.scales[r];
  const double rounded = input.output_rounding_of_expected ? std::fabs(e) : -1;
  JudgedElement judged;
  // A NaN allowance (inf - inf or 0 * inf in its terms, from scores that overflow double) allows
  // nothing to be told apart: it counts as infinite, so the element is not informative (and the
  // case inconclusive when nothing else is) rather than failing an exact output moved by an ulp.
  const auto cannot_judge_if_nan = [](double value) { return std::isnan(value) ? INFINITY : value; };
  const double extra = additional + flushed_terms(output, scale.n);
  // The allowance of a tier: its output rounding charged in full, or, where that is the expected
  // value's own rounding, as far as RN(o^) can land from it (rounded_reach), whichever is smaller.
  const auto tier_allowance = [&](Tier tier) {
    const AllowanceParts parts =
        allowance_parts(tolerance, magnitude, z_magnitude, scale, output, tier, rounded);
    if (rounded < 0) return parts.full + extra;
    return std::min(parts.full + extra, rounded_reach(e, parts.before_rounding + extra, output));
  };

  const double reach = tier_allowance(Tier::proven);
  const double allowed = cannot_judge_if_nan(std::max(reach, flushed_output(e, reach, output)));
  judged.report = {input.first_row_number + r, j, e, a, std::nullopt, allowed, bound_ratio(e, a, allowed)};
  if (is_representable(a, output)) judged.report.ulps = ulp_distance(a, e, output);
  // At n <= lambda^2 the tiers charge the same length: one evaluation serves both.
  judged.statistical_allowed =
      charged_length(static_cast<double>(scale.n), Tier::statistical) == static_cast<double>(scale.n) &&
              tolerance.logarithm == 0
          ? allowed
          : tier_allowance(Tier::statistical);
  const bool centred = input.inside != nullptr && input.inside->centre.cols > 0;
  if (centred) {
    // Emulated scores: the statistical tier is judged around o~ alone (an allowance around the
    // exact o would charge the very roundings the emulation knows).
    judged.statistical_allowed = inside_charge(input, tolerance, output, r, j) + extra;
  } else if (input.inside != nullptr &&
             (tolerance.probabilities_in_output > 0 || tolerance.scores_in_output > 0)) {
    judged.statistical_allowed =
        std::min(judged.statistical_allowed, inside_charge(input, tolerance, output, r, j) + extra);
  }
  // Each tier flushes what its own reach makes subnormal.
  judged.statistical_allowed = cannot_judge_if_nan(
      std::max(judged.statistical_allowed, flushed_output(e, judged.statistical_allowed, output)));
  const bool matches = a == e || (std::isnan(a) && std::isnan(e));
  judged.statistical_ratio = centred && !matches
                                 ? bound_ratio(input.inside->centre(r, j), a, judged.statistical_allowed)
                                 : bound_ratio(e, a, judged.statistical_allowed);
  return judged;
}

bool is_informative(double expected, const FloatFormat& output) {
  return expected != 0 && std::fabs(expected) != 1 &&
         std::fabs(expected) >= std::ldexp(4.0, output.min_subnormal_exponent());
}

// Folds one judged element into the comparison's figures.
void record_element(const JudgedElement& judged, const FloatFormat& output, double relative_floor, bool first,
                    double& total_ulps, Comparison& result) {
  const ElementReport& element = judged.report;
  const double error = std::fabs(element.actual - element.expected);
  if (!std::isfinite(element.actual) && std::isfinite(element.expected)) {
    ++result.non_finite;
  } else {
    result.max_absolute_error = std::max(result.max_absolute_error, error);
    result.max_relative_error =
        std::max(result.max_relative_error, error / std::max(std::fabs(element.expected), relative_floor));
  }
  if (element.ulps) {
    result.max_ulps = std::max(result.max_ulps, *element.ulps);
    total_ulps += static_cast<double>(*element.ulps);
  }
  if (element.actual == 0 && element.expected != 0) ++result.false_zeros;
  // An element whose allowance is infinite or NaN cannot tell any value from another (scores whose
  // rounding error alone is beyond e^700, say), nor one whose allowance reaches |expected| (the
  // math path's bf16 scores at |z| ~ 500: 0 and the value's negation both fit, and a dQ missing its
  // softmax scale, 7x off, passed at ratio 0.07): it does not count as informative.
  const double smallest_allowance = std::min(element.allowed, judged.statistical_allowed);
  if (is_informative(element.expected, output) && std::isfinite(element.allowed) &&
      smallest_allowance < std::fabs(element.expected))
    ++result.informative;
  if (!(element.bound_ratio <= 1)) {
    ++result.element_violation_count;
    add_violation(result, element.describe());
  } else if (!(judged.statistical_ratio <= 1)) {
    ElementReport statistical = element;
    statistical.allowed = judged.statistical_allowed;
    statistical.bound_ratio = judged.statistical_ratio;
    add_statistical_violation(result, statistical.describe());
  }
  if (first || element.bound_ratio > result.max_bound_ratio ||
      (element.bound_ratio == result.max_bound_ratio &&
       element.ulps.value_or(0) > result.worst.ulps.value_or(0))) {
    result.worst = element;
    result.max_bound_ratio = element.bound_ratio;
  }
  if (first || judged.statistical_ratio > result.max_statistical_ratio) {
    result.worst_statistical = element;
    result.worst_statistical.allowed = judged.statistical_allowed;
    result.worst_statistical.bound_ratio = judged.statistical_ratio;
    result.max_statistical_ratio = judged.statistical_ratio;
  }
}

}  // namespace

void record_scale(Comparison& comparison, const std::string& what, double deviation, double allowed) {
  // An allowance that is NaN (scores that overflow double) cannot judge a scale; the elements'
  // own verdicts stand.
  if (std::isnan(allowed)) return;
  double ratio = deviation / allowed;
  if (std::isnan(ratio)) ratio = INFINITY;  // a NaN in either is a failure, and reported as one
  comparison.max_row_scale_ratio = std::max(comparison.max_row_scale_ratio, ratio);
  if (ratio <= 1) return;
  std::ostringstream text;
  text << what << ": the scale is off by " << deviation * 100 << "% (allowed " << allowed * 100
       << "% for the recipe's roundings; scale ratio " << ratio
       << "): mis-normalised or mis-scaled (a denominator summed in low precision, a missed rescale, a "
          "scale applied twice?)";
  add_whole_finding(comparison, text.str());
}

void record_scale_spread(Comparison& comparison, std::size_t rows, double rms, double allowed_rms,
                         double ratio) {
  if (std::isnan(ratio)) ratio = INFINITY;
  comparison.max_row_scale_ratio = std::max(comparison.max_row_scale_ratio, ratio);
  if (ratio <= 1) return;
  std::ostringstream text;
  text << "the " << rows << " rows' scales together: their errors spread " << rms * 100
       << "% (root mean square; "
       << "the recipe's roundings allow " << allowed_rms * 100 << "%; spread ratio " << ratio
       << "): rows mis-normalised at random (a denominator summed in low precision?)";
  add_whole_finding(comparison, text.str());
}

void record_d_direction(Comparison& comparison, const DirectionFinding& finding) {
  comparison.max_row_scale_ratio =
      std::max({comparison.max_row_scale_ratio, finding.worst_ratio, finding.spread_ratio});
  const char* cause = ": D = rowsum(dO * O) is wrong (computed from part of dO, a stale or mis-scaled O?)";
  if (finding.failing > 0) {
    std::ostringstream text;
    text << "dQ moves along D's direction sum_j P_ij dz/dr k_j beyond its roundings in " << finding.failing
         << " of " << finding.rows << " rows (worst: row " << finding.worst_row << ", ratio "
         << finding.worst_ratio << ")" << cause;
    add_whole_finding(comparison, text.str());
  }
  if (finding.spread_ratio > 1) {
    std::ostringstream text;
    text << "dQ's " << finding.rows << " rows together move along D's direction wider than their roundings "
         << "allow (spread ratio " << finding.spread_ratio << ")" << cause;
    add_whole_finding(comparison, text.str());
  }
}

void record_row_scale(Comparison& comparison, std::size_t row_number, double deviation, double allowed) {
  record_scale(comparison, "row " + std::to_string(row_number), deviation, allowed);
}

Comparison compare(const ComparisonInput& input, const Tolerance& tolerance, const FloatFormat& output) {
  const Matrix& expected = *input.expected;
  const Matrix& actual = *input.actual;
  Comparison result;
  result.rows = expected.rows;
  result.elements = expected.rows * expected.cols;
  const double relative_floor = std::ldexp(1.0, output.min_normal_exponent);
  double total_ulps = 0;
  for (std::size_t r = 0; r < expected.rows; ++r) {
    RowSums sums;
    if (input.rows_are_distributions) sums.magnitudes.reserve(expected.cols);
    std::vector<double> allowed(expected.cols);
    for (std::size_t j = 0; j < expected.cols; ++j) {
      const JudgedElement judged = judge_element(input, tolerance, output, r, j);
      allowed[j] = judged.report.allowed;
      if (input.allowed != nullptr) (*input.allowed)(r, j) = allowed[j];
      record_element(judged, output, relative_floor, r == 0 && j == 0, total_ulps, result);
      if (input.rows_are_distributions)
        sums.add(judged.report.expected, judged.report.actual, allowed[j], output);
    }
    if (!input.rows_are_distributions || expected.cols == 0) continue;
    const std::size_t row_number = input.first_row_number + r;
    judge_row_sum(sums, expected.cols, row_number, result);
    judge_bias(sums, expected.cols, tolerance, input.scales[r], output, row_number, result);
    result.max_kl_divergence = std::max(result.max_kl_divergence, sums.kl);
    judge_argmax(expected, actual, r, allowed, row_number, result);
  }
  result.mean_ulps = result.elements == 0 ? 0 : total_ulps / static_cast<double>(result.elements);
  return result;
}

}  // namespace sharpcheck::metrics
