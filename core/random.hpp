// Deterministic random inputs: the same seed gives the same numbers on every machine and
// compiler. Only integer arithmetic and one correctly rounded conversion are used, so neither
// the libm in use nor -ffp-contract nor -march can change a draw (std::normal_distribution's
// output is implementation-defined, so it is not used anywhere).
#pragma once

#include <cstdint>

namespace sharpcheck {

class DeterministicRandom {
 public:
  explicit DeterministicRandom(std::uint64_t seed) : state_(seed) {}

  // SplitMix64 (Steele, Lea and Flood 2014): passes BigCrush, one 64-bit word of state.
  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // Uniform on [0, 1): a 53-bit integer times 2^-53, exact.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Uniform integer in [0, bound) (bound > 0), by rejection so there is no modulo bias.
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    std::uint64_t draw = next_u64();
    while (draw >= limit) draw = next_u64();
    return draw % bound;
  }

  // Approximately standard normal: the Irwin-Hall sum of 12 uniforms minus 6 (mean 0,
  // variance 1, support [-6, 6]). The sum is formed exactly in integers and converted once.
  double normal() {
    std::uint64_t sum = 0;
    for (int i = 0; i < 12; ++i) sum += next_u64() >> 11;
    return static_cast<double>(sum) * 0x1p-53 - 6.0;
  }
  double normal(double mean, double sigma) { return mean + sigma * normal(); }

 private:
  std::uint64_t state_;
};

}  // namespace sharpcheck
