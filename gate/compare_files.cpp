#include "gate/compare_files.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/errors.hpp"
#include "io/npy.hpp"
#include "io/npz.hpp"

namespace sharpcheck::gate {
namespace {

[[noreturn]] void refuse(InputProblem problem, const std::string& message) {
  throw InputError(problem, "compare: " + message);
}

// A whole N-D array as values (decoded as the stored format says), refused when empty.
std::vector<double> read_values(const std::string& path, const StoredFormat& stored) {
  io::NpyArray array = io::read_npy(path);
  if (array.element_count() == 0) refuse(InputProblem::empty_input, path + " holds no element");
  for (std::size_t i = 0; i < array.values.size(); ++i)
    array.values[i] = decode_stored(array.values[i], array.type, stored, path, i);
  return array.values;
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

// A tensor file (.npy or an .npz member) as an Array, decoded as its stored format says while it
// is read, and descaled where it is an fp8 input.
class DecodedFile final : public Array {
 public:
  DecodedFile(const std::string& option, const std::string& path, StoredFormat stored, Descale descale = {})
      : file_(path), stored_(std::move(stored)), descale_(descale), name_(option + " " + path) {
    descale_.check();
  }
  [[nodiscard]] std::size_t size() const override { return file_.layout().element_count(); }
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return file_.layout().shape; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  void read(std::size_t first, std::span<double> out) const override {
    file_.read_elements(first, out);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(out[i], first + i);
  }
  [[nodiscard]] Matrix read_lanes(const io::NpyLanes& lanes, std::size_t first,
                                  std::size_t count) const override {
    Matrix matrix = file_.read_lanes(lanes, first, count);
    for (std::size_t r = 0; r < count; ++r) {
      for (std::size_t a = 0; a < matrix.cols; ++a)
        matrix(r, a) = value(matrix(r, a), lanes.c_index(first + r, a));
    }
    return matrix;
  }

 private:
  [[nodiscard]] double value(double raw, std::size_t index) const {
    return descale_.apply(decode_stored(raw, file_.layout().type, stored_, file_.path(), index));
  }
  io::NpyFile file_;
  StoredFormat stored_;
  Descale descale_;
  std::string name_;
};

JudgeOptions options_of(const CompareRequest& request) {
  JudgeOptions options = request;
  options.name = kernel_name_of(request);
  return options;
}

CaseOutcome compare_rows(const CompareRequest& request, const StoredFormat& output,
                         const StoredFormat& input) {
  if (request.probabilities.empty()) refuse(InputProblem::out_of_range, "--probs is required");
  const DecodedFile logits("--logits", request.logits, input);
  const DecodedFile probabilities("--probs", request.probabilities, output);
  return judge_softmax_arrays(options_of(request), logits, probabilities);
}

CaseOutcome compare_attention(const CompareRequest& request, const StoredFormat& output,
                              const StoredFormat& input) {
  if (request.k.empty() || request.v.empty() || request.out.empty()) {
    refuse(InputProblem::out_of_range, "attention needs --q, --k, --v and --out");
  }
  const DecodedFile q("--q", request.q, input, {request.q_descale, "--q-descale"});
  const DecodedFile k("--k", request.k, input, {request.k_descale, "--k-descale"});
  const DecodedFile v("--v", request.v, input, {request.v_descale, "--v-descale"});
  const DecodedFile out("--out", request.out, output);
  std::optional<DecodedFile> lse;
  if (!request.lse.empty()) lse.emplace("--lse", request.lse, stored_format(request.lse_format));
  AttentionArrays arrays;
  arrays.q = &q;
  arrays.k = &k;
  arrays.v = &v;
  arrays.out = &out;
  arrays.lse = lse ? &*lse : nullptr;
  const StoredFormat plain{&fp64, std::nullopt, "fp64"};
  if (!request.sinks.empty()) arrays.sinks = read_values(request.sinks, plain);
  if (!request.alibi_slopes.empty()) arrays.alibi_slopes = read_values(request.alibi_slopes, plain);
  return judge_attention_arrays(options_of(request), arrays);
}

CaseOutcome compare_attention_backward(const CompareRequest& request, const StoredFormat& output,
                                       const StoredFormat& input) {
  if (request.q_descale != 1 || request.k_descale != 1 || request.v_descale != 1)
    refuse(InputProblem::out_of_range, "the attention backward takes no fp8 descales");
  for (const auto& [path, option] : {std::pair{&request.k, "--k"},
                                     {&request.v, "--v"},
                                     {&request.dq, "--dq"},
                                     {&request.dk, "--dk"},
                                     {&request.dv, "--dv"}}) {
    if (path->empty())
      refuse(InputProblem::out_of_range, std::string("the attention backward needs ") + option);
  }
  const DecodedFile q("--q", request.q, input), k("--k", request.k, input), v("--v", request.v, input),
      dout("--dout", request.dout, input), dq("--dq", request.dq, output), dk("--dk", request.dk, output),
      dv("--dv", request.dv, output);
  std::optional<DecodedFile> d_lse;
  if (!request.d_lse.empty()) d_lse.emplace("--d-lse", request.d_lse, input);
  std::optional<DecodedFile> d;
  if (!request.d.empty()) d.emplace("--d", request.d, StoredFormat{&fp32, std::nullopt, "fp32"});
  BackwardArrays arrays{.q = &q,
                        .k = &k,
                        .v = &v,
                        .d_out = &dout,
                        .dq = &dq,
                        .dk = &dk,
                        .dv = &dv,
                        .d_lse = d_lse ? &*d_lse : nullptr,
                        .d = d ? &*d : nullptr,
                        .d_sinks = {},
                        .scores = {}};
  const StoredFormat plain{&fp64, std::nullopt, "fp64"};
  if (!request.sinks.empty()) arrays.scores.sinks = read_values(request.sinks, plain);
  if (!request.alibi_slopes.empty()) arrays.scores.alibi_slopes = read_values(request.alibi_slopes, plain);
  return judge_attention_backward_arrays(options_of(request), arrays);
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
                              {&request.alibi_slopes, "alibi_slopes"},
                              {&request.dout, "dout"},
                              {&request.dq, "dq"},
                              {&request.dk, "dk"},
                              {&request.dv, "dv"},
                              {&request.d_lse, "d_lse"},
                              {&request.d, "d"}}) {
    if (field->empty() && has(name)) *field = request.bundle + ":" + name;
  }
  request.name = kernel_name_of(request);
  return request;
}

}  // namespace

