// The running max of an online softmax as the low-precision attention kernels under test keep it
// (kernels/mx_attention.hpp, kernels/sage_attention.hpp): tiles of key positions, and a max that
// moves only when a tile's max exceeds it by more than a threshold (FlashAttention 4's conditional
// rescaling; a threshold of 0 moves it whenever it grows). Internal to kernels/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace sharpcheck::kernels {

class LazyRunningMax {
 public:
  explicit LazyRunningMax(float threshold) : threshold_(threshold) {}

  // A row starts at the sink's logit, or at -inf without one.
  void start(float value) { max_ = value; }
  [[nodiscard]] float value() const { return max_; }

  // The factor fl(exp(m_old - m_new)) the row's sums are scaled by before a tile whose largest
  // logit is `tile_max` (1 where the max stays; 0 on the first tile, exp(-inf)).
  [[nodiscard]] float rescale_for(float tile_max) {
    const bool first = max_ == -std::numeric_limits<float>::infinity();
    if (!first && tile_max <= max_ + threshold_) return 1.0F;
    const float new_max = std::max(max_, tile_max);
    const float rescale = std::exp(max_ - new_max);
    max_ = new_max;
    return rescale;
  }

 private:
  float max_ = -std::numeric_limits<float>::infinity();
  float threshold_;
};

// Calls tile(start, length) for each run of `visible` (ascending key positions) that lies in one
// tile of positions [t size, (t + 1) size), as FlashAttention-style kernels tile K; a tile with no
// visible key is never called.
template <typename Tile>
void for_each_position_tile(const std::vector<std::size_t>& visible, std::size_t size, Tile&& tile) {
  for (std::size_t start = 0, end = 0; start < visible.size(); start = end) {
    for (end = start; end < visible.size() && visible[end] / size == visible[start] / size;) ++end;
    tile(start, end - start);
  }
}

}  // namespace sharpcheck::kernels
