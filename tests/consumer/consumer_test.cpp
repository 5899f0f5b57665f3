// A user's own test of their softmax against sharpcheck's reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing/softmax_matchers.hpp"

std::vector<float> my_softmax(const std::vector<float>& logits) {
  float largest = logits[0];
  for (const float e : logits) largest = std::fmax(largest, e);
  std::vector<float> out;
  float sum = 0;
  for (const float e : logits) sum += out.emplace_back(std::exp(e - largest));
  for (float& p : out) p /= sum;
  return out;
}

TEST(MyKernel, MatchesTheCorrectlyRoundedReference) {
  const std::vector<float> logits{1.0F, 2.0F, 3.0F, -1.5F};
  EXPECT_THAT(my_softmax(logits), sharpcheck::IsSoftmaxOf(logits).WithinUlps(4));
}

TEST(MyKernel, TheMatcherRejectsAWrongAnswer) {
  const std::vector<float> logits{1.0F, 2.0F};
  const std::vector<float> wrong{0.5F, 0.5F};
  EXPECT_THAT(wrong, ::testing::Not(sharpcheck::IsSoftmaxOf(logits).WithinUlps(4)));
}
