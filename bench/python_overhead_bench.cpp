// What the Python front end costs over the C++ call it wraps: a 1M-element bf16 softmax check
// (64 rows of 16,384) through sharpcheck.assert_softmax_close on torch tensors (DLPack, options,
// the JSON record, the Report), against gate::judge_softmax_arrays on the same bf16 bits held in
// C++, in the same process (Python embedded), medians of repetitions.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gate/judge_arrays.hpp"
#include "reference/softmax.hpp"

namespace {
namespace py = pybind11;
using namespace sharpcheck;

constexpr std::size_t rows = 64, columns = 16384;

// bf16 bit patterns in C++ memory, decoded as read (what the Python path's HostArray does too).
class Bf16Bits final : public gate::Array {
 public:
  Bf16Bits(std::vector<std::uint16_t> bits, std::string name)
      : bits_(std::move(bits)), shape_{rows, columns}, name_(std::move(name)) {}
  [[nodiscard]] std::size_t size() const override { return bits_.size(); }
  [[nodiscard]] const std::vector<std::size_t>& shape() const override { return shape_; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  void read(std::size_t first, std::span<double> out) const override {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = decode(bits_[first + i], bf16);
  }

 private:
  std::vector<std::uint16_t> bits_;
  std::vector<std::size_t> shape_;
  std::string name_;
};

struct Data {
  std::vector<std::uint16_t> logits, probabilities;
};

// Random bf16 logits (spread 3) and their correctly rounded bf16 softmax.
const Data& data() {
  static const Data made = [] {
    Data d;
    std::mt19937_64 random(20241008);
    std::normal_distribution<double> normal(0, 3);
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<double> row(columns);
      for (double& x : row) x = round_to_format(normal(random), bf16);
      for (const double x : row) d.logits.push_back(static_cast<std::uint16_t>(encode(x, bf16)));
      for (const double p : reference::softmax(row, bf16))
        d.probabilities.push_back(static_cast<std::uint16_t>(encode(p, bf16)));
    }
    return d;
  }();
  return made;
}

void cpp_call(benchmark::State& state) {
  const Bf16Bits logits(data().logits, "logits"), outputs(data().probabilities, "actual");
  gate::JudgeOptions options;
  options.format = "bf16";
  options.threads = static_cast<unsigned>(state.range(0));
  for (auto _ : state) {
    const auto outcome = gate::judge_softmax_arrays(options, logits, outputs);
    if (!outcome.passed()) state.SkipWithError("the exact output failed");
  }
}

void python_call(benchmark::State& state) {
  py::module_ torch = py::module_::import("torch");
  py::module_ sharpcheck = py::module_::import("sharpcheck");
  const auto tensor = [&](const std::vector<std::uint16_t>& bits) {
    std::vector<std::int16_t> as_signed(bits.begin(), bits.end());
    py::object t = torch.attr("tensor")(as_signed, py::arg("dtype") = torch.attr("int16"));
    return t.attr("view")(torch.attr("bfloat16")).attr("reshape")(rows, columns);
  };
  const py::object logits = tensor(data().logits), outputs = tensor(data().probabilities);
  const py::object check = sharpcheck.attr("assert_softmax_close");
  for (auto _ : state) benchmark::DoNotOptimize(check(outputs, logits, py::arg("threads") = state.range(0)));
}

}  // namespace

// Threads: 1, and every core (0), for both.
BENCHMARK(cpp_call)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(python_call)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  // One allocator regime for both calls: glibc serves the judge's large blocks by mmap (page
  // faults and zeroing on every call) until a large free raises its threshold, which importing
  // torch does; measured, that alone made the C++ call 30% slower than the Python one. With the
  // thresholds fixed both calls reuse the heap.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const py::scoped_interpreter interpreter;
  py::module_::import("sys").attr("path").attr("insert")(0, SHARPCHECK_PYTHON_PACKAGE_DIRECTORY);
  data();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
