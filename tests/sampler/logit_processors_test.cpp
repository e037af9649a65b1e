// Each logit processor alone, on hand-sized inputs, with exact expected
// results. The probabilities were computed independently in double
// precision from the definitions (softmax of the surviving logits); the
// comment on each case shows the arithmetic.
#include "sampler/logit_processors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace serval {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
using Dist = std::map<TokenId, double>;

Dist to_dist(const CandidateSet& set) {
  Dist d;
  for (const Candidate& c : set.items) d[c.token] = c.prob;
  return d;
}

void expect_dist(const Dist& got, const Dist& want, double tol = 2e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [tok, p] : want) {
    ASSERT_TRUE(got.count(tok)) << "token " << tok << " missing";
    EXPECT_NEAR(got.at(tok), p, tol) << "token " << tok;
  }
}

struct StageCase {
  const char* name;
  std::vector<float> logits;
  std::function<void(CandidateSet&)> stage;
  Dist expected;  // after the stage and normalize()
};

class ProcessorAlone : public ::testing::TestWithParam<StageCase> {};

TEST_P(ProcessorAlone, GivesTheExactDistribution) {
  const StageCase& c = GetParam();
  CandidateSet set;
  set.reset_dense(c.logits);
  c.stage(set);
  normalize(set);
  expect_dist(to_dist(set), c.expected);
}

const std::vector<float> k1234 = {1, 2, 3, 4};

INSTANTIATE_TEST_SUITE_P(
    Table, ProcessorAlone,
    ::testing::Values(
        // softmax([1,2,3,4])
        StageCase{"none", k1234, [](CandidateSet&) {},
                  {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013}, {3, 0.6439142598879724}}},
        // softmax([0.5, 1, 1.5, 2])
        StageCase{"temperature_2", k1234, [](CandidateSet& s) { apply_temperature(s, 2.0f); },
                  {{0, 0.1015363240915518}, {1, 0.16740509727844333}, {2, 0.27600434470659363}, {3, 0.45505423392341127}}},
        // softmax([2, 4, 6, 8]) = softmax of the gaps 2: e^-6, e^-4, e^-2, 1 over their sum
        StageCase{"temperature_half", k1234, [](CandidateSet& s) { apply_temperature(s, 0.5f); },
                  {{0, 0.002144008783584634}, {1, 0.01584220117850692}, {2, 0.11705891323853293}, {3, 0.8649548767993754}}},
        // softmax([3, 4]) = {1/(1+e), e/(1+e)}
        StageCase{"top_k_2", k1234, [](CandidateSet& s) { apply_top_k(s, 2); },
                  {{2, 0.2689414213699951}, {3, 0.7310585786300049}}},
        StageCase{"top_k_1", k1234, [](CandidateSet& s) { apply_top_k(s, 1); }, {{3, 1.0}}},
        StageCase{"top_k_larger_than_vocab", k1234, [](CandidateSet& s) { apply_top_k(s, 9); },
                  {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013}, {3, 0.6439142598879724}}},
        // Ties at the boundary: [1, 3, 3, 3], k=2 keeps the two lowest ids of the tied ones.
        StageCase{"top_k_tie_lower_id_wins", {1, 3, 3, 3}, [](CandidateSet& s) { apply_top_k(s, 2); },
                  {{1, 0.5}, {2, 0.5}}},
        // cumulative 0.6439, 0.8808, 0.9679 -> 0.9 needs three: softmax([2, 3, 4])
        StageCase{"top_p_0_9", k1234, [](CandidateSet& s) { apply_top_p(s, 0.9f); },
                  {{1, 0.09003057317038046}, {2, 0.24472847105479764}, {3, 0.6652409557748218}}},
        // 0.8808 >= 0.88: two
        StageCase{"top_p_0_88", k1234, [](CandidateSet& s) { apply_top_p(s, 0.88f); },
                  {{2, 0.2689414213699951}, {3, 0.7310585786300049}}},
        StageCase{"top_p_0_5", k1234, [](CandidateSet& s) { apply_top_p(s, 0.5f); }, {{3, 1.0}}},
        // p/p_max = e^-3, e^-2, e^-1, 1 = 0.0498, 0.135, 0.368, 1
        StageCase{"min_p_0_05", k1234, [](CandidateSet& s) { apply_min_p(s, 0.05f); },
                  {{1, 0.09003057317038046}, {2, 0.24472847105479764}, {3, 0.6652409557748218}}},
        StageCase{"min_p_0_2", k1234, [](CandidateSet& s) { apply_min_p(s, 0.2f); },
                  {{2, 0.2689414213699951}, {3, 0.7310585786300049}}},
        StageCase{"min_p_1", {1, 4, 2, 4}, [](CandidateSet& s) { apply_min_p(s, 1.0f); }, {{1, 0.5}, {3, 0.5}}},
        // Typical: H = 0.94754; |-log p - H| = 2.4927, 1.4927, 0.4927, 0.5073, so the
        // ranking is token 2, 3, 1, 0 (the most likely token is not the most typical).
        StageCase{"typical_0_2", k1234, [](CandidateSet& s) { apply_typical(s, 0.2f); }, {{2, 1.0}}},
        StageCase{"typical_0_5", k1234, [](CandidateSet& s) { apply_typical(s, 0.5f); },
                  {{2, 0.2689414213699951}, {3, 0.7310585786300049}}},
        StageCase{"typical_0_9", k1234, [](CandidateSet& s) { apply_typical(s, 0.9f); },
                  {{1, 0.09003057317038046}, {2, 0.24472847105479764}, {3, 0.6652409557748218}}},
        StageCase{"typical_0_97", k1234, [](CandidateSet& s) { apply_typical(s, 0.97f); },
                  {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013}, {3, 0.6439142598879724}}},
        // Four equal logits: p = 0.25 exactly, cumulative 0.5 reaches 0.5 at the second;
        // ties (equal logit, equal typicality key 0) go to the lower token ids.
        StageCase{"top_p_ties_lower_id", {0, 0, 0, 0}, [](CandidateSet& s) { apply_top_p(s, 0.5f); },
                  {{0, 0.5}, {1, 0.5}}},
        StageCase{"typical_ties_lower_id", {0, 0, 0, 0}, [](CandidateSet& s) { apply_typical(s, 0.5f); },
                  {{0, 0.5}, {1, 0.5}}},
        // logits [0,1,2,3,3.5,-1], typical 0.8 keeps tokens 3 and 4: softmax([3, 3.5])
        StageCase{"typical_0_8_six", {0, 1, 2, 3, 3.5f, -1}, [](CandidateSet& s) { apply_typical(s, 0.8f); },
                  {{3, 0.37754066879814546}, {4, 0.6224593312018546}}}),
    [](const ::testing::TestParamInfo<StageCase>& info) { return std::string(info.param.name); });