std::string kernel_name_of(const CompareRequest& request) {
  if (!request.name.empty()) return request.name;
  const std::string& named = !request.bundle.empty() ? request.bundle
                             : request.q.empty()     ? request.probabilities
                             : request.dout.empty()  ? request.out
                                                     : request.dq;
  return "compare:" + std::filesystem::path(named).filename().string();
}

CaseOutcome compare_files(const CompareRequest& given) {
  const CompareRequest request = with_bundle(given);
  const bool attention = !request.q.empty();
  if (attention == !request.logits.empty()) {
    refuse(InputProblem::out_of_range, "give either --logits and --probs, or --q --k --v --out");
  }
  const StoredFormat output = stored_format(request.format);
  const StoredFormat input = request.input_format.empty() ? output : stored_format(request.input_format);
  CaseOutcome outcome = !attention              ? compare_rows(request, output, input)
                        : !request.dout.empty() ? compare_attention_backward(request, output, input)
                                                : compare_attention(request, output, input);
  if (attention && !request.dout.empty() && !given.out.empty()) {
    // A forward output (and LSE) given beside the gradients is judged too, never silently
    // ignored, under the default recipes (the named entry is the backward's); a bundle's members
    // are read only as the mode needs them.
    CompareRequest forward_request = request;
    forward_request.tolerance_entry.clear();
    const CaseOutcome forward = compare_attention(forward_request, output, input);
    if (!forward.failures.empty() && outcome.failures.empty()) {
      outcome.worst_array = forward.worst_array;
      outcome.worst_index = forward.worst_index;
    }
    outcome.comparison.merge(forward.comparison);
    for (const std::string& failure : forward.failures) outcome.failures.push_back("forward: " + failure);
  } else if (attention && !request.dout.empty() && !given.lse.empty()) {
    refuse(InputProblem::out_of_range, "--lse is judged with the forward's --out; give both or neither");
  }
  outcome.gate_case.input = "npy";
  return outcome;
}

}  // namespace sharpcheck::gate

namespace sharpcheck::gate {

CaseOutcome compare_operation(const Operation& operation,
                              std::vector<std::pair<std::string, std::string>> pairs,
                              const std::string& bundle) {
  if (!bundle.empty()) {
    if (!bundle.ends_with(".npz")) refuse(InputProblem::out_of_range, "--bundle must be an .npz file");
    std::vector<io::NpzMember> members;
    {
      const io::MappedFile archive(bundle);
      members = io::list_npz_members(archive.bytes(), bundle);
    }
    for (const TensorSpec& tensor : operation.tensors) {
      const bool named =
          std::any_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == tensor.name; });
      const bool held = std::any_of(members.begin(), members.end(), [&](const io::NpzMember& member) {
        return io::npz_member_is(member, std::string(tensor.name));
      });
      if (!named && held) pairs.emplace_back(tensor.name, bundle + ":" + std::string(tensor.name));
    }
  }
  const ParsedCall parsed = parse_op_arguments(operation, pairs);
  std::vector<std::unique_ptr<DecodedFile>> files;
  OpCall call;
  call.options = parsed.options;
  std::string judged_path;
  for (const TensorSpec& tensor : operation.tensors) {
    const auto path = parsed.tensors.find(tensor.name);
    if (path == parsed.tensors.end()) continue;
    files.push_back(std::make_unique<DecodedFile>(std::string(tensor.name), path->second,
                                                  tensor_format(tensor, call.options)));
    call.tensors.emplace(std::string(tensor.name), files.back().get());
    if (judged_path.empty() && tensor.role == TensorRole::judged) judged_path = path->second;
  }
  if (call.options.judge.name.empty())
    call.options.judge.name =
        "compare:" + std::filesystem::path(bundle.empty() ? judged_path : bundle).filename().string();
  return operation.judge(call);
}

}  // namespace sharpcheck::gate
