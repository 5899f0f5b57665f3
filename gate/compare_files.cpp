#include "gate/compare_files.hpp"

#include <cmath>
#include <filesystem>
#include <optional>

#include "core/errors.hpp"
#include "io/npy.hpp"
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

// Every output must be a value of its format (log-probabilities may also be -inf, a masked entry).
void require_values_of(const std::vector<double>& values, const StoredFormat& stored, const std::string& path,
                       std::size_t first_index, bool minus_infinity_allowed = false) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (minus_infinity_allowed && values[i] == -INFINITY) continue;
    if (!is_representable(values[i], *stored.format)) {
      refuse(InputProblem::out_of_range, path + ": element " + std::to_string(first_index + i) + " (" +
                                             hex_float(values[i]) + ") is not a " + stored.name + " value");
    }
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

Matrix read_rows(const io::NpyFile& file, const std::string& path, std::size_t first, std::size_t count,
                 const StoredFormat& stored) {
  Matrix matrix = file.read_rows(first, count);
  for (std::size_t i = 0; i < matrix.values.size(); ++i)
    matrix.values[i] =
        decode_stored(matrix.values[i], file.layout().type, stored, path, first * file.cols() + i);
  return matrix;
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
  if (logits.rows() * logits.cols() == 0) {
    refuse(InputProblem::empty_input, request.logits + " holds no element (shape " +
                                          std::to_string(logits.rows()) + "x" +
                                          std::to_string(logits.cols()) + ")");
  }
  if (logits.rows() != probabilities.rows() || logits.cols() != probabilities.cols()) {
    refuse(InputProblem::shape_mismatch, "--probs does not match --logits: " + std::to_string(logits.rows()) +
                                             "x" + std::to_string(logits.cols()) + " against " +
                                             std::to_string(probabilities.rows()) + "x" +
                                             std::to_string(probabilities.cols()));
  }
  const std::string default_entry = output.zero_point ? output.name : "plugin_softmax";
  const auto& tolerance =
      metrics::tolerance_for(request.tolerance_entry.empty() ? default_entry : request.tolerance_entry);
  const metrics::JudgeSpec spec{kernels::Operation::softmax, output.format, &tolerance};
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{1} << 22) / logits.cols());
  for (std::size_t first = 0; first < logits.rows(); first += block) {
    const std::size_t count = std::min(block, logits.rows() - first);
    Matrix actual = read_rows(probabilities, request.probabilities, first, count, output);
    require_values_of(actual.values, output, request.probabilities, first * logits.cols(),
                      request.log_softmax);
    const Matrix logit_rows = read_rows(logits, request.logits, first, count, input);
    const auto evaluation =
        request.log_softmax
            ? metrics::judge_log_softmax(spec, logit_rows, request.theta, std::move(actual), first)
            : metrics::judge_softmax(spec, logit_rows, request.theta, std::move(actual), first);
    outcome.comparison.merge(evaluation.comparison);
    outcome.reference_statistics.merge(evaluation.reference_statistics);
  }
  outcome.gate_case.n = logits.cols();
}

// Multiplies every value by a descale factor, which must leave each product exact.
void descale(std::vector<double>& values, double factor, const char* option) {
  if (factor == 1.0) return;
  if (!std::isfinite(factor) || factor <= 0)
    refuse(InputProblem::out_of_range, std::string(option) + " must be finite and positive");
  for (double& x : values) {
    const double product = x * factor;
    if (std::fma(x, factor, -product) != 0.0) {
      refuse(InputProblem::out_of_range, std::string(option) + ": " + hex_float(x) + " x " +
                                             hex_float(factor) + " is not exact in double");
    }
    x = product;
  }
}

}  // namespace

