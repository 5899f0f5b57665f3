// Judging arrays that hold outputs computed elsewhere (a GPU kernel, PyTorch, JAX): softmax or
// log-softmax lanes of N-D arrays, and attention from one head's matrices to a whole layer's 4-D
// tensors. The one path shared by `compare` (arrays read from .npy/.npz files, gate/compare_files)
// and the Python module (arrays handed over in memory, python/): same judge, tolerance entries,
// case records and messages.
//
// How stored numbers become values (the same for files and Python buffers): floating-point
// arrays hold values of the format; uint16/int16 arrays hold 16-bit patterns (bf16, or fp16 when
// that is the format); uint8 arrays hold fp8 patterns when the format is fp8; the quantized grids
// take int8 codes with zero point -128 ("int8") or uint8 codes with zero point 0 ("uint8"), each
// code c meaning (c - zero point) / 256.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/matrix.hpp"
#include "gate/cases.hpp"
#include "io/npy.hpp"
#include "kernels/registry.hpp"
#include "tensor/attention_problem.hpp"
#include "tensor/tensor_source.hpp"

namespace sharpcheck::gate {

// A format name as users give it ("fp32", "bf16", "int8", ...): the format its values belong to,
// and the zero point of the quantized grids.
struct StoredFormat {
  const FloatFormat* format = &fp32;
  std::optional<int> zero_point;
  std::string name;
};
// InputError naming the accepted names for any other.
[[nodiscard]] StoredFormat stored_format(const std::string& name);

// The value a stored number stands for (see the header), `raw` being the number as its type reads
// (a bit pattern as an integer). InputError naming the array and the element's index for codes of
// the wrong signedness.
[[nodiscard]] double decode_stored(double raw, io::NpyType type, const StoredFormat& stored,
                                   const std::string& array, std::size_t index);

// An N-D array of values in C order, decoded by whoever reads it. `name` says what it is in
// messages (a path, an option, a Python parameter).
class Array : public tensor::TensorSource {
 public:
  [[nodiscard]] virtual const std::vector<std::size_t>& shape() const = 0;
  [[nodiscard]] virtual const std::string& name() const = 0;
  // Lanes [first, first + count) of `lanes`, one per row of the result.
  [[nodiscard]] virtual Matrix read_lanes(const io::NpyLanes& lanes, std::size_t first,
                                          std::size_t count) const;
};

// Every element of `array`, in order (a whole small array: index tables, LSEs, one call's output).
[[nodiscard]] inline std::vector<double> all_values(const Array& array) {
  std::vector<double> values(array.size());
  array.read(0, values);
  return values;
}

// Values already in memory with a shape and a name: arrays a judge builds itself (the merge's
// one-query view) or a test hands it.
class MemoryArray final : public Array {
 public:
  MemoryArray(std::string name, std::vector<std::size_t> shape, std::vector<double> values)
      : name_(std::move(name)), shape_(std::move(shape)), values_(std::move(values)) {}
  [[nodiscard]] std::size_t size() const override { return values_.size(); }
  void read(std::size_t first, std::span<double> out) const override {
    std::copy_n(values_.begin() + static_cast<std::ptrdiff_t>(first), out.size(), out.begin());
  }
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return shape_; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] const std::vector<double>& values() const { return values_; }

 private:
  std::string name_;
  std::vector<std::size_t> shape_;
  std::vector<double> values_;
};

// The lanes of `array` along `dim` (negative counts from the end, as torch's dim; a 0-D array is
// one lane of one element). InputError naming the array for a dim outside its axes.
[[nodiscard]] io::NpyLanes lanes_along_dim(const Array& array, int dim);

// How to judge: everything `compare` and the Python asserts say besides the arrays.
struct JudgeOptions {
  bool log_softmax = false;  // the outputs are log-probabilities
  // The row operation judged (softmax, or one of the escapes: adaptive temperature, SSMax, ...);
  // log_softmax applies to softmax alone.
  kernels::Operation operation = kernels::Operation::softmax;
  int dim = -1;  // the softmax axis (negative: from the end, as torch's dim)
  std::string format =
      "fp32";  // the outputs' format (fp64, fp32, tf32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, uint8)
  // default: plugin_softmax (softmax), the grid's name; attention: every recipe the formats allow
  // (metrics/recipes.hpp), the verdict under the first that fits
  std::string tolerance_entry;
  std::string default_entry;  // row operations: the entry used when tolerance_entry is empty
  // How bit patterns in q, k, v or logits are read (default: as format); for attention also which
  // recipes a judgement with no recipe named tries.
  std::string input_format;
  double theta = 1.0;
  // Attention: the layout and scores; shapes, heads and KV heads come from the arrays.
  std::string layout = "bhsd";
  tensor::HeadScores scores;
  std::vector<std::size_t> query_lengths, key_lengths, cu_seqlens_q, cu_seqlens_k;
  bool lse_base2 = false;
  // The format the log-sum-exp is stored in and judged in (a kernel may hand it over in bf16).
  std::string lse_format = "fp32";
  std::string name;  // the kernel's name in reports (default: "compare:" + the output's name)
  metrics::Tier strictest = metrics::Tier::statistical;  // Tier::proven: the proven tier alone
  unsigned threads = 0;                                  // 0: every core
};

// Attention's arrays: q, k, v and out in the layout (2-D arrays are one head's matrices), the
// log-sum-exp if judged, per-head values, and an explicit mask or additive bias with their
// [B|1, H|1, seq_q, seq_k] extents (spans the caller keeps alive).
struct AttentionArrays {
  const Array* q = nullptr;
  const Array* k = nullptr;
  const Array* v = nullptr;
  const Array* out = nullptr;
  const Array* lse = nullptr;
  std::vector<double> sinks, alibi_slopes;
  std::span<const std::uint8_t> keep;
  tensor::Broadcast keep_extent;
  std::span<const double> bias;
  tensor::Broadcast bias_extent;
};

// The attention problem the arrays' shapes and the options describe (q, k and v must be set; out
// and lse are not read). InputError for shapes that disagree or do not fit the layout.
[[nodiscard]] tensor::AttentionProblem attention_problem_of(const JudgeOptions& options,
                                                            const AttentionArrays& arrays);

// Judges outputs against the correctly rounded softmax (or log-softmax) of the logits along
// options.dim, blocks of lanes in parallel. The outcome's comparison, failures (naming the worst
// element's C-order index) and case fields are filled as for a gate case. InputError naming the
// array and element for empty arrays, mismatched shapes and outputs that are not values of the format.
[[nodiscard]] CaseOutcome judge_softmax_arrays(const JudgeOptions& options, const Array& logits,
                                               const Array& outputs);

// Judges attention outputs (and the log-sum-exp) head by head; the same errors, and shapes that
// disagree on batch, keys, KV heads or head dim.
[[nodiscard]] CaseOutcome judge_attention_arrays(const JudgeOptions& options, const AttentionArrays& arrays);

}  // namespace sharpcheck::gate
