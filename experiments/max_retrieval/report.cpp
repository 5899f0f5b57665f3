#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "bounds/bounds.hpp"
#include "experiments/max_retrieval/max_retrieval.hpp"
#include "io/atomic_file.hpp"
#include "io/svg_plot.hpp"

namespace max_retrieval {

double paired_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  const std::size_t k = a.size();
  if (k < 2) return std::numeric_limits<double>::quiet_NaN();  // one seed: no variance, no test
  std::vector<double> d(k);
  for (std::size_t i = 0; i < k; ++i) d[i] = a[i] - b[i];
  const double mean = std::accumulate(d.begin(), d.end(), 0.0) / static_cast<double>(k);
  double variance = 0;
  for (const double x : d) variance += (x - mean) * (x - mean);
  variance /= static_cast<double>(k - 1);
  if (variance == 0) return mean == 0 ? 1.0 : 0.0;
  const double t = std::fabs(mean) / std::sqrt(variance / static_cast<double>(k));
  const double nu = static_cast<double>(k - 1);
  // P(|T| > t) = I_{nu/(nu+t^2)}(nu/2, 1/2); integrate the t density instead (Simpson, fine grid).
  const auto density = [nu](double x) {
    return std::exp(std::lgamma((nu + 1) / 2) - std::lgamma(nu / 2)) / std::sqrt(nu * M_PI) *
           std::pow(1 + x * x / nu, -(nu + 1) / 2);
  };
  const int steps = 20000;
  const double h = t / steps;
  double area = density(0) + density(t);
  for (int i = 1; i < steps; ++i) area += (i % 2 == 1 ? 4 : 2) * density(i * h);
  return std::clamp(1 - 2 * area * h / 3, 0.0, 1.0);
}

