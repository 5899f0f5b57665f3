// The attention backward kernels on the backward sweep (inputs/attention_backward_cases.hpp):
// the honest kernels pass every case; every deliberately broken twin fails some case with its
// worst element named; and sharpcheck catches every twin that PyTorch's or FlashAttention's rule
// catches, and the twins they miss (studies/backward_peers.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "core/random.hpp"
#include "inputs/rows.hpp"
#include "kernels/softmax_backward.hpp"
#include "metrics/judge_backward.hpp"
#include "studies/backward_peers.hpp"

namespace sharpcheck::studies {
namespace {

const BackwardPeerStudy& study() {
  static const BackwardPeerStudy result = run_backward_peer_study();
  return result;
}

TEST(AttentionBackwardKernels, HonestKernelsPassEveryCase) {
  std::size_t honest = 0;
  for (const PeerVerdicts& row : study().rows) {
    if (row.deliberately_broken) continue;
    ++honest;
    EXPECT_FALSE(row.sharpcheck_fails) << row.kernel << " on " << row.case_name << ": " << row.worst;
    EXPECT_LE(row.bound_ratio, 1.0) << row.kernel << " on " << row.case_name;
  }
  // plain and flash in fp32 and bf16, FlashAttention 2/3 and the math path in bf16 and fp16, on
  // nine cases each
  EXPECT_EQ(honest, 8u * 9u);
}

TEST(AttentionBackwardKernels, EveryBrokenTwinFailsACaseAndSharpcheckCatchesWhatPeersCatch) {
  std::map<std::string, std::vector<const PeerVerdicts*>> by_kernel;
  for (const PeerVerdicts& row : study().rows) {
    if (row.deliberately_broken) by_kernel[row.kernel].push_back(&row);
  }
  ASSERT_EQ(by_kernel.size(), 8u);  // four bug classes, under the fp32-inside entry and the bf16 recipe
  for (const auto& [kernel, rows] : by_kernel) {
    bool caught = false, pytorch = false, flash = false;
    for (const PeerVerdicts* row : rows) {
      caught = caught || row->sharpcheck_fails;
      pytorch = pytorch || row->pytorch_fails;
      flash = flash || row->flash_fails;
      // Per case too: where a peer rule fails the kernel, sharpcheck does.
      if (row->pytorch_fails || row->flash_fails) {
        EXPECT_TRUE(row->sharpcheck_fails) << kernel << " on " << row->case_name << ": a peer catches it";
      }
      if (row->sharpcheck_fails)
        std::printf("%s on %s: %s\n", kernel.c_str(), row->case_name.c_str(), row->worst.c_str());
    }
    EXPECT_TRUE(caught) << kernel;
    std::printf("%s: sharpcheck %d, PyTorch's rule %d, FlashAttention's rule %d\n", kernel.c_str(), caught,
                pytorch, flash);
  }
}

// The softmax-level backward kernels: the honest ones pass every row kind (with a fully masked
// row beside it), the fp16-accumulating log-softmax backward and the unguarded one fail.
TEST(SoftmaxBackwardKernels, HonestPassAndTwinsFail) {
  for (const auto& kernel : kernels::softmax_backward_kernels()) {
    std::size_t failed = 0, cases = 0;
    for (const inputs::RowKind kind : inputs::all_row_kinds) {
      for (const std::size_t n : {std::size_t{16}, std::size_t{1000}}) {
        const auto row = inputs::make_row(kind, n, *kernel.format, 17 + n);
        Matrix logits(2, n, -INFINITY), dy(2, n), dx;
        std::copy(row.begin(), row.end(), logits.row(0).begin());
        DeterministicRandom random(n);
        for (double& g : dy.values) g = round_to_format(random.normal(0, 1), *kernel.format);
        kernel.run(logits, dy, dx);
        const auto comparison = metrics::judge_softmax_backward(kernel, logits, dy, dx);
        ++cases;
        if (!comparison.passed()) ++failed;
        if (!kernel.deliberately_broken) {
          EXPECT_TRUE(comparison.passed()) << kernel.name << " " << inputs::row_kind_name(kind) << " n=" << n
                                           << ": " << comparison.worst.describe();
        }
      }
    }
    if (kernel.deliberately_broken) {
      EXPECT_GT(failed, cases / 2) << kernel.name;
    }
  }
}

}  // namespace
}  // namespace sharpcheck::studies
