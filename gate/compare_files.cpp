#include "gate/compare_files.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/errors.hpp"
#include "io/npy.hpp"
#include "io/npz.hpp"
#include "kernels/registry.hpp"
#include "metrics/evaluate.hpp"
#include "metrics/judge_tensors.hpp"

namespace sharpcheck::gate {
namespace {

[[noreturn]] void refuse(InputProblem problem, const std::string& message) {
  throw InputError(problem, "compare: " + message);
}

// How a file's numbers become values (the header of compare_files.hpp).
struct StoredFormat {
  const FloatFormat* format = &fp32;
  std::optional<int> zero_point;  // the quantized grids
  std::string name;
};

StoredFormat stored_format(const std::string& name) {
  if (name == "int8") return {&q8_probabilities, -128, name};
  if (name == "uint8") return {&q8_probabilities, 0, name};
  const auto lookup = find_float_format(name);
  if (!lookup) {
    refuse(InputProblem::unsupported_format,
           "--format must be fp64, fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8 or uint8, got '" + name + "'");
  }
  return {*lookup, std::nullopt, name};
}

double decode_stored(double raw, io::NpyType type, const StoredFormat& stored, const std::string& path,
                     std::size_t index) {
  const auto where = [&] { return path + ": element " + std::to_string(index); };
  switch (type) {
    case io::NpyType::uint16:
    case io::NpyType::int16:
      return decode(static_cast<std::uint64_t>(raw), *stored.format == fp16 ? fp16 : bf16);
    case io::NpyType::uint8:
    case io::NpyType::int8:
      if (stored.zero_point) {
        if ((type == io::NpyType::int8) != (*stored.zero_point == -128)) {
          refuse(InputProblem::unsupported_format, path + ": " + stored.name + " codes must be " +
                                                       (*stored.zero_point == -128 ? "int8" : "uint8"));
        }
        return (raw - *stored.zero_point) / 256.0;
      }
      if (type == io::NpyType::uint8 && stored.format->total_bits() == 8) {
        return decode(static_cast<std::uint64_t>(raw), *stored.format);  // fp8 bit patterns
      }
      if (type == io::NpyType::uint8)
        refuse(InputProblem::unsupported_format,
               where() + ": uint8 data is read as fp8 bits or uint8 codes only");
      return raw;
    default:
      return raw;
  }
}

// A whole N-D array as values (decoded as the stored format says), refused when empty.
io::NpyArray read_values(const std::string& path, const StoredFormat& stored) {
  io::NpyArray array = io::read_npy(path);
  if (array.element_count() == 0) refuse(InputProblem::empty_input, path + " holds no element");
  for (std::size_t i = 0; i < array.values.size(); ++i)
    array.values[i] = decode_stored(array.values[i], array.type, stored, path, i);
  return array;
}

using Lanes = io::NpyLanes;

// The softmax lanes along --dim (negative counts from the end, as torch's dim).
Lanes lanes_of(const std::vector<std::size_t>& shape, int dim, const std::string& path) {
  if (shape.empty()) return {};
  const auto rank = static_cast<int>(shape.size());
  if (dim < -rank || dim >= rank) {
    refuse(InputProblem::out_of_range,
           "--dim " + std::to_string(dim) + " is outside " + path + "'s " + std::to_string(rank) + " axes");
  }
  return io::lanes_along(shape, static_cast<std::size_t>(dim < 0 ? dim + rank : dim));
}

Matrix read_lanes(const io::NpyFile& file, const Lanes& lanes, std::size_t first, std::size_t count,
                  const StoredFormat& stored) {
  Matrix matrix = file.read_lanes(lanes, first, count);
  for (std::size_t r = 0; r < count; ++r) {
    for (std::size_t a = 0; a < matrix.cols; ++a) {
      matrix(r, a) =
          decode_stored(matrix(r, a), file.layout().type, stored, file.path(), lanes.c_index(first + r, a));
    }
  }
  return matrix;
}

// Every output must be a value of its format (log-probabilities may also be -inf, a masked entry).
void require_value_of(double value, const StoredFormat& stored, const std::string& path, std::size_t index,
                      bool minus_infinity_allowed = false) {
  if (minus_infinity_allowed && value == -INFINITY) return;
  if (!is_representable(value, *stored.format)) {
    refuse(InputProblem::out_of_range, path + ": element " + std::to_string(index) + " (" + hex_float(value) +
                                           ") is not a " + stored.name + " value");
  }
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t axis = 0; axis < shape.size(); ++axis)
    text += (axis ? ", " : "") + std::to_string(shape[axis]);
  return text + "]";
}

std::string kernel_name(const CompareRequest& request, const std::string& output_path) {
  return request.name.empty() ? "compare:" + std::filesystem::path(output_path).filename().string()
                              : request.name;
}

// Softmax (or log-softmax) rows judged a block at a time (about 4 M elements), so memory stays at
// the blocks' size whatever the files' size; the blocks' comparisons are folded into one.
void compare_rows(const CompareRequest& request, const StoredFormat& output, const StoredFormat& input,
                  CaseOutcome& outcome) {
  if (request.probabilities.empty()) refuse(InputProblem::out_of_range, "--probs is required");
  outcome.gate_case.kernel = kernel_name(request, request.probabilities);
  const io::NpyFile logits(request.logits);
  const io::NpyFile probabilities(request.probabilities);
  const Lanes lanes = lanes_of(logits.layout().shape, request.dim, request.logits);
  if (lanes.count * lanes.extent == 0) {
    refuse(InputProblem::empty_input,
           request.logits + " holds no element (shape " + shape_text(logits.layout().shape) + ")");
  }
  if (logits.layout().shape != probabilities.layout().shape) {
    refuse(InputProblem::shape_mismatch,
           "--probs does not match --logits: " + shape_text(logits.layout().shape) + " against " +
               shape_text(probabilities.layout().shape));
  }
  const std::string default_entry = output.zero_point ? output.name : "plugin_softmax";
  const auto& tolerance =
      metrics::tolerance_for(request.tolerance_entry.empty() ? default_entry : request.tolerance_entry);
  const metrics::JudgeSpec spec{kernels::Operation::softmax, output.format, &tolerance};
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{1} << 22) / lanes.extent);
  for (std::size_t first = 0; first < lanes.count; first += block) {
    const std::size_t count = std::min(block, lanes.count - first);
    Matrix actual = read_lanes(probabilities, lanes, first, count, output);
    for (std::size_t r = 0; r < count; ++r) {
      for (std::size_t a = 0; a < actual.cols; ++a) {
        require_value_of(actual(r, a), output, request.probabilities, lanes.c_index(first + r, a),
                         request.log_softmax);
      }
    }
    const Matrix logit_rows = read_lanes(logits, lanes, first, count, input);
    const auto evaluation =
        request.log_softmax
            ? metrics::judge_log_softmax(spec, logit_rows, request.theta, std::move(actual), first)
            : metrics::judge_softmax(spec, logit_rows, request.theta, std::move(actual), first);
    outcome.comparison.merge(evaluation.comparison);
    outcome.reference_statistics.merge(evaluation.reference_statistics);
  }
  if (!outcome.comparison.passed(request.strictest) && lanes.inner != 1) {
    outcome.failures.push_back(
        "the worst element, lane " + std::to_string(outcome.comparison.worst.row) + " position " +
        std::to_string(outcome.comparison.worst.index) + " along --dim " + std::to_string(request.dim) +
        ", is element " +
        std::to_string(lanes.c_index(outcome.comparison.worst.row, outcome.comparison.worst.index)) +
        " of the arrays in C order");
  }
  outcome.gate_case.n = lanes.extent;
}