// ---- penalties and bias on dense logits ------------------------------------

struct PenaltyCase {
  const char* name;
  std::vector<TokenId> window;
  float repetition, frequency, presence;
  std::vector<float> expected;  // from logits {2, -2, 1, 0.5, 3, 0}
};

class Penalties : public ::testing::TestWithParam<PenaltyCase> {};

TEST_P(Penalties, ChangeExactlyTheSeenTokens) {
  const PenaltyCase& c = GetParam();
  std::vector<float> logits = {2, -2, 1, 0.5f, 3, 0};
  std::vector<int32_t> counts(logits.size(), 0);
  apply_penalties(logits, c.window, c.repetition, c.frequency, c.presence, counts);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(logits[i], c.expected[i], 1e-6) << "token " << i;
  EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int32_t x) { return x == 0; }));
}

INSTANTIATE_TEST_SUITE_P(
    Table, Penalties,
    ::testing::Values(
        // Repetition 2: positive 2 -> 1, negative -2 -> -4, zero stays 0.
        PenaltyCase{"repetition", {0, 1, 5}, 2.0f, 0, 0, {1, -4, 1, 0.5f, 3, 0}},
        // Counts: token 0 x3, token 1 x1, token 2 x1; logit -= c * 0.5 + 0.25.
        PenaltyCase{"frequency_presence", {0, 0, 2, 0, 1}, 1.0f, 0.5f, 0.25f, {0.25f, -2.75f, 0.25f, 0.5f, 3, 0}},
        // All three: token 0: 2/1.25 - 3*0.5 - 0.25 = -0.15; token 1: -2*1.25 - 0.75 = -3.25;
        // token 2: 1/1.25 - 0.75 = 0.05.
        PenaltyCase{"all_three", {0, 0, 2, 0, 1}, 1.25f, 0.5f, 0.25f, {-0.15f, -3.25f, 0.05f, 0.5f, 3, 0}},
        // Negative frequency/presence encourage repetition.
        PenaltyCase{"negative", {4, 4}, 1.0f, -0.5f, -1.0f, {2, -2, 1, 0.5f, 5, 0}},
        PenaltyCase{"empty_window", {}, 2.0f, 1.0f, 1.0f, {2, -2, 1, 0.5f, 3, 0}}),
    [](const ::testing::TestParamInfo<PenaltyCase>& info) { return std::string(info.param.name); });

