// compute_logprobs: log_softmax of the raw logits, top-n order and ties,
// the chosen token, and a 128k vocabulary against a naive double reference.
#include "sampler/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sampler/rng.h"

namespace serval {
namespace {

// log-sum-exp of [1, 2, 3, 4] = 4 + log(1 + e^-1 + e^-2 + e^-3) = 4.4401896985611957
TEST(Logprobs, LogSoftmaxOfRawLogits) {
  const std::vector<float> logits = {1, 2, 3, 4};
  const TokenLogprobs lp = compute_logprobs(logits, /*chosen=*/1, /*top_n=*/2);
  EXPECT_EQ(lp.chosen.token, 1);
  EXPECT_NEAR(lp.chosen.logprob, -2.4401896985611957, 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].token, 3);
  EXPECT_NEAR(lp.top[0].logprob, -0.4401896985611957, 1e-6);
  EXPECT_EQ(lp.top[1].token, 2);
  EXPECT_NEAR(lp.top[1].logprob, -1.4401896985611957, 1e-6);
  EXPECT_EQ(lp.rank, 3);  // logits 4 and 3 are above it
}

TEST(Logprobs, ZeroTopNStillGivesTheChosenToken) {
  const std::vector<float> logits = {1, 2, 3, 4};
  const TokenLogprobs lp = compute_logprobs(logits, 0, 0);
  EXPECT_TRUE(lp.top.empty());
  EXPECT_NEAR(lp.chosen.logprob, -3.4401896985611957, 1e-6);
}

TEST(Logprobs, TiesOrderedByLowerTokenId) {
  const std::vector<float> logits = {0, 5, 5, 1};
  const TokenLogprobs lp = compute_logprobs(logits, 2, 3);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 2);
  EXPECT_EQ(lp.top[2].token, 3);
  EXPECT_NEAR(lp.top[0].logprob, -0.7055961623752101, 1e-6);
  EXPECT_EQ(lp.top[0].logprob, lp.top[1].logprob);
  EXPECT_NEAR(lp.top[2].logprob, -4.70559616237521, 1e-6);
  EXPECT_NEAR(lp.chosen.logprob, -0.7055961623752101, 1e-6);
  EXPECT_EQ(lp.rank, 2);  // tied with token 1, which comes first
  EXPECT_EQ(compute_logprobs(logits, 1, 0).rank, 1);
  EXPECT_EQ(compute_logprobs(logits, 0, 0).rank, 4);
}

TEST(Logprobs, TopNLargerThanVocabularyReturnsAll) {
  const std::vector<float> logits = {4, 3, 2, 1};
  const TokenLogprobs lp = compute_logprobs(logits, 3, 20);
  ASSERT_EQ(lp.top.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lp.top[i].token, i);
  double mass = 0;
  for (const TokenLogprob& t : lp.top) mass += std::exp(t.logprob);
  EXPECT_NEAR(mass, 1.0, 1e-6);
}

TEST(Logprobs, NaNAndInfiniteLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {std::numeric_limits<float>::quiet_NaN(), -inf, 0.0f, 0.0f};
  const TokenLogprobs lp = compute_logprobs(logits, 0, 4);
  EXPECT_EQ(lp.chosen.logprob, -inf);
  EXPECT_EQ(lp.rank, 3);  // NaN counts as -inf: below tokens 2 and 3, tied with token 1 but a lower id
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.5), 1e-6);  // tokens 2 and 3 share the mass
  EXPECT_EQ(lp.top[0].token, 2);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].logprob, -inf);
  EXPECT_EQ(lp.top[3].logprob, -inf);
}

TEST(Logprobs, LargeVocabularyMatchesNaiveReference) {
  const size_t n = 131072;
  Rng rng(5);
  std::vector<float> logits(n);
  for (float& l : logits) l = static_cast<float>(rng.uniform() * 30.0 - 15.0);
  TokenLogprobs out;
  compute_logprobs(logits, 777, 20, out);

  double m = -1e300;
  for (float l : logits) m = std::max(m, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - m);
  const double lse = m + std::log(sum);
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = int(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ASSERT_EQ(out.top.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(out.top[i].token, order[i]);
    EXPECT_NEAR(out.top[i].logprob, logits[order[i]] - lse, 1e-5);
  }
  EXPECT_NEAR(out.chosen.logprob, logits[777] - lse, 1e-5);

  // Reuse: a second call with the same buffer gives the same answer.
  const auto first = out.top;
  compute_logprobs(logits, 777, 20, out);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(out.top[i].token, first[i].token);
}

}  // namespace
}  // namespace serval