double mean_of(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

void print_size_line(const SizeResult& result) {
  std::printf(
      "n=%6d plain %.3f adaptive %.3f p=%.3g mean spread %.3f mean max coefficient %.4g (tight %.4g, "
      "lemma %.4g), worst coefficient/lemma %.4f, folding %.2g (%.1f s)\n",
      result.n, mean_of(result.plain), mean_of(result.adaptive), paired_t_test(result.plain, result.adaptive),
      result.mean_spread, result.mean_largest, result.tight_at_mean, result.lemma_at_mean,
      result.worst_lemma_ratio, result.folding_difference, result.seconds);
}

void write_reports(const std::vector<SizeResult>& results, const std::string& out, int max_size) {
  // CSV, Markdown beside the paper's table, SVG of accuracy against n.
  const std::vector<std::pair<int, std::pair<double, double>>> paper{
      {16, {98.6, 98.6}},   {64, {94.3, 94.5}},   {128, {89.7, 89.9}},
      {256, {81.3, 82.1}},  {512, {70.1, 72.5}},  {1024, {53.8, 57.7}},
      {2048, {35.7, 39.4}}, {4096, {22.6, 24.9}}, {16384, {12.4, 14.0}}};
  sharpcheck::io::OutputFile csv(out + "/max_retrieval.csv");
  csv << "n,plain_mean,adaptive_mean,p_value,mean_spread,mean_largest_coefficient,tight_bound_at_mean_spread,"
         "lemma_bound_at_mean_spread,worst_coefficient_over_lemma,folding_difference,seconds\n";
  sharpcheck::io::OutputFile markdown(out + "/max_retrieval.md");
  markdown << "| n | plain (ours) | adaptive (ours) | p (paired t) | plain (paper) | adaptive (paper) |\n"
              "|---:|---:|---:|---:|---:|---:|\n";
  sharpcheck::io::Chart chart{"Max retrieval: accuracy against set size (trained at 16)",
                              "items n",
                              "accuracy (%)",
                              true,
                              false,
                              {},
                              {}};
  sharpcheck::io::Series ours_plain{"plain softmax (ours)", {}, {}, "#1f77b4", false, true};
  sharpcheck::io::Series ours_adaptive{"adaptive temperature (ours)", {}, {}, "#ff7f0e", false, true};
  sharpcheck::io::Series paper_plain{"plain (paper)", {}, {}, "#1f77b4", true, true};
  sharpcheck::io::Series paper_adaptive{"adaptive (paper)", {}, {}, "#ff7f0e", true, true};
  for (const auto& r : results) {
    const double plain = 100 * mean_of(r.plain);
    const double adaptive = 100 * mean_of(r.adaptive);
    const double p = paired_t_test(r.plain, r.adaptive);
    csv << r.n << "," << plain << "," << adaptive << "," << p << "," << r.mean_spread << "," << r.mean_largest
        << "," << r.tight_at_mean << "," << r.lemma_at_mean << "," << r.worst_lemma_ratio << ","
        << r.folding_difference << "," << r.seconds << "\n";
    ours_plain.x.push_back(r.n);
    ours_plain.y.push_back(plain);
    ours_adaptive.x.push_back(r.n);
    ours_adaptive.y.push_back(adaptive);
    std::string paper_cells = "| - | - |";
    for (const auto& [size, figures] : paper) {
      if (size != r.n) continue;
      char text[64];
      std::snprintf(text, sizeof text, "| %.1f | %.1f |", figures.first, figures.second);
      paper_cells = text;
    }
    char p_text[32] = "n/a";
    if (!std::isnan(p)) std::snprintf(p_text, sizeof p_text, "%.3g", p);
    char row[160];
    std::snprintf(row, sizeof row, "| %d | %.1f | %.1f | %s %s\n", r.n, plain, adaptive, p_text,
                  paper_cells.c_str());
    markdown << row;
  }
  for (const auto& [size, figures] : paper) {
    if (size > max_size) continue;
    paper_plain.x.push_back(size);
    paper_plain.y.push_back(figures.first);
    paper_adaptive.x.push_back(size);
    paper_adaptive.y.push_back(figures.second);
  }
  chart.series = {ours_plain, ours_adaptive, paper_plain, paper_adaptive};
  csv.commit();
  markdown.commit();
  sharpcheck::io::write_file_atomically(out + "/max_retrieval.svg", sharpcheck::io::render_svg(chart));
  std::printf("written to %s: max_retrieval.csv, max_retrieval.md, max_retrieval.svg\n", out.c_str());
}

bool passes_check(const std::vector<SizeResult>& results) {
  // The run's own numbers: chance is 1/10; the fp32 softmax may exceed the exact bound by rounding
  // only (relative 1e-5 is far above fp32's error for these rows).
  bool ok = true;
  if (!(mean_of(results.front().plain) > 0.5)) {
    std::printf("CHECK FAILED: accuracy at n = 16 is %.3f, not well above chance (0.1)\n",
                mean_of(results.front().plain));
    ok = false;
  }
  if (!(mean_of(results.back().plain) < mean_of(results.front().plain))) {
    std::printf("CHECK FAILED: accuracy does not fall from n = 16 to n = %d\n", results.back().n);
    ok = false;
  }
  for (const auto& r : results) {
    if (r.worst_lemma_ratio > 1 + 1e-5) {
      std::printf("CHECK FAILED: at n = %d a coefficient is %.6g times Lemma 2.1's bound\n", r.n,
                  r.worst_lemma_ratio);
      ok = false;
    }
    // A dot product of length 128 in fp32 errs by at most about 128 u = 7.6e-6 of its scale per
    // order of summation; a wrong fold (transpose, bias) errs by O(1).
    if (!(r.folding_difference <= 1e-4)) {
      std::printf(
          "CHECK FAILED: at n = %d the folded head's logits differ from the model's by %.3g of their scale\n",
          r.n, r.folding_difference);
      ok = false;
    }
  }
  std::printf("%s\n", ok ? "check passed: learned, disperses with n, within Lemma 2.1, folded head = model"
                         : "check failed");
  return ok;
}

}  // namespace max_retrieval
