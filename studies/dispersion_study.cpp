#include "studies/dispersion_study.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "bounds/bounds.hpp"
#include "core/errors.hpp"
#include "reference/attention_escapes.hpp"
#include "reference/dispersion_escapes.hpp"
#include "reference/softmax.hpp"

namespace sharpcheck::studies {
namespace {

std::vector<double> extremal_row(Escape escape, double delta, std::uint64_t n) {
  std::vector<double> row(n, 0.0);
  if (escape == Escape::stick_breaking_nearest) {
    row.back() = delta;
  } else {
    row.front() = delta;
  }
  return row;
}

// The selective readout row: z_0 = delta (the spike, token 0, never masked), z_j = -selection
// (n - 2 - j) for the distractors 1 <= j <= n - 2 (each masked by every later token but the
// readout), z_{n-1} = 0 (the token just before the readout). Exactly the last row of
// reference::selective_attention_weights for that selection (tests/dispersion_study_test.cpp).
std::vector<double> selective_readout_row(const std::vector<double>& row, double selection) {
  std::vector<double> z(row);
  const std::size_t n = row.size();
  for (std::size_t j = 1; j + 1 < n; ++j) z[j] = -selection * static_cast<double>(n - 2 - j);
  return z;
}

double matrix_escape_weight(Escape escape, const std::vector<double>& row, const FloatFormat& format,
                            const DispersionSettings& settings) {
  const std::size_t n = row.size();
  if (n > settings.matrix_size_limit) return std::nan("");
  Matrix spike(n, 1), column(1, n);
  column.values = row;
  if (escape == Escape::linear) {
    spike.values = row;
    return reference::linear_attention(Matrix(1, 1, 1.0), spike, Matrix(n, 1), false, format).weights(0, 0);
  }
  return reference::differential_attention_weights(column, Matrix(1, n), settings.differential_lambda,
                                                   format)(0, 0);
}

double spike_weight(Escape escape, const std::vector<double>& row, const FloatFormat& format,
                    const DispersionSettings& settings) {
  reference::RowOptions options;
  switch (escape) {
    case Escape::linear:
    case Escape::differential:
      return matrix_escape_weight(escape, row, format, settings);
    case Escape::selective:
      return reference::softmax(selective_readout_row(row, settings.selection), format)[0];
    case Escape::selective_weak:
      return reference::softmax(selective_readout_row(row, settings.weak_selection), format)[0];
    case Escape::softmax:
      return reference::softmax(row, format)[0];
    case Escape::adaptive_temperature:
      return reference::adaptive_temperature_softmax(row, format)[0];
    case Escape::scalable_softmax:
      options.theta = 1 / settings.ssmax_s;
      return reference::scalable_softmax(row, format, options)[0];
    case Escape::length_scaled:
      return reference::length_scaled_softmax(row, format, settings.training_length)[0];
    case Escape::sigmoid:
      return reference::sigmoid_attention_weights(row, format)[0];
    case Escape::stick_breaking_nearest:
      return reference::stick_breaking_weights(row, format).back();
    case Escape::stick_breaking_farthest:
      return reference::stick_breaking_weights(row, format)[0];
  }
  return 0;
}

// Runs jobs 0..count-1 on `threads` threads; each job writes only its own results.
template <typename Job>
void run_jobs(std::size_t count, unsigned threads, Job&& job) {
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::mutex failure_lock;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < count; i = next++) {
        try {
          job(i);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failure_lock);
          if (!failure) failure = std::current_exception();
        }
      }
    });
  }
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

// The entropy of the row (delta, 0, ..., 0) of n entries as a function of x = (n - 1) e^-delta:
// with S = e^delta (1 + x), H = ln S - delta e^delta / S = delta x / (1 + x) + ln(1 + x). This
// form overflows for no delta (e^delta itself does past about 11,356 in long double).
long double entropy_at(double delta, long double x) {
  return static_cast<long double>(delta) * x / (1 + x) + std::log1p(x);
}

long double closed_form_entropy(double delta, std::uint64_t n) {
  return entropy_at(delta, static_cast<long double>(n - 1) * std::exp(-static_cast<long double>(delta)));
}

// ln x* where entropy_at(delta, x*) = target: H rises from 0 at x = 0, so x* is unique, with
// target / (delta + 1) <= x* <= e^target (H <= (delta + 1) x and H >= ln(1 + x)); bisection on ln x.
long double log_crossing(double delta, long double target) {
  long double low = std::log(target / (static_cast<long double>(delta) + 1)), high = target;
  for (int step = 0; step < 200; ++step) {
    const long double mid = (low + high) / 2;
    (entropy_at(delta, std::exp(mid)) < target ? low : high) = mid;
  }
  return (low + high) / 2;
}

}  // namespace

