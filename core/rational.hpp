// An exact rational number (GMP's mpq_t), owned: the reference's exact-case tests (grouping
// logits, equal means, closed forms) compare and combine values that no float can hold.
#pragma once

#include <gmp.h>

namespace sharpcheck {

class Rational {
 public:
  Rational() { mpq_init(value_); }
  explicit Rational(double x) : Rational() { mpq_set_d(value_, x); }  // exact
  ~Rational() { mpq_clear(value_); }
  Rational(const Rational& other) : Rational() { mpq_set(value_, other.value_); }
  Rational& operator=(const Rational& other) {
    mpq_set(value_, other.value_);
    return *this;
  }
  Rational(Rational&& other) noexcept : Rational() { mpq_swap(value_, other.value_); }
  Rational& operator=(Rational&& other) noexcept {
    mpq_swap(value_, other.value_);
    return *this;
  }
  [[nodiscard]] mpq_ptr get() { return value_; }
  [[nodiscard]] mpq_srcptr get() const { return value_; }

 private:
  mpq_t value_;
};

}  // namespace sharpcheck
