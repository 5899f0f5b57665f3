// sharpcheck bounds: every bound of bounds/ for given n, delta, theta, eps and format, and
// Proposition 3.1's bound beside the actual spread for Q, K, y, X given as .npy files.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bounds/bounds.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/errors.hpp"
#include "io/atomic_file.hpp"
#include "io/npy.hpp"

namespace sharpcheck::cli {
namespace {

struct BoundsSettings {
  double n = 16384;
  double delta = 5.69;
  double theta = 1.0;
  double eps = 0.1;
  std::string json_path;
  std::string q, k, y, x;
};

// A horizon: the exact integer when it is known exactly, else its lower end to 6 digits.
std::string horizon_text(const bounds::Enclosure& horizon) {
  if (!std::isfinite(horizon.upper)) return "beyond 1.8e308";
  char text[64];
  if (horizon.lower == horizon.upper && horizon.lower < 0x1p53) {
    std::snprintf(text, sizeof text, "%.0f", horizon.lower);
  } else {
    std::snprintf(text, sizeof text, "%.6g", horizon.lower);
  }
  return text;
}

nlohmann::json enclosure(const bounds::Enclosure& e) { return {{"lower", e.lower}, {"upper", e.upper}}; }

int run_bounds(const BoundsSettings& s) {
  nlohmann::json report;
  const auto lemma = bounds::lemma_2_1(s.n, s.delta, s.theta);
  report["inputs"] = {{"n", s.n}, {"delta", s.delta}, {"theta", s.theta}, {"eps", s.eps}};
  report["lemma_2_1"] = {{"lower", lemma.lower}, {"upper", lemma.upper}};
  report["tight_largest_coefficient"] = bounds::tight_largest_coefficient(s.n, s.delta, s.theta);
  report["tight_smallest_coefficient"] = bounds::tight_smallest_coefficient(s.n, s.delta, s.theta);
  report["theorem_2_2_paper_threshold"] = bounds::theorem_2_2_threshold(s.delta, s.theta, s.eps);
  report["theorem_2_2_smallest_n"] = bounds::smallest_n_below(s.delta, s.theta, s.eps);
  report["entropy_lower_bound"] = bounds::entropy_lower_bound(s.n, s.delta, s.theta);
  std::printf(
      "n = %.17g, delta = %.17g, theta = %.17g, eps = %.17g (upper bounds rounded up, lower rounded "
      "down)\n\n",
      s.n, s.delta, s.theta, s.eps);
  std::printf("Lemma 2.1            %.17g <= coefficient <= %.17g\n", lemma.lower, lemma.upper);
  std::printf("tight forms          %.17g <= coefficient <= %.17g\n",
              report["tight_smallest_coefficient"].get<double>(),
              report["tight_largest_coefficient"].get<double>());
  std::printf("Theorem 2.2          every coefficient < eps once n > %.17g (paper form)\n",
              report["theorem_2_2_paper_threshold"].get<double>());
  std::printf("                     smallest such n from the tight form: %llu\n",
              static_cast<unsigned long long>(report["theorem_2_2_smallest_n"].get<std::uint64_t>()));
  std::printf("entropy              H >= %.17g nats\n\n", report["entropy_lower_bound"].get<double>());
  std::printf("%-9s %26s %22s\n", "format", "underflow horizon (n)", "accumulation horizon");
  for (const FloatFormat* format : all_float_formats) {
    const auto horizon = bounds::underflow_horizon(s.delta, s.theta, *format);
    const auto accumulation = bounds::accumulation_horizon(*format);
    report["horizons"][std::string(format->name)] = {{"underflow", enclosure(horizon)},
                                                     {"accumulation", accumulation}};
    std::printf("%-9s %26s %22llu\n", std::string(format->name).c_str(), horizon_text(horizon).c_str(),
                static_cast<unsigned long long>(accumulation));
  }
  const auto uint8_horizon = bounds::underflow_horizon(s.delta, s.theta, 1.0 / 512);
  report["horizons"]["uint8 (scale 1/256)"] = {{"underflow", enclosure(uint8_horizon)}};
  std::printf("%-9s %26s %22s\n", "uint8", horizon_text(uint8_horizon).c_str(), "-");
  const auto active = bounds::adaptive_active_interval();
  report["adaptive_temperature_active_interval"] = {{"lower_root", enclosure(active.lower_root)},
                                                    {"upper_root", enclosure(active.upper_root)}};
  std::printf(
      "\nadaptive temperature: beta > 1 exactly for H in (%.15g, %.15g) nats (roots enclosed to 2^-50)\n",
      active.lower_root.upper, active.upper_root.lower);
  if (!s.q.empty()) {
    if (s.k.empty() || s.y.empty() || s.x.empty()) {
      throw InputError(InputProblem::out_of_range, "bounds: Proposition 3.1 needs --q, --k, --y and --x");
    }
    const auto load = [](const std::string& path) { return io::as_matrix(io::read_npy(path), path); };
    const auto result = bounds::proposition_3_1(load(s.q), load(s.k), load(s.y), load(s.x));
    report["proposition_3_1"] = {{"sigma_max_q", result.sigma_q},
                                 {"sigma_max_k", result.sigma_k},
                                 {"norm_y", result.norm_y},
                                 {"max_norm_x", result.max_norm_x},
                                 {"bound", result.bound},
                                 {"actual_spread", enclosure(result.actual_spread)},
                                 {"certificate", result.certificate}};
    std::printf("\nProposition 3.1: delta <= 2 sigma(Q) sigma(K) |y| max|x| = %.17g\n", result.bound);
    std::printf("  sigma(Q) <= %.17g, sigma(K) <= %.17g, |y| <= %.17g, max|x| <= %.17g\n", result.sigma_q,
                result.sigma_k, result.norm_y, result.max_norm_x);
    std::printf("  actual spread in [%.17g, %.17g]: the bound is %.3gx the spread\n  (%s)\n",
                result.actual_spread.lower, result.actual_spread.upper,
                result.bound / std::max(result.actual_spread.upper, 1e-300), result.certificate.c_str());
  }
  if (!s.json_path.empty()) io::write_file_atomically(s.json_path, report.dump(1) + "\n");
  return exit_pass;
}

}  // namespace

Command add_bounds_command(CLI::App& app) {
  auto s = std::make_shared<BoundsSettings>();
  auto* command = app.add_subcommand("bounds", "Print every rigorous bound for given n, delta, theta, eps");
  command->add_option("--n", s->n, "Number of logits (default 16384)");
  add_real_option(command, "--delta", s->delta, "Spread max e - min e (default 5.69, Gemma 2B's mean)");
  add_real_option(command, "--theta", s->theta, "Temperature > 0");
  add_real_option(command, "--eps", s->eps, "Theorem 2.2's epsilon in (0, 1]");
  command->add_option("--json", s->json_path, "Also write the bounds as JSON")->check(report_path);
  command->add_option("--q", s->q, "Proposition 3.1: Q (.npy, dq x d)");
  command->add_option("--k", s->k, "Proposition 3.1: K (.npy, dq x d)");
  command->add_option("--y", s->y, "Proposition 3.1: y (.npy, d entries)");
  command->add_option("--x", s->x, "Proposition 3.1: the items x_i as rows (.npy, n x d)");
  return [command, s]() -> int { return *command ? run_bounds(*s) : -1; };
}

}  // namespace sharpcheck::cli
