// Judging outputs computed elsewhere (a GPU kernel, PyTorch, JAX) from NumPy files: softmax or
// log-softmax rows, or attention from one head's 2-D matrices to a whole layer's 4-D tensors,
// with the same judge, tolerance entries and case records as the gate. `sharpcheck compare`
// parses its options into a CompareRequest and calls compare_files; the Python module will too.
//
// Files: .npy, or a member of an .npz bundle named "bundle.npz:q" (stored or deflated). Stored values:
// floating-point arrays hold values of the format; uint16/int16 arrays hold 16-bit patterns (bf16, or fp16
// when that is the format), uint8 arrays fp8 patterns when the format is fp8; the quantized grids take int8
// codes with zero point -128 ("int8") or uint8 codes with zero point 0 ("uint8"), each code c meaning (c -
// zero point) / 256.
#pragma once

#include <string>
#include <vector>

#include "gate/cases.hpp"
#include "tensor/attention_problem.hpp"

namespace sharpcheck::gate {

struct CompareRequest {
  std::string bundle;                 // an .npz file whose members stand for the paths below left empty
  std::string logits, probabilities;  // softmax (or log-softmax) rows
  bool log_softmax = false;           // the outputs are log-probabilities
  int dim = -1;                       // the softmax axis of N-D arrays (negative: from the end)
  std::string q, k, v, out, lse;      // attention
  bool lse_base2 = false;
  std::string format =
      "fp32";                // the outputs' format (fp64, fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, uint8)
  std::string input_format;  // how bit patterns in q, k, v or logits are read (default: as format)
  std::string tolerance_entry;  // default plugin_softmax (softmax) or attention_flash
  double theta = 1.0;
  // Attention: the problem's layout and scores; shapes, heads and KV heads come from the files.
  std::string layout = "bhsd";
  tensor::HeadScores scores;
  std::vector<std::size_t> query_lengths, key_lengths, cu_seqlens_q, cu_seqlens_k;
  std::string sinks, alibi_slopes;  // .npy files of one value per query head
  // FlashAttention 3's per-tensor descale factors of fp8 inputs: the real inputs are the stored
  // values times these. Q's and K's fold into the scale, V's into V; each product must be exact.
  double q_descale = 1, k_descale = 1, v_descale = 1;
  std::string name;  // the kernel's name in reports (default compare:<output file name>)
  metrics::Tier strictest = metrics::Tier::statistical;  // --proven-only: the proven tier alone
};

// Judges the files; the outcome's comparison, failures (with the worst element's full index for
// attention tensors) and case fields are filled as for a gate case. Throws InputError naming the
// file and the element for malformed files, values outside the format, and shape mismatches.
[[nodiscard]] CaseOutcome compare_files(const CompareRequest& request);

}  // namespace sharpcheck::gate