std::string_view escape_name(Escape escape) {
  switch (escape) {
    case Escape::softmax:
      return "softmax";
    case Escape::adaptive_temperature:
      return "adaptive_temperature";
    case Escape::scalable_softmax:
      return "ssmax";
    case Escape::length_scaled:
      return "length_scaled";
    case Escape::sigmoid:
      return "sigmoid";
    case Escape::stick_breaking_nearest:
      return "stick_breaking_nearest";
    case Escape::stick_breaking_farthest:
      return "stick_breaking_farthest";
    case Escape::linear:
      return "linear";
    case Escape::selective:
      return "selective";
    case Escape::selective_weak:
      return "selective_weak";
    case Escape::differential:
      return "differential";
  }
  return "?";
}

DispersionStudy run_dispersion_study(DispersionSettings settings) {
  const auto start = std::chrono::steady_clock::now();
  if (settings.sizes.empty()) {
    for (std::uint64_t n = 16; n <= (std::uint64_t{1} << 20); n *= 2) settings.sizes.push_back(n);
  }
  for (const double delta : settings.spreads) {
    if (!std::isfinite(delta) || delta < 0) {
      throw InputError(InputProblem::out_of_range,
                       "study: a spread must be finite and >= 0, got " + hex_float(delta));
    }
  }
  for (const std::uint64_t n : settings.sizes) {
    if (n < 1 || n > (std::uint64_t{1} << 26)) {
      throw InputError(
          InputProblem::out_of_range,
          "study: sizes must lie in [1, 67108864] (rows are built in memory), got " + std::to_string(n));
    }
  }
  if (!(settings.ssmax_s > 0) || !std::isfinite(settings.ssmax_s)) {
    throw InputError(InputProblem::out_of_range, "study: the SSMax scalar s must be finite and > 0");
  }
  if (settings.training_length < 2) {
    throw InputError(InputProblem::out_of_range, "study: the training length L must be at least 2");
  }
  DispersionStudy study;
  study.settings = settings;
  for (const Escape escape : all_escapes) {
    for (const double delta : settings.spreads) {
      for (const std::uint64_t n : settings.sizes) study.points.push_back({escape, delta, n, {}});
    }
  }
  for (const double delta : settings.spreads) {
    for (const std::uint64_t n : settings.sizes) study.entropies.push_back({delta, n, 0, 1, false});
  }
  const unsigned threads =
      settings.threads != 0 ? settings.threads : std::max(1u, std::thread::hardware_concurrency());
  // Largest rows first, so the pool ends on short jobs.
  const std::size_t points = study.points.size();
  const std::size_t jobs = points + study.entropies.size();
  std::vector<std::size_t> order(jobs);
  for (std::size_t i = 0; i < jobs; ++i) order[i] = i;
  const auto size_of = [&](std::size_t i) {
    return i < points ? study.points[i].n : study.entropies[i - points].n;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return size_of(a) > size_of(b); });
  run_jobs(jobs, threads, [&](std::size_t k) {
    const std::size_t i = order[k];
    if (i < points) {
      DispersionPoint& point = study.points[i];
      const auto row = extremal_row(point.escape, point.delta, point.n);
      for (std::size_t f = 0; f < study_format_count; ++f) {
        point.spike_weight[f] = spike_weight(point.escape, row, *study_formats[f], settings);
      }
      return;
    }
    AdaptiveEntropyPoint& point = study.entropies[i - points];
    const auto row = extremal_row(Escape::softmax, point.delta, point.n);
    point.entropy = reference::entropy(row, fp64);
    point.beta = bounds::adaptive_beta(point.entropy);
    point.corrected = point.beta > 1;
  });
  study.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return study;
}

std::vector<const DispersionPoint*> series_of(const DispersionStudy& study, Escape escape, double delta) {
  std::vector<const DispersionPoint*> series;
  for (const auto& point : study.points) {
    if (point.escape == escape && point.delta == delta) series.push_back(&point);
  }
  return series;
}

std::optional<std::uint64_t> first_size_below(const DispersionStudy& study, Escape escape, double delta,
                                              double threshold) {
  for (const auto* point : series_of(study, escape, delta)) {
    if (point->spike_weight[0] < threshold) return point->n;
  }
  return std::nullopt;
}

SwitchOff adaptive_switch_off(double delta) {
  const auto root = bounds::adaptive_active_interval().upper_root;
  const long double middle = (static_cast<long double>(root.lower) + root.upper) / 2;
  SwitchOff result;
  result.log_switch_off = static_cast<long double>(delta) + log_crossing(delta, middle);
  if (result.log_switch_off > 62 * std::log(2.0L)) return result;  // beyond the integers resolved here
  // H(1) = 0 < root; grow an upper end, then bisect for the first n with H(n) >= the root.
  std::uint64_t low = 1;
  std::uint64_t high = 2;
  while (closed_form_entropy(delta, high) < middle && high < (std::uint64_t{1} << 63)) {
    low = high;
    high *= 2;
  }
  while (high - low > 1) {
    const std::uint64_t mid = low + (high - low) / 2;
    (closed_form_entropy(delta, mid) < middle ? low : high) = mid;
  }
  result.integers = true;
  result.last_corrected = low;
  result.first_uncorrected = high;
  result.separated = closed_form_entropy(delta, low) < root.lower - 1e-12L &&
                     closed_form_entropy(delta, high) > root.upper + 1e-12L;
  return result;
}

}  // namespace sharpcheck::studies
