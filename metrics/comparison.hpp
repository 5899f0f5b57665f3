// Kernel output against the correctly rounded reference: per-element ulp, absolute and relative
// error, per-row sum, argmax, KL divergence and false zeros, the worst element named exactly,
// and the verdict of the tolerance table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "metrics/tolerance_table.hpp"

namespace sharpcheck::metrics {

struct ElementReport {
  std::size_t row = 0;
  std::size_t index = 0;
  double expected = 0;  // the correctly rounded reference value
  double actual = 0;
  std::optional<std::uint64_t> ulps;  // absent when one side is NaN
  double allowed = 0;
  double bound_ratio = 0;                      // |actual - expected| / allowed; > 1 fails
  [[nodiscard]] std::string describe() const;  // hex floats and figures, for reports
};

struct Comparison {
  std::size_t rows = 0;
  std::size_t elements = 0;
  std::uint64_t max_ulps = 0;
  double mean_ulps = 0;
  double max_absolute_error = 0;
  double max_relative_error = 0;         // relative to max(|expected|, the output's smallest normal)
  double max_sum_error = 0;              // |sum(actual) - 1| over rows that are distributions
  std::size_t argmax_disagreements = 0;  // only where the reference's top two are separated by their bounds
  double max_kl_divergence = 0;          // KL(reference || kernel) in nats; infinite on a false zero
  std::size_t false_zeros = 0;           // actual exactly 0 where the reference is not
  std::size_t non_finite = 0;            // NaN or infinity where the reference is finite
  double max_bound_ratio = 0;
  ElementReport worst;                      // the element with the largest bound ratio
  std::size_t violation_count = 0;          // elements and rows (a distribution's sum) outside the bound
  std::size_t element_violation_count = 0;  // of those, the elements
  std::vector<std::string> violations;      // the first few, described

  // The statistical tier (metrics/tolerance_table.hpp): each element against its statistical
  // allowance and, for distributions, each row's signed error sum sum_j (actual_j - expected_j)
  // against its bias allowance (derivation in comparison.cpp).
  std::size_t statistical_violation_count = 0;
  std::vector<std::string> statistical_violations;  // the first few, described (element or row)
  std::size_t whole_findings = 0;  // how many of them, first, are about a whole row, head or gradient
  double max_statistical_ratio = 0;
  ElementReport worst_statistical;  // the element with the largest statistical bound ratio
  double max_bias_ratio = 0;        // the worst row's |signed error sum| over its allowance
  // Attention: the worst row's scale error over its allowance (the row-scale test, evaluate.cpp).
  double max_row_scale_ratio = 0;

  // Elements whose expected value can tell a right output from a wrong one: not 0, not +-1, above
  // the smallest few subnormals of the output format (where the absolute floor decides), and with
  // a finite allowance.
  std::size_t informative = 0;

