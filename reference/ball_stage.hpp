// The reference's fast first stage: Arb ball arithmetic (midpoint-radius intervals with rigorous
// error propagation) at the Ziv loop's starting precision. A ball is a proven enclosure of the
// exact result, so a result is decided when both ends of its ball round to the same format
// value. Whatever a ball cannot decide goes on to the MPFR Ziv loop, so this stage changes cost,
// never results.
#pragma once

#include <arb.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/matrix.hpp"
#include "formats/float_format.hpp"
#include "reference/attention_row.hpp"
#include "reference/input_checks.hpp"

namespace sharpcheck::reference {

// A vector of Arb balls, owned.
class BallVector {
 public:
  explicit BallVector(std::size_t count) : count_(count), balls_(_arb_vec_init(static_cast<slong>(count))) {}
  ~BallVector() { _arb_vec_clear(balls_, static_cast<slong>(count_)); }
  BallVector(const BallVector&) = delete;
  BallVector& operator=(const BallVector&) = delete;
  BallVector(BallVector&&) = delete;
  BallVector& operator=(BallVector&&) = delete;
  [[nodiscard]] arb_ptr data() { return balls_; }
  [[nodiscard]] arb_ptr operator[](std::size_t index) { return balls_ + index; }
  [[nodiscard]] arb_srcptr operator[](std::size_t index) const { return balls_ + index; }
  [[nodiscard]] std::size_t size() const { return count_; }
  [[nodiscard]] bool empty() const { return count_ == 0; }

 private:
  std::size_t count_;
  arb_ptr balls_;
};

// One ball, owned.
class Ball {
 public:
  Ball() { arb_init(ball_); }
  ~Ball() { arb_clear(ball_); }
  Ball(const Ball&) = delete;
  Ball& operator=(const Ball&) = delete;
  Ball(Ball&&) = delete;
  Ball& operator=(Ball&&) = delete;
  [[nodiscard]] arb_ptr get() { return ball_; }
  [[nodiscard]] arb_srcptr get() const { return ball_; }

 private:
  arb_t ball_;
};

// The distinct unmasked logits of a row, how often each occurs, and which one each unmasked entry
// is. Equal logits get equal weights under softmax and every escape but stick-breaking, so the
// ball stages enclose and round once per distinct value: rows of masked, padded, quantized or
// bf16 logits (at most 65,536 values) cost little more than their distinct values.
struct DistinctLogits {
  std::vector<double> values;
  std::vector<std::uint64_t> counts;
  std::vector<std::size_t> of_active;  // per entry of row.active: its index into values
};
[[nodiscard]] DistinctLogits distinct_logits(std::span<const double> logits, const PreparedRow& row);

// A ball around 1 / theta.
void enclose_inverse_temperature(arb_ptr multiplier, double theta, slong precision);

// w_v = exp(multiplier (v - shift)) for each distinct value and S = sum_v count_v w_v; the caller's
// shift and multiplier keep every argument <= 0. `arguments`, if given, receives each
// multiplier (v - shift).
void enclose_exponentials(const DistinctLogits& distinct, double shift, arb_srcptr multiplier,
                          slong precision, BallVector& exponentials, arb_ptr sum,
                          BallVector* arguments = nullptr);

// The format value every point of the ball rounds to, if there is one.
[[nodiscard]] std::optional<double> round_ball_if_decided(arb_srcptr ball, const FloatFormat& format);

// Softmax coefficients of the unmasked entries by balls. Writes result[row.active[a]] and sets
// decided[a] for each coefficient it decides; returns how many it decided.
std::size_t decide_softmax_by_balls(std::span<const double> logits, const PreparedRow& row, double theta,
                                    const FloatFormat& target, std::span<double> result,
                                    std::vector<bool>& decided);

// The entropy of the row by balls: the correctly rounded value if the ball decides it.
[[nodiscard]] std::optional<double> decide_entropy_by_balls(std::span<const double> logits,
                                                            const PreparedRow& row, double theta,
                                                            const FloatFormat& target);

// One attention query row by balls (reference/attention_row.hpp: masks, bias, soft-cap, sink):
// weights, outputs and the log-sum-exp where the balls decide them, with their done flags set.
void decide_attention_row_by_balls(const AttentionRow& row, const FloatFormat& target,
                                   AttentionRowResults& results);

}  // namespace sharpcheck::reference
