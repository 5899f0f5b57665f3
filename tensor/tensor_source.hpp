// Where a tensor's elements come from: a span in memory, or a file decoded as it is read. Judges
// read one head at a time through it, so memory stays at a head's worth per thread whatever the
// size of the tensors (a layer's dumps are judged without holding them as doubles).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

namespace sharpcheck::tensor {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  [[nodiscard]] virtual std::size_t size() const = 0;
  // Elements [first, first + out.size()) in storage order. Safe to call from several threads;
  // may throw InputError naming the element (a value outside its format, say).
  virtual void read(std::size_t first, std::span<double> out) const = 0;
};

// Values already in memory.
class SpanSource final : public TensorSource {
 public:
  explicit SpanSource(std::span<const double> values) : values_(values) {}
  [[nodiscard]] std::size_t size() const override { return values_.size(); }
  void read(std::size_t first, std::span<double> out) const override {
    std::copy_n(values_.begin() + static_cast<std::ptrdiff_t>(first), out.size(), out.begin());
  }

 private:
  std::span<const double> values_;
};

}  // namespace sharpcheck::tensor