  // Passes the proven tier, and the statistical one unless only the proven tier is asked for.
  [[nodiscard]] bool passed(Tier strictest = Tier::statistical) const {
    return violation_count == 0 && (strictest == Tier::proven || statistical_violation_count == 0);
  }
  // A case that cannot discriminate (oneDNN benchdnn's MISTRUSTED): under 1% of its elements are
  // informative. It is reported as inconclusive, never as a plain pass.
  [[nodiscard]] bool inconclusive() const { return informative * 100 < elements || elements == 0; }
  // One line for a report: which tier failed, how often, and the first element or row that did.
  [[nodiscard]] std::string failure_summary(Tier strictest = Tier::statistical) const;
  // Folds another comparison (other rows of the same kernel) into this one.
  void merge(const Comparison& other);
};

// The output roundings' sub-Gaussian proxy squared, for a projected test: each element's rounding
// bound (|w| u_out |y|) an independent source, except that elements with the same exact value are
// rounded alike by an honest kernel (a constant V makes every output of a row one value, computed
// one way) and count as one source of their summed bound. Sorts `elements` by value.
struct ValueAndBound {
  double value = 0, bound = 0;
};
[[nodiscard]] double alike_roundings_noise(std::vector<ValueAndBound>& elements);

// What a recipe's roundings inside a kernel can do to each element, for the element's own data
// (metrics/recipes.cpp): P's rounding moves it by at most lambda u_P p (statistical tier), the
// scores' rounding by lambda 2.0001 u_S s plus s_second (first and second order; both over the
// denominator's least value exp(-eps), eps = 2.0001 u_S max|z|). Matrices of the compared shape; a
// matrix with no columns charges nothing of its kind.
// A recipe whose scores are emulated (metrics/score_emulation.hpp) also gives the centre its
// statistical tier is judged around, the exact attention o~ of the emulated scores (in double),
// and that centre's magnitude sum_j p~_j |v_jc|; `s_second` then holds what the scores an honest
// kernel may form otherwise can move it (charged in full), and `s` is 0.
// A kernel whose rounded weights are emulated (metrics/quantized_weights.hpp) gives its centre the
// same way, from its own rounded weights: neither P's rounding nor its subnormal floor is then
// charged around it (`weights_emulated`), and `s_second` holds what the ambiguous codes' flips can do.
struct InsideSpreads {
  Matrix p, s, s_second;
  Matrix centre, centre_magnitude;  // no columns: not emulated
  bool weights_emulated = false;
  // Optional: how far the centre may be from the kernel's own, absolute (the statistical tier's).
  Matrix centre_slack{};
  // Optional: the entry the tier around the centre charges its fp32 arithmetic by (the attention
  // backward's leaves out the scores' dot products, which the emulation's slack covers); nullptr:
  // the comparison's own.
  const Tolerance* centre_tolerance = nullptr;
};

// The inputs of a comparison, row by row. `magnitudes` and `z_magnitudes` give, per element,
// the magnitude its bound is relative to and |z_j| (see tolerance_table.hpp).
struct ComparisonInput {
  const Matrix* expected = nullptr;
  const Matrix* actual = nullptr;
  const Matrix* magnitudes = nullptr;
  const Matrix* z_magnitudes = nullptr;
  std::vector<RowScale> scales;        // one per row
  bool rows_are_distributions = true;  // softmax rows: check sum, argmax and KL
  std::size_t first_row_number = 0;    // row numbers in reports start here
  Matrix* allowed = nullptr;           // optional: receives each element's allowed error
  // Optional: an absolute allowance added to each element's (a log's own rounding, which scales
  // with the log's size rather than with the bound's magnitude).
  const Matrix* additional = nullptr;
  // Attention: the output rounding is charged relative to |expected|, not to the magnitude
  // (allowed_error's rounded_value; derivation in tolerance_table.cpp).
  bool output_rounding_of_expected = false;
  // Optional (a recipe that rounds inside the kernel): per element, the spreads of those roundings
  // for this row's data (InsideSpreads); the statistical tier charges them (Hoeffding) in place of
  // the worst case where that is smaller.
  const InsideSpreads* inside = nullptr;
};

// Records a row's scale error against its allowance (the row-scale test of evaluate.cpp) as a
// statistical-tier finding of `comparison`.
void record_row_scale(Comparison& comparison, std::size_t row_number, double deviation, double allowed);
// The same for any group of elements, named in the message ("dQ as a whole").
void record_scale(Comparison& comparison, const std::string& what, double deviation, double allowed);
// The rows' scale errors spread wider than their roundings allow (HeadScale, inside_rounding.hpp):
// `ratio` above 1 is a statistical-tier finding, `rows` how many were pooled, `rms` their relative
// scale errors' root mean square and `allowed_rms` what the recipe's roundings allow it.
void record_scale_spread(Comparison& comparison, std::size_t rows, double rms, double allowed_rms,
                         double ratio);
// The D-direction test (metrics/judge_backward.cpp): dQ's rows moved along D's direction beyond
// their roundings, `failing` of `rows` rows alone (the worst, `worst_row`, at `worst_ratio`) and
// all `rows` together at `spread_ratio` (0: not pooled); either ratio above 1 is a finding.
struct DirectionFinding {
  std::size_t rows = 0, failing = 0, worst_row = 0;
  double worst_ratio = 0, spread_ratio = 0;
};
void record_d_direction(Comparison& comparison, const DirectionFinding& finding);

[[nodiscard]] Comparison compare(const ComparisonInput& input, const Tolerance& tolerance,
                                 const FloatFormat& output);

}  // namespace sharpcheck::metrics
