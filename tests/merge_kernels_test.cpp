// The built-in merge kernels (ops/attention_merge/merge_kernels.hpp) on the merge's bf16 cases,
// judged by sharpcheck (attention_merge's own judge) and, on the same outputs, by the peers'
// merge gates: FlashInfer's merge_state test (allclose with atol 1e-2 on the output and on the
// LSE, rtol 1e-5, against an fp32 merge), and the cosine >= 0.99 and mean |error| <= 0.02 gates on
// the output alone. The honest kernel passes every gate; every twin fails sharpcheck on some case;
// the test states which twins each peer gate misses.
#include "ops/attention_merge/merge_kernels.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "gate/plugin_operations.hpp"
#include "ops/attention_merge/attention_merge_op.hpp"

namespace sharpcheck {
namespace {

const gate::ExternalTensor& named(const std::vector<gate::ExternalTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::logic_error(name);
}

// The merge in long double (an fp32 standard is what the peers compare with; this is closer to
// the exact merge than that): out [T, H, D] then lse [T, H]; a token with no partial gives 0, -inf.
std::vector<double> merged_exactly(const gate::ExternalCase& c) {
  const auto& outs = named(c.tensors, "partial_out");
  const auto& lses = named(c.tensors, "partial_lse");
  const std::size_t tokens = outs.shape[0], splits = outs.shape[1], heads = outs.shape[2],
                    dim = outs.shape[3];
  std::vector<double> out(tokens * heads * dim, 0.0), lse(tokens * heads, -INFINITY);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      long double top = -INFINITY, sum = 0;
      for (std::size_t s = 0; s < splits; ++s)
        top = std::max<long double>(top, lses.values[(t * splits + s) * heads + h]);
      if (std::isinf(top)) continue;
      for (std::size_t s = 0; s < splits; ++s) {
        const long double l = lses.values[(t * splits + s) * heads + h];
        if (std::isinf(l)) continue;
        const long double w = std::exp(l - top);
        sum += w;
        for (std::size_t d = 0; d < dim; ++d)
          out[(t * heads + h) * dim + d] +=
              static_cast<double>(w * outs.values[((t * splits + s) * heads + h) * dim + d]);
      }
      for (std::size_t d = 0; d < dim; ++d) out[(t * heads + h) * dim + d] /= static_cast<double>(sum);
      lse[t * heads + h] = static_cast<double>(top + std::log(sum));
    }
  }
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

struct Peers {
  bool flashinfer = true, cosine = true, mean_error = true;
};

Peers peer_gates(const std::vector<double>& expected, const std::vector<double>& actual,
                 std::size_t outputs) {
  Peers p;
  double dot = 0, ee = 0, aa = 0, absolute = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    const bool both_minus_infinity = e == -INFINITY && a == -INFINITY;  // allclose: equal infinities
    if (!both_minus_infinity && !(std::fabs(a - e) <= 1e-2 + 1e-5 * std::fabs(e))) p.flashinfer = false;
    if (i >= outputs) continue;
    dot += e * a;
    ee += e * e;
    aa += a * a;
    absolute += std::fabs(a - e);
  }
  const double cosine = dot / std::sqrt(ee * aa);
  p.cosine = cosine >= 0.99;  // NaN compares false: fails
  p.mean_error = absolute / static_cast<double>(outputs) <= 0.02;
  return p;
}

TEST(MergeKernels, HonestMergePassesAndEveryTwinFailsSharpcheckBesideThePeersGates) {
  gate::GateSettings settings;
  const auto cases = gate::external_cases_of(ops::attention_merge_operation, bf16, settings);
  std::map<std::string, Peers> missed;  // per twin: true where a peer gate passed every case
  std::printf("%-40s %-10s %-11s %-7s %-10s\n", "kernel", "sharpcheck", "FlashInfer", "cosine", "mean |e|");
  for (const ops::merge::Kernel& kernel : ops::merge::kernels()) {
    bool sharp_passed = true;
    Peers all;
    for (const gate::ExternalCase& c : *cases) {
      const std::vector<double> got = ops::merge::run(kernel, c, bf16);
      gate::CaseOutcome outcome;
      gate::judge_external_outputs(ops::attention_merge_operation, c, bf16, got, std::string(kernel.name),
                                   outcome);
      sharp_passed = sharp_passed && outcome.passed();
      const std::size_t outputs = named(c.outputs, "out").shape[0] * named(c.outputs, "out").shape[1] *
                                  named(c.outputs, "out").shape[2];
      const Peers p = peer_gates(merged_exactly(c), got, outputs);
      all.flashinfer = all.flashinfer && p.flashinfer;
      all.cosine = all.cosine && p.cosine;
      all.mean_error = all.mean_error && p.mean_error;
    }
    const auto word = [](bool passed) { return passed ? "pass" : "FAIL"; };
    std::printf("%-40s %-10s %-11s %-7s %-10s\n", std::string(kernel.name).c_str(), word(sharp_passed),
                word(all.flashinfer), word(all.cosine), word(all.mean_error));
    if (!kernel.deliberately_broken) {
      EXPECT_TRUE(sharp_passed && all.flashinfer && all.cosine && all.mean_error) << kernel.name;
    } else {
      EXPECT_FALSE(sharp_passed) << kernel.name << " passed sharpcheck";
      missed[std::string(kernel.name)] = all;
    }
  }
  // What the output-only gates cannot see: the merged LSE taken as the largest partial's.
  EXPECT_TRUE(missed["merge_states_bf16_max_for_lse"].cosine);
  EXPECT_TRUE(missed["merge_states_bf16_max_for_lse"].mean_error);
  EXPECT_FALSE(missed["merge_states_bf16_max_for_lse"].flashinfer);
}

}  // namespace
}  // namespace sharpcheck
