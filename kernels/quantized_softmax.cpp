// The TFLite-style quantized softmax, vectorised with Highway (one compilation per SIMD target,
// chosen at run time): the exp table is indexed by a gather, the sum is kept per lane, and the
// outputs are rounded half away from zero (TFLite's lround) and saturated by the narrowing.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantized_softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
//
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/quantized_softmax.hpp"

#ifndef SHARPCHECK_KERNELS_QUANTIZED_TABLE_ONCE
#define SHARPCHECK_KERNELS_QUANTIZED_TABLE_ONCE
namespace sharpcheck::kernels {
// table[d] = exp(-d * input_scale * beta) for the difference d = max code - code, as TFLite
// computes it; kept per thread and rebuilt only when beta changes (256 expf per row otherwise).
inline const float* quantized_exp_table(float beta) {
  thread_local std::array<float, 256> table{};
  thread_local float table_beta = std::nanf("");
  if (!(table_beta == beta)) {  // also rebuilt after a NaN beta
    for (std::size_t d = 0; d < table.size(); ++d) {
      table[d] = std::exp(-static_cast<float>(d) * quantized_input_scale * beta);
    }
    table_beta = beta;
  }
  return table.data();
}
}  // namespace sharpcheck::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace sharpcheck::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Writes round_half_away(table[max - code_i] * 256 / sum) + zero_point, saturated to Code's range.
template <class Code>
void QuantizedRow(const std::int8_t* codes, Code* out, std::size_t n, float beta, int zero_point) {
  if (n == 0) return;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::int8_t, decltype(df)> d8;
  const hn::Rebind<Code, decltype(df)> d_out;
  const std::size_t lanes = hn::Lanes(df);
  const float* table = quantized_exp_table(beta);
  // The largest code, vectorised too (a scalar max_element was a third of the time).
  auto best = hn::Set(di, std::numeric_limits<std::int8_t>::min());
  std::size_t k = 0;
  for (; k + lanes <= n; k += lanes) best = hn::Max(best, hn::PromoteTo(di, hn::LoadU(d8, codes + k)));
  int largest = hn::GetLane(hn::MaxOfLanes(di, best));
  for (; k < n; ++k) largest = std::max(largest, static_cast<int>(codes[k]));
  const auto largest_code = hn::Set(di, largest);
  const auto indices = [&](std::size_t i) {
    return hn::Sub(largest_code, hn::PromoteTo(di, hn::LoadU(d8, codes + i)));
  };
  // The gathered table entries are kept for the second pass: a gather costs more than a load.
  thread_local std::vector<float> entries;
  entries.resize(n);
  auto sum = hn::Zero(df);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto entry = hn::GatherIndex(df, table, indices(i));
    hn::StoreU(entry, df, entries.data() + i);
    sum = hn::Add(sum, entry);
  }
  float total = hn::GetLane(hn::SumOfLanes(df, sum));
  for (std::size_t j = i; j < n; ++j) total += table[largest - codes[j]];
  const float inverse = 256.0F / total;
  const auto inverses = hn::Set(df, inverse);
  const auto half = hn::Set(df, 0.5F);
  const auto one = hn::Set(df, 1.0F);
  const auto zero_points = hn::Set(di, zero_point);
  for (i = 0; i + lanes <= n; i += lanes) {
    const auto scaled = hn::Mul(hn::LoadU(df, entries.data() + i), inverses);
    // Half away from zero for scaled >= 0: x - floor(x) is exact, so the comparison is too (adding
    // 0.5 and truncating would round 0.49999997 up).
    const auto floor = hn::Floor(scaled);
    const auto rounded = hn::IfThenElse(hn::Ge(hn::Sub(scaled, floor), half), hn::Add(floor, one), floor);
    hn::StoreU(hn::DemoteTo(d_out, hn::Add(hn::ConvertTo(di, rounded), zero_points)), d_out, out + i);
  }
  for (; i < n; ++i) {
    const long scaled = std::lround(table[largest - codes[i]] * inverse) + zero_point;
    out[i] = static_cast<Code>(std::clamp(scaled, static_cast<long>(std::numeric_limits<Code>::min()),
                                          static_cast<long>(std::numeric_limits<Code>::max())));
  }
}

void QuantizedInt8(const std::int8_t* codes, std::int8_t* out, std::size_t n, float beta) {
  QuantizedRow(codes, out, n, beta, -128);
}
void QuantizedUint8(const std::int8_t* codes, std::uint8_t* out, std::size_t n, float beta) {
  QuantizedRow(codes, out, n, beta, 0);
}

}  // namespace sharpcheck::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sharpcheck::kernels {
HWY_EXPORT(QuantizedInt8);
HWY_EXPORT(QuantizedUint8);

void softmax_int8(const std::int8_t* codes, std::int8_t* out, std::size_t n, float beta) {
  HWY_DYNAMIC_DISPATCH(QuantizedInt8)(codes, out, n, beta);
}
void softmax_uint8(const std::int8_t* codes, std::uint8_t* out, std::size_t n, float beta) {
  HWY_DYNAMIC_DISPATCH(QuantizedUint8)(codes, out, n, beta);
}
}  // namespace sharpcheck::kernels
#endif
