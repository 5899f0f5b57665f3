// The floating-point environment sharpcheck's proofs assume, for the length of a call from a
// caller that may have changed it: rounding to nearest, and subnormals kept (no flush-to-zero or
// denormals-are-zero). `torch.set_flush_denormal(True)`, or a library built with -ffast-math,
// sets FTZ/DAZ for its thread; a reference computed under them reads a subnormal input as 0 and
// flushes subnormal intermediates, so its "correctly rounded" results were wrong (q = 1e-310
// against keys of +-1e308 gave 1.0 for 0.8807971). The scope sets the environment and restores the
// caller's on the way out; threads started inside it inherit it (a new thread copies its creator's
// floating-point state).
#pragma once

#include <cfenv>
#include <cstdint>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace sharpcheck {

class ExactArithmetic {
 public:
  ExactArithmetic() : rounding_(std::fegetround()) {
    if (rounding_ != FE_TONEAREST) std::fesetround(FE_TONEAREST);
#if defined(__SSE__) || defined(__x86_64__)
    control_ = _mm_getcsr();
    if ((control_ & cleared_bits) != 0) _mm_setcsr(control_ & ~cleared_bits);
#elif defined(__aarch64__)
    control_ = __builtin_aarch64_get_fpcr();
    if ((control_ & cleared_bits) != 0) __builtin_aarch64_set_fpcr(control_ & ~cleared_bits);
#endif
  }
  ~ExactArithmetic() {
#if defined(__SSE__) || defined(__x86_64__)
    if ((control_ & cleared_bits) != 0) _mm_setcsr(control_);
#elif defined(__aarch64__)
    if ((control_ & cleared_bits) != 0) __builtin_aarch64_set_fpcr(control_);
#endif
    if (rounding_ != FE_TONEAREST) std::fesetround(rounding_);
  }
  ExactArithmetic(const ExactArithmetic&) = delete;
  ExactArithmetic& operator=(const ExactArithmetic&) = delete;

 private:
#if defined(__SSE__) || defined(__x86_64__)
  static constexpr unsigned cleared_bits =
      0x8040U;  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)
#elif defined(__aarch64__)
  static constexpr unsigned cleared_bits = 1U << 24;  // FPCR.FZ
#endif
  int rounding_;
  [[maybe_unused]] unsigned control_ = 0;
};

}  // namespace sharpcheck