TEST(LogitBias, AddsAndBans) {
  std::vector<float> logits = {1, 2, 3, 4};
  const std::vector<LogitBias> bias = {{0, 2.5f}, {3, -100.0f}, {1, -0.5f}};
  apply_logit_bias(logits, bias);
  EXPECT_EQ(logits, (std::vector<float>{3.5f, 1.5f, 3.0f, -kInf}));
  CandidateSet set;
  set.reset_dense(logits);
  normalize(set);
  // softmax([3.5, 1.5, 3]); the banned token is gone, not merely tiny.
  expect_dist(to_dist(set), {{0, 0.5740969929676946}, {1, 0.07769557914857059}, {2, 0.3482074278837348}});
}

// ---- helpers ----------------------------------------------------------------

TEST(Sanitize, NaNAndInfinities) {
  EXPECT_EQ(sanitize_logit(std::numeric_limits<float>::quiet_NaN()), -kInf);
  EXPECT_EQ(sanitize_logit(kInf), std::numeric_limits<float>::max());
  EXPECT_EQ(sanitize_logit(-kInf), -kInf);
  EXPECT_EQ(sanitize_logit(1.5f), 1.5f);
}

TEST(BestCandidate, LowestIdWinsTies) {
  CandidateSet set;
  const std::vector<float> logits = {1, 5, 2, 5, 5};
  set.reset_dense(logits);
  EXPECT_EQ(best_candidate(set.items).token, 1);
}

TEST(Softmax, AllMinusInfinityGivesUniformNotNaN) {
  CandidateSet set;
  const std::vector<float> logits = {-kInf, -kInf};
  set.reset_dense(logits);
  softmax(set);
  EXPECT_EQ(set.items[0].prob, 0.5f);
  EXPECT_EQ(set.items[1].prob, 0.5f);
}

TEST(Softmax, PlusInfinityLogitTakesAllMass) {
  CandidateSet set;
  const std::vector<float> logits = {0, kInf, 3};
  set.reset_dense(logits);
  normalize(set);
  ASSERT_EQ(set.items.size(), 1u);
  EXPECT_EQ(set.items[0].token, 1);
  EXPECT_EQ(set.items[0].prob, 1.0f);
}

TEST(Argmax, LowestIndexWinsTies) {
  EXPECT_EQ(argmax(std::vector<float>{1, 5, 2, 5, 5}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -3}), 1);
}

TEST(SelectTopK, MatchesTheTotalOrderIncludingTies) {
  // Many ties, ascending runs (every element displaces the heap front) and
  // descending runs; compare with a full sort under the same total order.
  std::vector<float> logits;
  for (int i = 0; i < 3000; ++i) logits.push_back(float((i * 37) % 11));      // heavy ties
  for (int i = 0; i < 3000; ++i) logits.push_back(float(i) * 0.01f);          // ascending
  for (int i = 0; i < 3000; ++i) logits.push_back(30.0f - float(i) * 0.01f);  // descending
  std::vector<Candidate> all;
  for (size_t i = 0; i < logits.size(); ++i) all.push_back({TokenId(i), logits[i], 0});
  std::sort(all.begin(), all.end(), candidate_better);
  for (int k : {1, 2, 7, 40, 500, 9000, 20000}) {
    CandidateSet set;
    select_top_k(logits, k, set);
    ASSERT_TRUE(set.sorted);
    ASSERT_EQ(set.items.size(), std::min<size_t>(k, logits.size())) << k;
    for (size_t i = 0; i < set.items.size(); ++i) {
      ASSERT_EQ(set.items[i].token, all[i].token) << "k " << k << " rank " << i;
    }
    CandidateSet other;  // the nth_element route agrees
    other.reset_dense(logits);
    apply_top_k(other, k);
    if (size_t(k) < logits.size()) {
      for (size_t i = 0; i < set.items.size(); ++i) ASSERT_EQ(other.items[i].token, set.items[i].token);
    }
  }
}

TEST(TopK, LeavesTheSetSortedBetterFirst) {
  CandidateSet set;
  const std::vector<float> logits = {0.5f, 3, 1, 3, 2, -1};
  set.reset_dense(logits);
  apply_top_k(set, 4);
  ASSERT_TRUE(set.sorted);
  std::vector<TokenId> order;
  for (const Candidate& c : set.items) order.push_back(c.token);
  EXPECT_EQ(order, (std::vector<TokenId>{1, 3, 4, 2}));
}

TEST(Typical, KeepsThePreviousOrder) {
  CandidateSet set;
  set.reset_dense(k1234);
  apply_typical(set, 0.9f);
  std::vector<TokenId> order;
  for (const Candidate& c : set.items) order.push_back(c.token);
  EXPECT_EQ(order, (std::vector<TokenId>{1, 2, 3}));  // token order, as before the stage
}

}  // namespace
}  // namespace serval
