// Judging outputs computed elsewhere (a GPU kernel, PyTorch, JAX) from NumPy files: softmax or
// log-softmax rows, or attention from one head's 2-D matrices to a whole layer's 4-D tensors.
// `sharpcheck compare` parses its options into a CompareRequest and calls compare_files, which
// opens the files as gate::Array (memory-mapped, decoded as read) and judges them with
// gate/judge_arrays.hpp, the path the Python module takes with arrays in memory.
//
// Files: .npy, or a member of an .npz bundle named "bundle.npz:q" (stored or deflated); how stored
// numbers become values is said in gate/judge_arrays.hpp.
#pragma once

#include <string>
#include <vector>

#include "gate/cases.hpp"
#include "gate/judge_arrays.hpp"
#include "gate/judge_backward_arrays.hpp"
#include "gate/operation.hpp"

namespace sharpcheck::gate {

// Files named for each array (empty: not given), and how the judge reads them (JudgeOptions).
struct CompareRequest : JudgeOptions {
  std::string bundle;                 // an .npz file whose members stand for the paths below left empty
  std::string logits, probabilities;  // softmax (or log-softmax) rows
  std::string q, k, v, out, lse;      // attention
  // Attention backward (with q, k, v): the gradient reaching the output, the kernel's gradients,
  // and the gradient reaching the log-sum-exp, if any (gate/judge_backward_arrays.hpp).
  std::string dout, dq, dk, dv, d_lse;
  std::string d;  // the kernel's D = rowsum(dO * O) in fp32, laid out as the log-sum-exp (judged when given)
  std::string sinks, alibi_slopes;  // .npy files of one value per query head
  // FlashAttention 3's per-tensor descale factors of fp8 inputs: the real inputs are the stored
  // values times these. Q's and K's fold into the scale, V's into V; each product must be exact.
  double q_descale = 1, k_descale = 1, v_descale = 1;
};

// Judges the files; the outcome's comparison, failures (with the worst element's full index for
// attention tensors) and case fields are filled as for a gate case. Throws InputError naming the
// file and the element for malformed files, values outside the format, and shape mismatches.
[[nodiscard]] CaseOutcome compare_files(const CompareRequest& request);

// `compare --op NAME key=value ...`: the operation's tensors read from the files named (tensors not
// named taken from `bundle`'s members of the same names, when a bundle is given), each in the
// format its TensorSpec says, the options read through the operation's schema, and judged by the
// operation. The kernel's name defaults to "compare:" and the judged file's name. InputError as
// compare_files, and naming the operation and key for a key it does not take.
[[nodiscard]] CaseOutcome compare_operation(const Operation& operation,
                                            std::vector<std::pair<std::string, std::string>> pairs,
                                            const std::string& bundle);

// The kernel's name in reports, budgets and baselines: request.name, else "compare:" and the
// bundle's or the output file's name.
[[nodiscard]] std::string kernel_name_of(const CompareRequest& request);

}  // namespace sharpcheck::gate
