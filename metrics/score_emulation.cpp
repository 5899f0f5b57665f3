#include "metrics/score_emulation.hpp"

#include <algorithm>
#include <cmath>

namespace sharpcheck::metrics {
namespace {

constexpr ScoreChain chains[] = {ScoreChain::product_then_scale, ScoreChain::both_prescaled,
                                 ScoreChain::query_prescaled, ScoreChain::scaled_accumulator};

// How far one fp32 step may move a value, relative: its own rounding (2^-24) and the scale's
// conversion to fp32 (2^-24), or a division by fp32(1 / scale) instead of a product with
// fp32(scale) (two roundings of 2^-24); 2^-22 covers each with room for double's own rounding of
// the real product the interval is formed from.
constexpr double fp32_step = 0x1p-22;

// An additive bias at or below this hides its key where the row has a key it does not hide: the
// hidden key's weight is then 0 however the kernel rounds s + b (exp(-1e4) is 0 in every format),
// and the chains add it exactly. Where every key of a row is so biased (a query row of BERT-style
// padding), the row's maximum is itself near -1e4 and the bias is added as any other.
constexpr double hiding_bias = -1e4;

double widen_down(double x) { return x - std::fabs(x) * fp32_step; }
double widen_up(double x) { return x + std::fabs(x) * fp32_step; }

// tanh in fp32 within 2^-20 relative (8 of its ulps at worst: glibc's tanhf is within 2, SLEEF's
// within 1; an approximate tanh such as PTX's tanh.approx, about 2^-11, is not covered), and fp32's
// smallest subnormal where tanh t ~ t is that small.
constexpr double tanh_step = 0x1p-20;
double tanh_down(double t) {
  const double y = std::tanh(t);
  return y - std::fabs(y) * tanh_step - 0x1p-149;
}
double tanh_up(double t) {
  const double y = std::tanh(t);
  return y + std::fabs(y) * tanh_step + 0x1p-149;
}

}  // namespace

constexpr FactorRounding roundings[] = {FactorRounding::fp32, FactorRounding::format_product,
                                        FactorRounding::format_quotient};

std::span<const ScoreChain> score_chains() { return chains; }

std::span<const FactorRounding> factor_roundings() { return roundings; }

// The judge copies a variant whose factors equal the fp32 one's from `rounding` places back
// (metrics/evaluate.cpp): the roundings are the innermost loop, fp32 first, in the enum's order.
static_assert(static_cast<int>(FactorRounding::fp32) == 0 &&
              static_cast<int>(FactorRounding::format_product) == 1 &&
              static_cast<int>(FactorRounding::format_quotient) == 2);

std::vector<ScoreVariant> score_variants(const tensor::HeadScores& scores) {
  static constexpr CapChain no_cap[] = {CapChain::none};
  static constexpr CapChain caps[] = {CapChain::each_step_in_format, CapChain::fp32_on_rounded,
                                      CapChain::fused};
  const std::span<const CapChain> cap_chains =
      scores.softcap != 0.0 ? std::span<const CapChain>(caps) : std::span<const CapChain>(no_cap);
  std::vector<ScoreVariant> variants;
  for (const ScoreChain chain : chains)
    for (const CapChain cap : cap_chains)
      for (const FactorRounding rounding : roundings) variants.push_back({chain, cap, rounding});
  return variants;
}

std::string_view describe(FactorRounding rounding) {
  switch (rounding) {
    case FactorRounding::fp32:
      return "the scale in fp32";
    case FactorRounding::format_product:
      return "the scale rounded to F (torch 1.13's CPU scalars)";
    case FactorRounding::format_quotient:
      return "1/scale rounded to F and divided by";
  }
  return "";
}

std::string_view describe(CapChain cap) {
  switch (cap) {
    case CapChain::none:
      return "";
    case CapChain::each_step_in_format:
      return "soft-cap F(F(tanh(F(s / c))) * c)";
    case CapChain::fp32_on_rounded:
      return "soft-cap F(c tanh(s / c)) in fp32 on the rounded score";
    case CapChain::fused:
      return "soft-cap fused with the score, F(c tanh(s / c))";
  }
  return "";
}

std::string describe(const ScoreVariant& variant) {
  std::string text = std::string(describe(variant.chain)) + ", " + std::string(describe(variant.rounding));
  if (variant.cap != CapChain::none) text += ", " + std::string(describe(variant.cap));
  return text;
}

std::string_view describe(ScoreChain chain) {
  switch (chain) {
    case ScoreChain::product_then_scale:
      return "scores = F(F(q k^T) * scale)";
    case ScoreChain::both_prescaled:
      return "scores = F(F(q * sqrt(scale)) F(k * sqrt(scale))^T)";
    case ScoreChain::query_prescaled:
      return "scores = F(F(q * scale) k^T)";
    case ScoreChain::scaled_accumulator:
      return "scores = F(fp32(q k^T) * scale)";
  }
  return "";
}

bool scores_emulable(const tensor::HeadScores& scores) { return scores.theta == 1.0; }

namespace {

// The factor as the kernel holds it (in the real numbers; fp32's own rounding is in fp32_step).
double held(double factor, FactorRounding rounding, const FloatFormat& format) {
  switch (rounding) {
    case FactorRounding::fp32:
      return factor;
    case FactorRounding::format_product:
      return round_to_format(factor, format);
    case FactorRounding::format_quotient:
      return 1.0 / round_to_format(1.0 / factor, format);
  }
  return factor;
}

}  // namespace

ScoreEmulator::ScoreEmulator(ScoreChain chain, const Matrix& queries, const Matrix& keys,
                             const tensor::HeadScores& scores, const FloatFormat& format,
                             FactorRounding rounding, CapChain cap)
    : chain_(chain), cap_(scores.softcap != 0.0 ? cap : CapChain::none), scores_(scores), format_(format) {
  const double scale = scores.scale ? *scores.scale : 1.0 / std::sqrt(static_cast<double>(queries.cols));
  const double root = held(std::sqrt(scale), rounding, format);
  const double factor = held(scale, rounding, format);
  // A fused epilogue (baddbmm's alpha) keeps the scale in fp32 whatever the scalars' dtype.
  if (chain == ScoreChain::scaled_accumulator && rounding != FactorRounding::fp32) distinct_ = false;
  if (rounding != FactorRounding::fp32 &&
      (chain == ScoreChain::both_prescaled ? root == std::sqrt(scale) : factor == scale))
    distinct_ = false;
  scale_ = factor;
  query_factor_ = chain == ScoreChain::both_prescaled    ? root
                  : chain == ScoreChain::query_prescaled ? factor
                                                         : 1.0;
  key_factor_ = chain == ScoreChain::both_prescaled ? root : 1.0;
  q_ = prepare(queries, query_factor_);
  k_ = prepare(keys, key_factor_);
}

// The operand the kernel multiplies: x rounded to F (the tensors it is handed), then, if a factor
// is applied first, F(fp32(x) * fp32(factor)) computed as the kernel computes it, with the
// interval an honest kernel's product may lie in rounded to F at both ends for the deviation.
ScoreEmulator::Operand ScoreEmulator::prepare(const Matrix& x, double factor) const {
  Operand operand{Matrix(x.rows, x.cols), Matrix(x.rows, x.cols)};
  const auto fp32_factor = static_cast<float>(factor);
  for (std::size_t e = 0; e < x.values.size(); ++e) {
    const double given = round_to_format(x.values[e], format_);
    if (factor == 1.0) {
      operand.centre.values[e] = given;
      continue;
    }
    const double centre =
        round_to_format(static_cast<double>(static_cast<float>(given) * fp32_factor), format_);
    const double real = given * factor;
    const double low = round_to_format(widen_down(real), format_);
    const double high = round_to_format(widen_up(real), format_);
    operand.centre.values[e] = centre;
    operand.deviation.values[e] = std::max(std::fabs(centre - low), std::fabs(high - centre));
  }
  return operand;
}

void ScoreEmulator::finish(double accumulator, double lo, double hi, Score& out) const {
  const auto fp32_scale = static_cast<float>(scale_);
  double centre = 0;
  switch (chain_) {
    case ScoreChain::product_then_scale: {
      const double product = round_to_format(accumulator, format_);
      const double product_low = round_to_format(widen_down(lo), format_);
      const double product_high = round_to_format(widen_up(hi), format_);
      out.before = static_cast<double>(static_cast<float>(product) * fp32_scale);
      centre = round_to_format(out.before, format_);
      out.before_low = widen_down(std::min(product_low * scale_, product_high * scale_));
      out.before_high = widen_up(std::max(product_low * scale_, product_high * scale_));
      break;
    }
    case ScoreChain::both_prescaled:
    case ScoreChain::query_prescaled:
      out.before = accumulator;
      centre = round_to_format(accumulator, format_);
      out.before_low = widen_down(lo);
      out.before_high = widen_up(hi);
      break;
    case ScoreChain::scaled_accumulator:
      out.before = static_cast<double>(static_cast<float>(accumulator) * fp32_scale);
      centre = round_to_format(out.before, format_);
      out.before_low = widen_down(std::min(lo * scale_, hi * scale_));
      out.before_high = widen_up(std::max(lo * scale_, hi * scale_));
      break;
  }
  out.z = centre;
  out.ambiguity = std::max(centre - round_to_format(out.before_low, format_),
                           round_to_format(out.before_high, format_) - centre);
}

// The soft-cap c tanh(s / c) as cap_ says, on the interval of scores the kernel may hold (rounded
// to F, or before that rounding for a fused epilogue): every step monotone in its argument, so the
// interval's ends map to the ends of the next, each fp32 step widened by fp32_step (which also
// covers a product with fp32(1 / c) for the quotient) and the tanh by tanh_step, c held in fp32 or
// in F (the centre holds F(c), as torch 1.13 holds a Python scalar). The centre computes each step
// in IEEE float as the kernel does (tanh from double's, rounded).
void ScoreEmulator::apply_cap(Score& score) const {
  const double c = scores_.softcap, held = round_to_format(c, format_);
  const double c_low = std::min(c, held), c_high = std::max(c, held);
  const auto quotient_low = [&](double x) { return widen_down(x / (x >= 0 ? c_high : c_low)); };
  const auto quotient_high = [&](double x) { return widen_up(x / (x >= 0 ? c_low : c_high)); };
  const auto product_low = [&](double y) { return widen_down(y * (y >= 0 ? c_low : c_high)); };
  const auto product_high = [&](double y) { return widen_up(y * (y >= 0 ? c_high : c_low)); };
  const auto h = static_cast<float>(held);
  const auto fp32_tanh = [](float x) { return static_cast<float>(std::tanh(static_cast<double>(x))); };
  double low = score.z - score.ambiguity, high = score.z + score.ambiguity;
  double tanh_centre = 0;                    // the tanh the kernel's backward forms its slope from
  double slope_low = NAN, slope_high = NAN;  // that tanh's interval, where it is not the score's
  switch (cap_) {
    case CapChain::none:
      return;
    case CapChain::each_step_in_format: {
      const float t = static_cast<float>(round_to_format(static_cast<float>(score.z) / h, format_));
      const float u = static_cast<float>(round_to_format(fp32_tanh(t), format_));
      tanh_centre = static_cast<double>(slope_from_fp32_ ? fp32_tanh(t) : u);
      score.before = static_cast<double>(u * h);
      low = tanh_down(round_to_format(quotient_low(low), format_));
      high = tanh_up(round_to_format(quotient_high(high), format_));
      if (slope_from_fp32_) slope_low = low, slope_high = high;  // the tanh before its rounding
      low = round_to_format(low, format_), high = round_to_format(high, format_);
      break;
    }
    case CapChain::fp32_on_rounded:
      tanh_centre = static_cast<double>(fp32_tanh(static_cast<float>(score.z) / h));
      score.before = static_cast<double>(h * static_cast<float>(tanh_centre));
      low = tanh_down(quotient_low(low)), high = tanh_up(quotient_high(high));
      break;
    case CapChain::fused:
      tanh_centre = static_cast<double>(fp32_tanh(static_cast<float>(score.before) / h));
      score.before = static_cast<double>(h * static_cast<float>(tanh_centre));
      low = tanh_down(quotient_low(score.before_low)), high = tanh_up(quotient_high(score.before_high));
      break;
  }
  // t^2 is convex: over [low, high] it deviates from the centre's most at an end, or at 0 inside.
  if (std::isnan(slope_low)) slope_low = low, slope_high = high;
  const double t2 = tanh_centre * tanh_centre;
  const double least =
      slope_low <= 0 && slope_high >= 0 ? 0.0 : std::min(slope_low * slope_low, slope_high * slope_high);
  score.slope = 1 - t2;
  score.slope_deviation =
      std::max({slope_low * slope_low - t2, slope_high * slope_high - t2, t2 - least, 0.0}) * (1 + 0x1p-40);
  score.before_low = product_low(low);
  score.before_high = product_high(high);
  score.z = round_to_format(score.before, format_);
  score.ambiguity = std::max(score.z - round_to_format(score.before_low, format_),
                             round_to_format(score.before_high, format_) - score.z);
}

// The bias a - slope |distance| added to a score the kernel holds as F's z (within ambiguity).
// The kernel holds the bias in F or in fp32 (the additive part as given, the ALiBi part formed in
// fp32 from the slope held in fp32 or rounded to F first: kernels do not agree), and adds it to the
// rounded score in fp32, rounding the sum to F (or rounding once: the same interval), or before the
// score's own last rounding (a fused epilogue: torch.compile's pointwise fusion, baddbmm with beta
// = 1). Where a head has both an additive bias and ALiBi, the kernel may also round either term, the
// additive one when given off F's grid, or a partial sum to F on the way: three more roundings, u_F
// of the terms' magnitudes each. The centre is the common case: the bias formed in fp32 and rounded
// to F, added in fp32, the sum rounded to F. A bias given as F's values (a bf16 mask tensor) and
// added after the score's rounding leaves no ambiguity but the sum's own rounding ties. Not covered
// (kernels outside fail): ALiBi as slope * key position (BLOOM's and MPT's form, equal only up to a
// per-row shift, rounded at the size of slope * j) and a distance held in F (a bf16 arange).
// `hides`: the head's bias hides this key in a row that has an open key (hiding_bias).
void ScoreEmulator::add_bias(const tensor::HeadScores::BiasTerms& terms, bool hides, Score& score) const {
  const double a = terms.additive, distance = static_cast<double>(terms.distance);
  const double exact = a - terms.slope * distance;
  if (hides) {
    score.z += exact;
    return;
  }
  const auto in_fp32 = static_cast<double>(static_cast<float>(a) -
                                           static_cast<float>(terms.slope) * static_cast<float>(distance));
  const double centre_bias = round_to_format(in_fp32, format_), exact_in_f = round_to_format(exact, format_);
  double low_bias = std::min({centre_bias, exact_in_f, in_fp32});
  double high_bias = std::max({centre_bias, exact_in_f, in_fp32});
  if (terms.slope != 0.0) {  // any fp32 order, from the slope in fp32 or in F; then in F or not
    const double held_slope = a - round_to_format(terms.slope, format_) * distance;
    const double reach = (std::fabs(a) + std::fabs(terms.slope) * distance) * fp32_step;
    double lowest = std::min(exact, held_slope) - reach, highest = std::max(exact, held_slope) + reach;
    if (a != 0.0) {  // both terms: a term or a partial sum rounded to F on the way
      const double steps = format_.unit_roundoff() * (2 * (std::fabs(score.z) + score.ambiguity) +
                                                      3 * std::fabs(a) + 2 * std::fabs(exact));
      lowest -= steps, highest += steps;
    }
    low_bias = std::min({low_bias, lowest, round_to_format(lowest, format_)});
    high_bias = std::max({high_bias, highest, round_to_format(highest, format_)});
  }
  const double centre = round_to_format(
      static_cast<double>(static_cast<float>(score.z) + static_cast<float>(centre_bias)), format_);
  // The kernel's sum lies between the fp32 sums of the ends (fp32 rounding is monotone; the ends'
  // double sum moved outward a step where it was not exact), then F rounds it, once or after fp32.
  const auto end_of = [&](double x, double y, double toward) {
    const double sum = x + y;
    const bool sum_exact = sum - x == y && sum - y == x;
    const double held = sum_exact ? sum : std::nextafter(sum, toward);
    const double rounded = round_to_format(held, format_);
    const double via_fp32 = round_to_format(static_cast<double>(static_cast<float>(held)), format_);
    return toward < 0 ? std::min(rounded, via_fp32) : std::max(rounded, via_fp32);
  };
  const double low = std::min(end_of(score.z - score.ambiguity, low_bias, -INFINITY),
                              round_to_format(widen_down(score.before_low + low_bias), format_));
  const double high = std::max(end_of(score.z + score.ambiguity, high_bias, INFINITY),
                               round_to_format(widen_up(score.before_high + high_bias), format_));
  score.z = centre;
  score.ambiguity = std::max(centre - low, high - centre);
}

// The fp32 accumulator of q'.k' (q', k' the operands' centres, whose products are exact in fp32
// for 16-bit formats) holds the exact dot product up to gamma = (d + 2) 2^-24 times sum |q' k'|
// in any summation order (d - 1 additions; the 2 more cover an fp32 conversion of the result and
// double's own error here), and an honest kernel's operands may differ from the centres by their
// deviations: the interval [dot - E, dot + E] below holds every value it may accumulate.
bool ScoreEmulator::row(std::size_t query, std::span<const std::size_t> visible, EmulatedRow& out) const {
  out.z.clear();
  out.ambiguity.clear();
  out.slope.clear();
  out.slope_deviation.clear();
  const std::size_t d = q_.centre.cols;
  const double gamma = static_cast<double>(d + 2) * 0x1p-24;
  const double* q = q_.centre.row(query).data();
  const double* dq = q_.deviation.row(query).data();
  const bool open_key = std::any_of(visible.begin(), visible.end(), [&](std::size_t j) {
    return !scores_.has_bias() || scores_.bias_terms(query, j).additive > hiding_bias;
  });
  for (const std::size_t j : visible) {
    const double* k = k_.centre.row(j).data();
    const double* dk = k_.deviation.row(j).data();
    double dot = 0, magnitude = 0, moved = 0;
    for (std::size_t t = 0; t < d; ++t) {
      dot += q[t] * k[t];
      magnitude += std::fabs(q[t] * k[t]);
      moved += dq[t] * std::fabs(k[t]) + std::fabs(q[t]) * dk[t] + dq[t] * dk[t];
    }
    const double reach =
        gamma * (magnitude + moved) * (1 + 0x1p-20) + moved + static_cast<double>(d) * 0x1p-149;
    Score score;
    finish(static_cast<double>(static_cast<float>(dot)), dot - reach, dot + reach, score);
    apply_cap(score);
    if (scores_.has_bias()) {
      const tensor::HeadScores::BiasTerms terms = scores_.bias_terms(query, j);
      add_bias(terms, open_key && terms.additive <= hiding_bias, score);
    }
    const double z = score.z, ambiguity = score.ambiguity;
    if (!std::isfinite(z) || !std::isfinite(ambiguity)) return false;
    out.z.push_back(z);
    out.ambiguity.push_back(ambiguity);
    if (cap_ != CapChain::none) {
      out.slope.push_back(score.slope);
      out.slope_deviation.push_back(score.slope_deviation);
    }
  }
  if (scores_.sink) {
    const double sink = round_to_format(*scores_.sink, format_);
    if (!std::isfinite(sink)) return false;
    out.z.push_back(sink);
    out.ambiguity.push_back(std::fabs(sink - *scores_.sink));
  }
  return true;
}

}  // namespace sharpcheck::metrics
