#include "bounds/bounds.hpp"

#include <arb.h>
#include <arb_mat.h>

#include <Eigen/SVD>
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "core/errors.hpp"
#include "core/mpfr_number.hpp"

namespace sharpcheck::bounds {
namespace {

constexpr mpfr_prec_t working_precision = 256;

void check_finite(double value, const char* argument) {
  if (!std::isfinite(value)) {
    throw InputError(InputProblem::non_finite_value, std::string("bounds: ") + argument + " is not finite");
  }
}

void check_row(double n, double delta, double theta) {
  check_finite(n, "n");
  check_finite(delta, "delta");
  if (!std::isfinite(theta) || theta <= 0) {
    throw InputError(
        InputProblem::bad_temperature,
        "bounds: theta must be finite and > 0 for the lemma's forms, got " + std::to_string(theta));
  }
  if (n < 1) throw InputError(InputProblem::out_of_range, "bounds: n must be >= 1, got " + std::to_string(n));
  if (delta < 0) {
    throw InputError(InputProblem::out_of_range, "bounds: delta must be >= 0, got " + std::to_string(delta));
  }
}

void check_epsilon(double eps) {
  if (!(eps > 0 && eps <= 1)) {
    throw InputError(InputProblem::out_of_range,
                     "bounds: eps must lie in (0, 1], got " + std::to_string(eps));
  }
}

MpfrNumber number(mpfr_prec_t precision = working_precision) { return MpfrNumber(precision); }

// exp(sign * delta / theta) rounded in direction `rounding` (the quotient rounded the same way,
// so the result bounds the exact exponential on that side).
void exp_of_ratio(mpfr_ptr out, double delta, double theta, int sign, mpfr_rnd_t rounding) {
  // For sign < 0 the exponent -delta/theta must be rounded the same way as the result.
  mpfr_set_d(out, sign * delta, MPFR_RNDN);  // exact
  mpfr_div_d(out, out, theta, rounding);
  mpfr_exp(out, out, rounding);
}

double to_double(mpfr_srcptr x, mpfr_rnd_t rounding) { return mpfr_get_d(x, rounding); }

}  // namespace

Enclosure lemma_2_1(double n, double delta, double theta) {
  check_row(n, delta, theta);
  auto value = number();
  exp_of_ratio(value.get(), delta, theta, -1, MPFR_RNDD);
  mpfr_div_d(value.get(), value.get(), n, MPFR_RNDD);
  Enclosure result;
  result.lower = to_double(value.get(), MPFR_RNDD);
  exp_of_ratio(value.get(), delta, theta, +1, MPFR_RNDU);
  mpfr_div_d(value.get(), value.get(), n, MPFR_RNDU);
  result.upper = to_double(value.get(), MPFR_RNDU);
  return result;
}

double tight_largest_coefficient(double n, double delta, double theta) {
  check_row(n, delta, theta);
  auto denominator = number();
  exp_of_ratio(denominator.get(), delta, theta, -1, MPFR_RNDD);  // a lower bound of the denominator
  mpfr_mul_d(denominator.get(), denominator.get(), n - 1, MPFR_RNDD);
  mpfr_add_ui(denominator.get(), denominator.get(), 1, MPFR_RNDD);
  mpfr_ui_div(denominator.get(), 1, denominator.get(), MPFR_RNDU);
  return to_double(denominator.get(), MPFR_RNDU);
}

double tight_smallest_coefficient(double n, double delta, double theta) {
  check_row(n, delta, theta);
  auto denominator = number();
  exp_of_ratio(denominator.get(), delta, theta, +1, MPFR_RNDU);
  mpfr_mul_d(denominator.get(), denominator.get(), n - 1, MPFR_RNDU);
  mpfr_add_ui(denominator.get(), denominator.get(), 1, MPFR_RNDU);
  mpfr_ui_div(denominator.get(), 1, denominator.get(), MPFR_RNDD);
  return to_double(denominator.get(), MPFR_RNDD);
}

double theorem_2_2_threshold(double delta, double theta, double eps) {
  check_row(1, delta, theta);
  check_epsilon(eps);
  auto value = number();
  exp_of_ratio(value.get(), delta, theta, +1, MPFR_RNDU);
  mpfr_div_d(value.get(), value.get(), eps, MPFR_RNDU);
  return to_double(value.get(), MPFR_RNDU);
}

namespace {
// Encloses t = 1 + (1/h - 1) exp(delta/theta) at the given precision, for h = h_significand *
// 2^h_exponent (so thresholds below double's range, like fp64's 2^-1075, are exact).
void enclose_count(double delta, double theta, double h_significand, long h_exponent, mpfr_prec_t precision,
                   MpfrNumber& low, MpfrNumber& high) {
  mpfr_set_prec(low.get(), precision);
  mpfr_set_prec(high.get(), precision);
  auto factor = number(precision);
  for (const bool upper : {false, true}) {
    const mpfr_rnd_t rounding = upper ? MPFR_RNDU : MPFR_RNDD;
    MpfrNumber& end = upper ? high : low;
    mpfr_set_d(factor.get(), h_significand, MPFR_RNDN);
    mpfr_mul_2si(factor.get(), factor.get(), h_exponent, MPFR_RNDN);  // exact
    mpfr_ui_div(factor.get(), 1, factor.get(), rounding);
    mpfr_sub_ui(factor.get(), factor.get(), 1, rounding);
    exp_of_ratio(end.get(), delta, theta, +1, rounding);
    mpfr_mul(end.get(), end.get(), factor.get(), rounding);
    mpfr_add_ui(end.get(), end.get(), 1, rounding);
  }
}

Enclosure horizon_for(double delta, double theta, double h_significand, long h_exponent) {
  // The largest coefficient 1/(1 + (n-1) exp(-delta/theta)) is <= h exactly when
  // n >= t = 1 + (1/h - 1) exp(delta/theta): the horizon is ceil(t).
  auto low = number();
  auto high = number();
  for (mpfr_prec_t precision = 128;; precision *= 2) {
    enclose_count(delta, theta, h_significand, h_exponent, precision, low, high);
    mpfr_ceil(low.get(), low.get());
    mpfr_ceil(high.get(), high.get());
    const Enclosure result{to_double(low.get(), MPFR_RNDD), to_double(high.get(), MPFR_RNDU)};
    if (mpfr_equal_p(low.get(), high.get()) || precision >= 4096) return result;
  }
}
}  // namespace

std::uint64_t smallest_n_below(double delta, double theta, double eps) {
  check_row(1, delta, theta);
  check_epsilon(eps);
  // The tight largest coefficient is < eps exactly when n > t = 1 + (1/eps - 1) exp(delta/theta),
  // so the answer is floor(t) + 1. t is irrational for delta > 0 (exp of a non-zero rational), so
  // growing precision decides its floor; for delta = 0 it is 1/eps, exact when that is an integer.
  auto low = number();
  auto high = number();
  for (mpfr_prec_t precision = 128; precision <= 8192; precision *= 2) {
    enclose_count(delta, theta, eps, 0, precision, low, high);
    mpfr_floor(low.get(), low.get());
    mpfr_floor(high.get(), high.get());
    if (!mpfr_equal_p(low.get(), high.get())) continue;
    if (mpfr_cmp_d(low.get(), 0x1p63) >= 0) {
      throw InputError(InputProblem::out_of_range, "bounds: the smallest such n exceeds 2^63");
    }
    return mpfr_get_uj(low.get(), MPFR_RNDN) + 1;
  }
  throw UndecidedRounding("bounds: could not decide the floor of the threshold at 8192 bits");
}

double entropy_lower_bound(double n, double delta, double theta) {
  check_row(n, delta, theta);
  auto log_n = number();
  mpfr_set_d(log_n.get(), n, MPFR_RNDN);
  mpfr_log(log_n.get(), log_n.get(), MPFR_RNDD);
  auto ratio = number();
  mpfr_set_d(ratio.get(), delta, MPFR_RNDN);
  mpfr_div_d(ratio.get(), ratio.get(), theta, MPFR_RNDU);
  mpfr_sub(log_n.get(), log_n.get(), ratio.get(), MPFR_RNDD);
  return to_double(log_n.get(), MPFR_RNDD);
}

Enclosure underflow_horizon(double delta, double theta, double half_smallest_positive) {
  check_row(1, delta, theta);
  if (!(half_smallest_positive > 0 && half_smallest_positive < 1)) {
    throw InputError(InputProblem::out_of_range, "bounds: the underflow threshold must lie in (0, 1)");
  }
  return horizon_for(delta, theta, half_smallest_positive, 0);
}

Enclosure underflow_horizon(double delta, double theta, const FloatFormat& format) {
  check_row(1, delta, theta);
  return horizon_for(delta, theta, 1.0, format.min_subnormal_exponent() - 1);
}

std::uint64_t accumulation_horizon(const FloatFormat& format) {
  // A sum of ones is exact up to 2^p; then 2^p + 1 is a tie between 2^p and 2^p + 2 and rounds to
  // the even 2^p, so the (2^p + 1)-th term is the first that changes nothing.
  return (std::uint64_t{1} << format.precision()) + 1;
}

double adaptive_polynomial(double h) { return (((-0.037 * h + 0.481) * h - 2.3) * h + 4.917) * h - 1.791; }

double adaptive_beta(double entropy) {
  return entropy > 0.5 ? std::max(adaptive_polynomial(entropy), 1.0) : 1.0;
}

namespace {
// 1000 (poly(h) - 1) = -37 h^4 + 481 h^3 - 2300 h^2 + 4917 h - 2791, evaluated exactly for a
// double h (an integer polynomial at a dyadic: 600 bits hold every intermediate exactly).
int sign_of_polynomial_minus_one(double h) {
  MpfrNumber value(600);
  MpfrNumber point(600);
  mpfr_set_d(point.get(), h, MPFR_RNDN);
  mpfr_set_si(value.get(), -37, MPFR_RNDN);
  for (const long coefficient : {481L, -2300L, 4917L, -2791L}) {
    mpfr_mul(value.get(), value.get(), point.get(), MPFR_RNDN);
    mpfr_add_si(value.get(), value.get(), coefficient, MPFR_RNDN);
  }
  return mpfr_sgn(value.get());
}

Enclosure bisect_root(double low, double high) {
  const int low_sign = sign_of_polynomial_minus_one(low);
  for (int step = 0; step < 60 && high - low > 0x1p-50; ++step) {
    const double middle = low + (high - low) / 2;  // exact: dyadic endpoints
    if (sign_of_polynomial_minus_one(middle) == low_sign) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return {low, high};
}
}  // namespace

ActiveInterval adaptive_active_interval() {
  // Signs at the dyadic brackets are checked exactly; each bracket then holds a root.
  return {bisect_root(0.75, 1.0), bisect_root(5.5, 6.0)};
}

double certified_sigma_max(const Matrix& a, std::string* certificate) {
  for (const double x : a.values) check_finite(x, "matrix entry");
  if (a.rows == 0 || a.cols == 0) return 0.0;
  Eigen::MatrixXd dense(a.rows, a.cols);
  for (std::size_t r = 0; r < a.rows; ++r) {
    for (std::size_t c = 0; c < a.cols; ++c)
      dense(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = a(r, c);
  }
  const double estimate = Eigen::JacobiSVD<Eigen::MatrixXd>(dense).singularValues()(0);
  if (estimate == 0 && std::all_of(a.values.begin(), a.values.end(), [](double x) { return x == 0; })) {
    if (certificate != nullptr) *certificate = "zero matrix";
    return 0.0;
  }
  const double candidate = estimate * (1 + 0x1p-30) + 0x1p-1000;
  // s^2 I - A^T A positive definite <=> every singular value of A is below s.
  const auto n = static_cast<slong>(a.cols);
  const slong precision = 256;
  arb_mat_t matrix, gram, factor;
  arb_mat_init(matrix, static_cast<slong>(a.rows), n);
  arb_mat_init(gram, n, n);
  arb_mat_init(factor, n, n);
  for (std::size_t r = 0; r < a.rows; ++r) {
    for (std::size_t c = 0; c < a.cols; ++c) {
      arb_set_d(arb_mat_entry(matrix, static_cast<slong>(r), static_cast<slong>(c)), a(r, c));
    }
  }
  arb_mat_t transpose;
  arb_mat_init(transpose, n, static_cast<slong>(a.rows));
  arb_mat_transpose(transpose, matrix);
  arb_mat_mul(gram, transpose, matrix, precision);
  arb_mat_neg(gram, gram);
  arb_t square;
  arb_init(square);
  arb_set_d(square, candidate);
  arb_mul(square, square, square, precision);
  for (slong i = 0; i < n; ++i)
    arb_add(arb_mat_entry(gram, i, i), arb_mat_entry(gram, i, i), square, precision);
  const bool certified = arb_mat_cho(factor, gram, precision) != 0;
  arb_clear(square);
  arb_mat_clear(transpose);
  arb_mat_clear(matrix);
  arb_mat_clear(gram);
  arb_mat_clear(factor);
  if (certified) {
    if (certificate != nullptr)
      *certificate = "Eigen SVD estimate, s^2 I - A^T A proved positive definite (Arb ball Cholesky)";
    return candidate;
  }
  // Fallback: sigma_max <= sqrt(||A||_1 ||A||_inf), each norm summed with upward rounding.
  MpfrNumber column_norm(working_precision), row_norm(working_precision), entry(working_precision);
  mpfr_set_zero(column_norm.get(), 1);
  mpfr_set_zero(row_norm.get(), 1);
  for (std::size_t c = 0; c < a.cols; ++c) {
    mpfr_set_zero(entry.get(), 1);
    for (std::size_t r = 0; r < a.rows; ++r)
      mpfr_add_d(entry.get(), entry.get(), std::fabs(a(r, c)), MPFR_RNDU);
    mpfr_max(column_norm.get(), column_norm.get(), entry.get(), MPFR_RNDU);
  }
  for (std::size_t r = 0; r < a.rows; ++r) {
    mpfr_set_zero(entry.get(), 1);
    for (std::size_t c = 0; c < a.cols; ++c)
      mpfr_add_d(entry.get(), entry.get(), std::fabs(a(r, c)), MPFR_RNDU);
    mpfr_max(row_norm.get(), row_norm.get(), entry.get(), MPFR_RNDU);
  }
  mpfr_mul(entry.get(), column_norm.get(), row_norm.get(), MPFR_RNDU);
  mpfr_sqrt(entry.get(), entry.get(), MPFR_RNDU);
  if (certificate != nullptr) *certificate = "sqrt(||A||_1 ||A||_inf) (the Cholesky certificate failed)";
  return to_double(entry.get(), MPFR_RNDU);
}

namespace {
double euclidean_norm_up(std::span<const double> v) {
  MpfrNumber sum(working_precision);
  mpfr_set_zero(sum.get(), 1);
  MpfrNumber square(working_precision);
  for (const double x : v) {
    mpfr_set_d(square.get(), x, MPFR_RNDN);
    mpfr_sqr(square.get(), square.get(), MPFR_RNDU);
    mpfr_add(sum.get(), sum.get(), square.get(), MPFR_RNDU);
  }
  mpfr_sqrt(sum.get(), sum.get(), MPFR_RNDU);
  return to_double(sum.get(), MPFR_RNDU);
}
}  // namespace

namespace {

void check_proposition_shapes(const Matrix& q, const Matrix& k, const Matrix& y, const Matrix& x) {
  const auto shape = [](const Matrix& m) { return std::to_string(m.rows) + "x" + std::to_string(m.cols); };
  if (q.cols != y.cols * y.rows || q.cols == 0) {
    throw InputError(InputProblem::shape_mismatch, "bounds: Q is " + shape(q) + " but y has " +
                                                       std::to_string(y.rows * y.cols) + " entries");
  }
  if (k.cols != x.cols || x.rows == 0) {
    throw InputError(InputProblem::shape_mismatch, "bounds: K is " + shape(k) + " but X is " + shape(x));
  }
  if (q.rows != k.rows) {
    throw InputError(InputProblem::shape_mismatch, "bounds: Q is " + shape(q) + " and K is " + shape(k) +
                                                       ": Qy and Kx must have the same length");
  }
  for (const Matrix* m : {&q, &k, &y, &x}) {
    for (const double v : m->values) check_finite(v, "matrix entry");
  }
}

// out = M v in Arb balls (d = M's rows), v given by `entry_of(c)`.
template <typename Entry>
void arb_matrix_vector(arb_ptr out, const Matrix& m, const Entry& entry_of, slong precision) {
  arb_t term, entry;
  arb_init(term);
  arb_init(entry);
  for (std::size_t r = 0; r < m.rows; ++r) {
    arb_zero(out + r);
    for (std::size_t c = 0; c < m.cols; ++c) {
      arb_set_d(term, m(r, c));
      arb_set_d(entry, entry_of(c));
      arb_addmul(out + r, term, entry, precision);
    }
  }
  arb_clear(term);
  arb_clear(entry);
}

// The actual spread max_i e_i - min_i e_i of e_i = (Q y) . (K x_i), enclosed by Arb and rounded
// outward (clamped at 0: a spread).
Enclosure actual_spread(const Matrix& q, const Matrix& k, const Matrix& y, const Matrix& x) {
  const slong precision = 256;
  const auto d = static_cast<slong>(q.rows);
  arb_ptr query = _arb_vec_init(d);
  arb_ptr key = _arb_vec_init(d);
  arb_t logit;
  arb_init(logit);
  arb_matrix_vector(
      query, q, [&](std::size_t c) { return y.values[c]; }, precision);
  double low_of_max = -INFINITY, high_of_max = -INFINITY, low_of_min = INFINITY, high_of_min = INFINITY;
  MpfrNumber lower(precision), upper(precision);
  for (std::size_t i = 0; i < x.rows; ++i) {
    arb_matrix_vector(
        key, k, [&](std::size_t c) { return x(i, c); }, precision);
    arb_dot(logit, nullptr, 0, query, 1, key, 1, d, precision);
    arb_get_interval_mpfr(lower.get(), upper.get(), logit);
    const double low = mpfr_get_d(lower.get(), MPFR_RNDD);
    const double high = mpfr_get_d(upper.get(), MPFR_RNDU);
    low_of_max = std::max(low_of_max, low);
    high_of_max = std::max(high_of_max, high);
    low_of_min = std::min(low_of_min, low);
    high_of_min = std::min(high_of_min, high);
  }
  arb_clear(logit);
  _arb_vec_clear(query, d);
  _arb_vec_clear(key, d);
  // max e - min e lies in [max lows - min highs, max highs - min lows].
  Enclosure spread;
  MpfrNumber difference(working_precision);
  mpfr_set_d(difference.get(), low_of_max, MPFR_RNDN);
  mpfr_sub_d(difference.get(), difference.get(), high_of_min, MPFR_RNDD);
  spread.lower = std::max(0.0, to_double(difference.get(), MPFR_RNDD));
  mpfr_set_d(difference.get(), high_of_max, MPFR_RNDN);
  mpfr_sub_d(difference.get(), difference.get(), low_of_min, MPFR_RNDU);
  spread.upper = to_double(difference.get(), MPFR_RNDU);
  return spread;
}

}  // namespace

Proposition31 proposition_3_1(const Matrix& q, const Matrix& k, const Matrix& y, const Matrix& x) {
  check_proposition_shapes(q, k, y, x);
  Proposition31 result;
  std::string certificate_q, certificate_k;
  result.sigma_q = certified_sigma_max(q, &certificate_q);
  result.sigma_k = certified_sigma_max(k, &certificate_k);
  result.certificate = "Q: " + certificate_q + "; K: " + certificate_k;
  result.norm_y = euclidean_norm_up(y.values);
  for (std::size_t i = 0; i < x.rows; ++i)
    result.max_norm_x = std::max(result.max_norm_x, euclidean_norm_up(x.row(i)));
  MpfrNumber bound(working_precision);
  mpfr_set_d(bound.get(), 2 * result.sigma_q, MPFR_RNDU);  // 2 s is exact
  for (const double factor : {result.sigma_k, result.norm_y, result.max_norm_x}) {
    mpfr_mul_d(bound.get(), bound.get(), factor, MPFR_RNDU);
  }
  result.bound = to_double(bound.get(), MPFR_RNDU);
  result.actual_spread = actual_spread(q, k, y, x);
  return result;
}

}  // namespace sharpcheck::bounds
