#include "reference/attention_backward_exact.hpp"

#include <gmp.h>

#include <algorithm>
#include <cmath>

#include "reference/attention_row.hpp"

namespace sharpcheck::reference {
namespace {

bool is_zero(const Rational& x) { return mpq_sgn(x.get()) == 0; }
bool equal(const Rational& x, const Rational& y) { return mpq_equal(x.get(), y.get()) != 0; }

// sum += term * factor (factor an exact double).
void add_times(Rational& sum, const Rational& term, double factor) {
  Rational product(factor);
  mpq_mul(product.get(), product.get(), term.get());
  mpq_add(sum.get(), sum.get(), product.get());
}

}  // namespace

BackwardExactCases::BackwardExactCases(const tensor::AttentionBackwardProblem& in,
                                       const std::vector<tensor::HeadScores>& heads)
    : in_(in), heads_(heads), rows_(in.queries.rows) {}

// s for row i's head, when rational: its given scale, or 1/k for d = k^2.
std::optional<Rational> BackwardExactCases::scale_of(std::size_t i) const {
  return rational_scale(heads_[i / in_.positions()], in_.queries.cols);
}

bool BackwardExactCases::visible(std::size_t i, std::size_t j) const {
  const std::size_t positions = in_.positions();
  return heads_[i / positions].sees(i % positions, j);
}

// A cheap refusal before exact work: two logits whose double estimates differ by more than both
// estimates' error bounds (generous: (d + 8) 2^-50 of the magnitudes summed) are distinct.
bool BackwardExactCases::clearly_two_groups(std::size_t i, const std::vector<std::size_t>& keys) const {
  const std::size_t positions = in_.positions(), d = in_.queries.cols;
  const tensor::HeadScores& head = heads_[i / positions];
  const double s = head.scale ? *head.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const double relative = static_cast<double>(d + 8) * 0x1p-50;
  double first = 0.0, first_error = 0.0;
  for (std::size_t a = 0; a < keys.size(); ++a) {
    double dot = 0.0, magnitude = 0.0;
    for (std::size_t t = 0; t < d; ++t) {
      dot += in_.queries(i, t) * in_.keys(keys[a], t);
      magnitude += std::abs(in_.queries(i, t) * in_.keys(keys[a], t));
    }
    const double bias = head.bias_of(i % positions, keys[a]);
    // With a soft-cap the groups are pairs (s a, b): the scaled dot decides alone when it differs.
    const bool pairs = head.softcap != 0.0;
    const double logit = pairs ? s * dot : s * dot + bias;
    const double error = relative * (std::abs(s) * magnitude + (pairs ? 0.0 : std::abs(bias))) + 0x1p-1000;
    if (!std::isfinite(logit) || !std::isfinite(error)) return false;
    if (a == 0) {
      first = logit;
      first_error = error;
    } else if (std::abs(logit - first) > error + first_error) {
      return true;
    }
  }
  return false;
}

// Whether every entry of row i (its visible keys and its sink) has the same logit, exactly; the
// common s a (a where s is irrational) when they do.
bool BackwardExactCases::one_group(std::size_t i, const std::vector<std::size_t>& keys,
                                   Rational& common_dot) const {
  const std::size_t positions = in_.positions();
  const tensor::HeadScores& head = heads_[i / positions];
  const std::optional<Rational> scale = scale_of(i);
  const bool by_value = scale.has_value() && head.softcap == 0.0;
  struct Key {
    Rational dot, bias, value;
  };
  std::vector<Key> entries;
  for (const std::size_t j : keys) {
    Key key{
        exact_dot(in_.queries.row(i), in_.keys.row(j)), exact_bias(head.bias_terms(i % positions, j)), {}};
    // s a where s is rational: the soft-cap's pairs are then (s a, b), so scale 0 is one group.
    if (scale) mpq_mul(key.dot.get(), key.dot.get(), scale->get());
    entries.push_back(std::move(key));
  }
  if (head.sink) entries.push_back(Key{Rational(), Rational(*head.sink), {}});
  for (Key& key : entries) {
    if (by_value) mpq_add(key.value.get(), key.dot.get(), key.bias.get());
  }
  for (std::size_t e = 1; e < entries.size(); ++e) {
    const bool same = by_value
                          ? equal(entries[e].value, entries[0].value)
                          : equal(entries[e].dot, entries[0].dot) && equal(entries[e].bias, entries[0].bias);
    if (!same) return false;
  }
  if (!entries.empty()) common_dot = entries[0].dot;
  return true;
}

Rational BackwardExactCases::d_prob(std::size_t i, std::size_t j) const {
  return exact_dot(in_.d_out.row(i), in_.values.row(j));
}

// Whether every dP of row i (the sink's being 0) is the same, and which: bitwise equal value rows
// decide at once, double estimates that differ beyond their bounds refuse at once, and only the
// rest is compared exactly.
std::optional<Rational> BackwardExactCases::common_d_prob(std::size_t i, const std::vector<std::size_t>& keys,
                                                          bool sink) const {
  if (keys.empty()) return Rational();
  const std::size_t dv = in_.values.cols;
  const auto first = in_.values.row(keys[0]);
  const bool same_rows = std::all_of(keys.begin(), keys.end(), [&](std::size_t j) {
    return std::equal(first.begin(), first.end(), in_.values.row(j).begin());
  });
  if (!same_rows) {
    const auto estimate = [&](std::size_t j, double& magnitude) {
      double dot = 0.0;
      magnitude = 0.0;
      for (std::size_t c = 0; c < dv; ++c) {
        dot += in_.d_out(i, c) * in_.values(j, c);
        magnitude += std::abs(in_.d_out(i, c) * in_.values(j, c));
      }
      return dot;
    };
    const double relative = static_cast<double>(dv + 8) * 0x1p-50;
    double first_magnitude = 0.0, magnitude = 0.0;
    const double first_dot = estimate(keys[0], first_magnitude);
    for (const std::size_t j : keys) {
      const double dot = estimate(j, magnitude);
      if (std::isfinite(dot) && std::isfinite(first_dot) &&
          std::abs(dot - first_dot) > relative * (magnitude + first_magnitude) + 0x1p-1000)
        return std::nullopt;
    }
  }
  Rational common = d_prob(i, keys[0]);
  for (const std::size_t j : keys) {
    if (!same_rows && !equal(d_prob(i, j), common)) return std::nullopt;
  }
  if (sink && !is_zero(common)) return std::nullopt;
  return common;
}

void BackwardExactCases::analyse(std::size_t i, Row& facts) {
  const std::size_t positions = in_.positions();
  const tensor::HeadScores& head = heads_[i / positions];
  std::vector<std::size_t> keys;
  head.visible_keys(i % positions, keys);
  const bool padded = i % positions >= head.queries;
  facts.entries = padded ? 0 : keys.size() + (head.sink ? 1 : 0);
  Rational common_dot;
  facts.one_group = facts.entries == 0 || (!clearly_two_groups(i, keys) && one_group(i, keys, common_dot));
  if (facts.entries == 0) {
    facts.d.emplace();  // D = 0: nothing seen
  } else if (facts.one_group) {
    Rational sum;
    for (const std::size_t j : keys) {
      const Rational dp = d_prob(i, j);
      mpq_add(sum.get(), sum.get(), dp.get());
    }
    Rational count;
    mpq_set_ui(count.get(), facts.entries, 1);
    mpq_div(sum.get(), sum.get(), count.get());  // the sink's dP is 0
    facts.d = std::move(sum);
  } else {
    facts.d = common_d_prob(i, keys, head.sink.has_value());  // D is that value whatever P is
  }
  const std::optional<Rational> scale = scale_of(i);
  const bool slope_rational = scale.has_value() && (head.softcap == 0.0 || is_zero(common_dot));
  if (facts.one_group && facts.entries > 0 && slope_rational) {
    Rational slope = *scale;
    Rational theta(head.theta);
    mpq_div(slope.get(), slope.get(), theta.get());
    facts.slope = std::move(slope);
  }
}

const BackwardExactCases::Row& BackwardExactCases::row(std::size_t i) {
  Row& facts = rows_[i];
  if (!facts.analysed) {
    analyse(i, facts);
    facts.analysed = true;
  }
  return facts;
}

std::optional<Rational> BackwardExactCases::d_row(std::size_t i) { return row(i).d; }

std::optional<Rational> BackwardExactCases::d_logit(std::size_t i, std::size_t j) {
  const Row& facts = row(i);
  if (!facts.d) return std::nullopt;
  Rational bracket = d_prob(i, j);
  mpq_sub(bracket.get(), bracket.get(), facts.d->get());
  if (!in_.d_lse.empty()) add_times(bracket, Rational(1.0), in_.d_lse[i]);
  if (is_zero(bracket)) return bracket;
  if (!facts.one_group) return std::nullopt;
  Rational count;
  mpq_set_ui(count.get(), facts.entries, 1);
  mpq_div(bracket.get(), bracket.get(), count.get());
  return bracket;
}

std::optional<Rational> BackwardExactCases::d_raw(std::size_t i, std::size_t j) {
  std::optional<Rational> dz = d_logit(i, j);
  if (!dz || is_zero(*dz)) return dz;
  const Row& facts = row(i);
  if (!facts.slope) return std::nullopt;
  mpq_mul(dz->get(), dz->get(), facts.slope->get());
  return dz;
}

BackwardExactCases::Products BackwardExactCases::d_products(const std::vector<bool>& dq_decided,
                                                            const std::vector<bool>& dk_decided) {
  const std::size_t d = in_.queries.cols, positions = in_.positions();
  Products out{std::vector<std::optional<Rational>>(dq_decided.size()),
               std::vector<std::optional<Rational>>(dk_decided.size())};
  std::vector<Rational> dk_sums(dk_decided.size());
  std::vector<char> dk_rational(dk_decided.size(), 1);  // until a row that sees the key gives no dr
  std::vector<std::size_t> keys;
  std::vector<std::optional<Rational>> dr;
  const auto wanted = [&](const std::vector<bool>& decided,
                          std::size_t row) {  // some element not decided yet
    return std::find(decided.begin() + static_cast<std::ptrdiff_t>(row * d),
                     decided.begin() + static_cast<std::ptrdiff_t>((row + 1) * d),
                     false) != decided.begin() + static_cast<std::ptrdiff_t>((row + 1) * d);
  };
  for (std::size_t i = 0; i < in_.queries.rows; ++i) {
    const bool row_wanted = wanted(dq_decided, i);
    if (i % positions >= heads_[i / positions].queries) {  // a padded row: dQ 0, no share of dK
      for (std::size_t c = 0; c < d; ++c)
        if (!dq_decided[i * d + c]) out.d_queries[i * d + c].emplace();
      continue;
    }
    heads_[i / positions].visible_keys(i % positions, keys);
    dr.assign(keys.size(), std::nullopt);
    for (std::size_t a = 0; a < keys.size(); ++a)
      if (row_wanted || wanted(dk_decided, keys[a])) dr[a] = d_raw(i, keys[a]);
    for (std::size_t c = 0; row_wanted && c < d; ++c) {
      if (dq_decided[i * d + c]) continue;
      Rational sum;
      bool rational = true;
      for (std::size_t a = 0; a < keys.size() && rational; ++a) {
        if (in_.keys(keys[a], c) == 0.0) continue;
        rational = dr[a].has_value();
        if (rational) add_times(sum, *dr[a], in_.keys(keys[a], c));
      }
      if (rational) out.d_queries[i * d + c] = std::move(sum);
    }
    for (std::size_t a = 0; a < keys.size(); ++a) {
      for (std::size_t c = 0; c < d; ++c) {
        const std::size_t e = keys[a] * d + c;
        if (dk_decided[e] || dk_rational[e] == 0 || in_.queries(i, c) == 0.0) continue;
        if (!dr[a])
          dk_rational[e] = 0;
        else
          add_times(dk_sums[e], *dr[a], in_.queries(i, c));
      }
    }
  }
  for (std::size_t e = 0; e < dk_decided.size(); ++e)
    if (!dk_decided[e] && dk_rational[e] != 0) out.d_keys[e] = std::move(dk_sums[e]);
  return out;
}

std::optional<Rational> BackwardExactCases::d_value(std::size_t j, std::size_t c) {
  Rational sum;
  for (std::size_t i = 0; i < in_.queries.rows; ++i) {
    if (in_.d_out(i, c) == 0.0 || !visible(i, j)) continue;
    const Row& facts = row(i);
    if (!facts.one_group) return std::nullopt;
    Rational term(in_.d_out(i, c));
    Rational count;
    mpq_set_ui(count.get(), facts.entries, 1);
    mpq_div(term.get(), term.get(), count.get());
    mpq_add(sum.get(), sum.get(), term.get());
  }
  return sum;
}

std::optional<Rational> BackwardExactCases::d_sink(std::size_t h) {
  const tensor::HeadScores& head = heads_[h];
  Rational sum;
  if (!head.sink) return sum;
  const std::size_t positions = in_.positions();
  for (std::size_t p = 0; p < head.queries && p < positions; ++p) {
    const std::size_t i = h * positions + p;
    const Row& facts = row(i);
    if (!facts.d) return std::nullopt;
    Rational term;
    if (!in_.d_lse.empty()) term = Rational(in_.d_lse[i]);
    mpq_sub(term.get(), term.get(), facts.d->get());  // g - D
    if (is_zero(term)) continue;
    if (!facts.one_group) return std::nullopt;
    Rational scale;
    mpq_set_ui(scale.get(), facts.entries, 1);
    mpq_div(term.get(), term.get(), scale.get());
    Rational theta(head.theta);
    mpq_div(term.get(), term.get(), theta.get());
    mpq_add(sum.get(), sum.get(), term.get());
  }
  return sum;
}

}  // namespace sharpcheck::reference