namespace {

// A 2-D array (one head's matrix, rows x columns) read as [1, 1, rows, columns].
void as_one_head(io::NpyArray& array) {
  if (array.shape.size() == 1) array.shape = {1, 1, 1, array.shape[0]};
  if (array.shape.size() == 2) array.shape = {1, 1, array.shape[0], array.shape[1]};
}

// The problem the tensors' shapes describe: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd), or
// [T, H, D] (packed, with cumulative lengths); KV heads from K's shape.
tensor::AttentionProblem problem_from(const CompareRequest& request, const io::NpyArray& q,
                                      const io::NpyArray& k, const io::NpyArray& v) {
  tensor::AttentionProblem problem;
  problem.layout = tensor::parse_layout(request.layout);
  const std::size_t dims = problem.layout == tensor::Layout::packed ? 3 : 4;
  for (const auto* array : {&q, &k, &v}) {
    if (array->shape.size() != dims) {
      refuse(InputProblem::shape_mismatch, "layout " + request.layout + " needs " + std::to_string(dims) +
                                               "-D --q, --k and --v (or 2-D matrices of one head), got " +
                                               std::to_string(array->shape.size()) + "-D");
    }
  }
  auto& shape = problem.shape;
  if (problem.layout == tensor::Layout::packed) {
    problem.cu_seqlens_q = request.cu_seqlens_q;
    problem.cu_seqlens_k = request.cu_seqlens_k;
    if (problem.cu_seqlens_q.size() < 2)
      refuse(InputProblem::out_of_range, "the packed layout needs --cu-seqlens-q and --cu-seqlens-k");
    shape = {problem.cu_seqlens_q.size() - 1, q.shape[1], k.shape[1], 0, 0, q.shape[2], v.shape[2]};
    if (q.shape[0] != problem.cu_seqlens_q.back() || k.shape[0] != problem.cu_seqlens_k.back()) {
      refuse(InputProblem::shape_mismatch,
             "the cumulative lengths end at " + std::to_string(problem.cu_seqlens_q.back()) + " and " +
                 std::to_string(problem.cu_seqlens_k.back()) + ", the tensors hold " +
                 std::to_string(q.shape[0]) + " and " + std::to_string(k.shape[0]) + " tokens");
    }
  } else {
    const bool bshd = problem.layout == tensor::Layout::bshd;
    shape = {q.shape[0],
             q.shape[bshd ? 2 : 1],
             k.shape[bshd ? 2 : 1],
             q.shape[bshd ? 1 : 2],
             k.shape[bshd ? 1 : 2],
             q.shape[3],
             v.shape[3]};
    if (k.shape[0] != shape.batch || v.shape[0] != shape.batch || k.shape[3] != shape.head_dim ||
        v.shape[bshd ? 1 : 2] != shape.keys || v.shape[bshd ? 2 : 1] != shape.kv_heads) {
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
  io::NpyArray q = read_values(request.q, input), k = read_values(request.k, input),
               v = read_values(request.v, input);
  io::NpyArray out = read_values(request.out, output);
  if (q.shape.size() <= 2) {
    for (io::NpyArray* array : {&q, &k, &v, &out}) as_one_head(*array);
  }
  descale(q.values, request.q_descale, "--q-descale");
  descale(k.values, request.k_descale, "--k-descale");
  descale(v.values, request.v_descale, "--v-descale");
  const tensor::AttentionProblem problem = problem_from(request, q, k, v);
  if (out.values.size() != problem.output_elements()) {
    refuse(InputProblem::shape_mismatch, "--out holds " + std::to_string(out.values.size()) +
                                             " elements, the problem (" + problem.describe() + ") has " +
                                             std::to_string(problem.output_elements()));
  }
  require_values_of(out.values, output, request.out, 0);
  std::vector<double> lse;
  if (!request.lse.empty()) lse = read_values(request.lse, {&fp32, std::nullopt, "fp32"}).values;
  const auto& tolerance =
      metrics::tolerance_for(request.tolerance_entry.empty() ? "attention_flash" : request.tolerance_entry);
  metrics::JudgeSpec spec{kernels::Operation::attention, output.format, &tolerance};
  spec.lse_base2 = request.lse_base2;
  const auto judgement =
      metrics::judge_attention_tensors(spec, problem, q.values, k.values, v.values, out.values, lse);
  outcome.comparison = judgement.output;
  if (judgement.lse) outcome.comparison.merge(*judgement.lse);
  outcome.reference_statistics = judgement.statistics;
  outcome.gate_case.n = problem.layout == tensor::Layout::packed ? problem.stored_keys() : problem.shape.keys;
  if (!judgement.passed()) {
    outcome.failures.push_back("tolerance table: " + std::to_string(outcome.comparison.violation_count) +
                               " violations in " + problem.describe() + "; " + judgement.describe_worst());
  }
}

}  // namespace

CaseOutcome compare_files(const CompareRequest& request) {
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
  if (!outcome.comparison.passed() && outcome.failures.empty()) {
    outcome.failures.push_back("tolerance table: " + std::to_string(outcome.comparison.violation_count) +
                               " violations; worst " + outcome.comparison.worst.describe());
  }
  return outcome;
}

}  // namespace sharpcheck::gate
