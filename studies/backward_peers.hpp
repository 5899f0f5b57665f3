// The attention backward kernels (kernels/attention_backward.hpp) on the backward sweep
// (inputs/attention_backward_cases.hpp), judged three ways in one run (issue 17's peer table):
//   sharpcheck: the correctly rounded gradients and the kernel's tolerance entry;
//   PyTorch's rule (test_transformers, flash against math): with gold the fp64 (here: correctly
//     rounded to fp64) gradients and lowp the math path in the kernel's format,
//     max |test - gold| <= max(1e-5, fudge max |lowp - gold|) per gradient, fudge 180 for dQ,
//     16 for dK, 4 for dV (grad_query's 180 is the flash backend's; mem-efficient uses 160);
//   FlashAttention's rule: max |test - gold| <= 3 max |lowp - gold| per gradient.
// A NaN fails every rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sharpcheck::studies {

struct PeerVerdicts {
  std::string kernel;
  std::string case_name;
  bool deliberately_broken = false;
  bool sharpcheck_fails = false;
  double bound_ratio = 0;  // sharpcheck's worst over dQ, dK, dV, dsink and D (the kernels expose D)
  std::string worst;       // sharpcheck's worst element, named
  bool pytorch_fails = false;
  bool flash_fails = false;
};

struct BackwardPeerStudy {
  std::vector<PeerVerdicts> rows;  // kernel x case, in registry and sweep order
};

[[nodiscard]] BackwardPeerStudy run_backward_peer_study(std::uint64_t seed = 20241008, unsigned threads = 0);

}  // namespace sharpcheck::studies