// FlashAttention 3's per-tensor descale: the real value is the stored one times the factor,
// which must leave the product exact (else the real input is not a double and none can judge it).
struct Descale {
  double factor = 1;
  const char* option = "";
  void check() const {
    if (!std::isfinite(factor) || factor <= 0)
      refuse(InputProblem::out_of_range, std::string(option) + " must be finite and positive");
  }
  [[nodiscard]] double apply(double x) const {
    if (factor == 1.0) return x;
    const double product = x * factor;
    if (std::fma(x, factor, -product) != 0.0) {
      refuse(InputProblem::out_of_range, std::string(option) + ": " + hex_float(x) + " x " +
                                             hex_float(factor) + " is not exact in double");
    }
    return product;
  }
};

// A tensor file (.npy or an .npz member) decoded as its stored format says while it is read:
// descaled for inputs, checked to be values of the format for outputs.
class DecodedFile final : public tensor::TensorSource {
 public:
  DecodedFile(const std::string& path, StoredFormat stored, Descale descale = {}, bool output = false)
      : file_(path), stored_(std::move(stored)), descale_(descale), output_(output) {
    descale_.check();
    if (file_.layout().element_count() == 0) refuse(InputProblem::empty_input, path + " holds no element");
  }
  [[nodiscard]] std::size_t size() const override { return file_.layout().element_count(); }
  [[nodiscard]] const std::vector<std::size_t>& shape() const { return file_.layout().shape; }
  void read(std::size_t first, std::span<double> out) const override {
    file_.read_elements(first, out);
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = descale_.apply(decode_stored(out[i], file_.layout().type, stored_, file_.path(), first + i));
      if (output_) require_value_of(out[i], stored_, file_.path(), first + i);
    }
  }

 private:
  io::NpyFile file_;
  StoredFormat stored_;
  Descale descale_;
  bool output_;
};

