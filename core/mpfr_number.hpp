// Owning wrappers for MPFR numbers and arrays of them.
//
// The reference calls MPFR directly rather than through Boost.Multiprecision's mpfr_float
// because every step needs a chosen rounding direction (down for lower bounds, up for upper
// bounds) and the ternary value that says whether a result is exact; mpfr_float rounds to
// nearest and discards the ternary value.
#pragma once

#include <mpfr.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace sharpcheck {

class MpfrNumber {
 public:
  explicit MpfrNumber(mpfr_prec_t precision) { mpfr_init2(value_, precision); }
  ~MpfrNumber() { mpfr_clear(value_); }
  MpfrNumber(const MpfrNumber&) = delete;
  MpfrNumber& operator=(const MpfrNumber&) = delete;
  MpfrNumber(MpfrNumber&& other) noexcept {
    mpfr_init2(value_, MPFR_PREC_MIN);
    mpfr_swap(value_, other.value_);
  }
  MpfrNumber& operator=(MpfrNumber&& other) noexcept {
    mpfr_swap(value_, other.value_);
    return *this;
  }
  [[nodiscard]] mpfr_ptr get() { return value_; }
  [[nodiscard]] mpfr_srcptr get() const { return value_; }

 private:
  mpfr_t value_;
};

// n MPFR numbers of one precision, with the pointer array that mpfr_sum and mpfr_dot take.
class MpfrArray {
 public:
  MpfrArray(std::size_t count, mpfr_prec_t precision) : items_(count), pointers_(count) {
    for (std::size_t i = 0; i < count; ++i) {
      mpfr_init2(&items_[i], precision);
      pointers_[i] = &items_[i];
    }
  }
  ~MpfrArray() {
    for (auto& item : items_) mpfr_clear(&item);
  }
  MpfrArray(const MpfrArray&) = delete;
  MpfrArray& operator=(const MpfrArray&) = delete;
  MpfrArray(MpfrArray&&) = delete;
  MpfrArray& operator=(MpfrArray&&) = delete;

  [[nodiscard]] mpfr_ptr operator[](std::size_t index) { return &items_[index]; }
  [[nodiscard]] mpfr_srcptr operator[](std::size_t index) const { return &items_[index]; }
  [[nodiscard]] std::size_t size() const { return items_.size(); }
  // Pointers to the first `count` numbers, in the form mpfr_sum and mpfr_dot take.
  [[nodiscard]] const mpfr_ptr* pointers() const { return pointers_.data(); }
  void set_precision(mpfr_prec_t precision) {
    for (auto& item : items_) mpfr_set_prec(&item, precision);
  }

 private:
  std::vector<__mpfr_struct> items_;
  std::vector<mpfr_ptr> pointers_;
};

}  // namespace sharpcheck