// A 2-D array (one head's matrix, rows x columns) read as [1, 1, rows, columns].
std::vector<std::size_t> as_one_head(std::vector<std::size_t> shape) {
  if (shape.size() == 1) return {1, 1, 1, shape[0]};
  if (shape.size() == 2) return {1, 1, shape[0], shape[1]};
  return shape;
}

struct TensorShapes {
  std::vector<std::size_t> q, k, v;
};

// The problem the tensors' shapes describe: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd), or
// [T, H, D] (packed, with cumulative lengths); KV heads from K's shape.
tensor::AttentionProblem problem_from(const CompareRequest& request, const TensorShapes& shapes) {
  const auto& [q, k, v] = shapes;
  tensor::AttentionProblem problem;
  problem.layout = tensor::parse_layout(request.layout);
  const std::size_t dims = problem.layout == tensor::Layout::packed ? 3 : 4;
  for (const auto* shape : {&q, &k, &v}) {
    if (shape->size() != dims) {
      refuse(InputProblem::shape_mismatch, "layout " + request.layout + " needs " + std::to_string(dims) +
                                               "-D --q, --k and --v (or 2-D matrices of one head), got " +
                                               std::to_string(shape->size()) + "-D");
    }
  }
  auto& shape = problem.shape;
  if (problem.layout == tensor::Layout::packed) {
    problem.cu_seqlens_q = request.cu_seqlens_q;
    problem.cu_seqlens_k = request.cu_seqlens_k;
    if (problem.cu_seqlens_q.size() < 2)
      refuse(InputProblem::out_of_range, "the packed layout needs --cu-seqlens-q and --cu-seqlens-k");
    shape = {problem.cu_seqlens_q.size() - 1, q[1], k[1], 0, 0, q[2], v[2]};
    if (q[0] != problem.cu_seqlens_q.back() || k[0] != problem.cu_seqlens_k.back()) {
      refuse(InputProblem::shape_mismatch,
             "the cumulative lengths end at " + std::to_string(problem.cu_seqlens_q.back()) + " and " +
                 std::to_string(problem.cu_seqlens_k.back()) + ", the tensors hold " + std::to_string(q[0]) +
                 " and " + std::to_string(k[0]) + " tokens");
    }
  } else {
    const bool bshd = problem.layout == tensor::Layout::bshd;
    shape = {q[0], q[bshd ? 2 : 1], k[bshd ? 2 : 1], q[bshd ? 1 : 2], k[bshd ? 1 : 2], q[3], v[3]};
    if (k[0] != shape.batch || v[0] != shape.batch || k[3] != shape.head_dim ||
        v[bshd ? 1 : 2] != shape.keys || v[bshd ? 2 : 1] != shape.kv_heads) {
      refuse(InputProblem::shape_mismatch, "--q, --k and --v disagree on batch, keys, KV heads or head dim");
    }
    problem.query_lengths = request.query_lengths;
    problem.key_lengths = request.key_lengths;
  }
  problem.scores = request.scores;
  problem.scores.theta = request.theta;
  const StoredFormat plain{&fp64, std::nullopt, "fp64"};
  if (!request.sinks.empty()) problem.sinks = read_values(request.sinks, plain).values;
  if (!request.alibi_slopes.empty()) problem.alibi_slopes = read_values(request.alibi_slopes, plain).values;
  return problem;
}

void compare_attention(const CompareRequest& request, const StoredFormat& output, const StoredFormat& input,
                       CaseOutcome& outcome) {
  if (request.k.empty() || request.v.empty() || request.out.empty()) {
    refuse(InputProblem::out_of_range, "attention needs --q, --k, --v and --out");
  }
  outcome.gate_case.kernel = kernel_name(request, request.out);
  const DecodedFile q(request.q, input, {request.q_descale, "--q-descale"});
  const DecodedFile k(request.k, input, {request.k_descale, "--k-descale"});
  const DecodedFile v(request.v, input, {request.v_descale, "--v-descale"});
  const DecodedFile out(request.out, output, {}, true);
  const bool one_head = q.shape().size() <= 2;
  const auto shape_of = [&](const DecodedFile& file) {
    return one_head ? as_one_head(file.shape()) : file.shape();
  };
  const tensor::AttentionProblem problem = problem_from(request, {shape_of(q), shape_of(k), shape_of(v)});
  if (out.size() != problem.output_elements()) {
    refuse(InputProblem::shape_mismatch, "--out holds " + std::to_string(out.size()) +
                                             " elements, the problem (" + problem.describe() + ") has " +
                                             std::to_string(problem.output_elements()));
  }
  std::optional<DecodedFile> lse;
  if (!request.lse.empty()) lse.emplace(request.lse, StoredFormat{&fp32, std::nullopt, "fp32"});
  const auto& tolerance =
      metrics::tolerance_for(request.tolerance_entry.empty() ? "attention_flash" : request.tolerance_entry);
  metrics::JudgeSpec spec{kernels::Operation::attention, output.format, &tolerance};
  spec.lse_base2 = request.lse_base2;
  const auto judgement = metrics::judge_attention_tensors(spec, problem, q, k, v, out, lse ? &*lse : nullptr);
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  outcome.gate_case.n = problem.layout == tensor::Layout::packed ? problem.stored_keys() : problem.shape.keys;
  if (!outcome.comparison.passed(request.strictest)) {
    outcome.failures.push_back(outcome.comparison.failure_summary(request.strictest) + " in " +
                               problem.describe() + "; " + judgement.describe_worst());
  }
}

// The paths left empty taken from the bundle's members of the same names, where it has them.
CompareRequest with_bundle(CompareRequest request) {
  if (request.bundle.empty()) return request;
  if (!request.bundle.ends_with(".npz")) refuse(InputProblem::out_of_range, "--bundle must be an .npz file");
  std::vector<io::NpzMember> members;
  {
    const io::MappedFile archive(request.bundle);
    members = io::list_npz_members(archive.bytes(), request.bundle);
  }
  const auto has = [&](const std::string& name) {
    return std::any_of(members.begin(), members.end(),
                       [&](const io::NpzMember& member) { return io::npz_member_is(member, name); });
  };
  for (auto& [field, name] : {std::pair{&request.logits, "logits"},
                              {&request.probabilities, "probs"},
                              {&request.q, "q"},
                              {&request.k, "k"},
                              {&request.v, "v"},
                              {&request.out, "out"},
                              {&request.lse, "lse"},
                              {&request.sinks, "sinks"},
                              {&request.alibi_slopes, "alibi_slopes"}}) {
    if (field->empty() && has(name)) *field = request.bundle + ":" + name;
  }
  if (request.name.empty())
    request.name = "compare:" + std::filesystem::path(request.bundle).filename().string();
  return request;
}

}  // namespace

CaseOutcome compare_files(const CompareRequest& given) {
  const CompareRequest request = with_bundle(given);
  const bool attention = !request.q.empty();
  if (attention == !request.logits.empty()) {
    refuse(InputProblem::out_of_range, "give either --logits and --probs, or --q --k --v --out");
  }
  const StoredFormat output = stored_format(request.format);
  const StoredFormat input = request.input_format.empty() ? output : stored_format(request.input_format);
  CaseOutcome outcome;
  outcome.format = output.name;
  outcome.gate_case.input = "npy";
  if (attention) {
    compare_attention(request, output, input, outcome);
  } else {
    compare_rows(request, output, input, outcome);
  }
  // The tier's summary first (a softmax along --dim has already said where its worst element is).
  if (!outcome.comparison.passed(request.strictest) && !attention) {
    outcome.failures.insert(outcome.failures.begin(), outcome.comparison.failure_summary(request.strictest));
  }
  return outcome;
}

}  // namespace sharpcheck::gate
