// Sampler: the whole chain on hand-sized inputs (exact distributions
// computed independently in double precision from the definitions), greedy
// and its tie-break, seeded reproducibility against the PRNG's reference
// stream, empirical frequencies, and a 128k vocabulary against a naive
// reference implementation of the chain written here.
#include "sampler/sampler.h"

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

using Dist = std::map<TokenId, double>;

Dist to_dist(std::span<const Candidate> items) {
  Dist d;
  for (const Candidate& c : items) d[c.token] = c.prob;
  return d;
}

void expect_dist(const Dist& got, const Dist& want, double tol = 2e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [tok, p] : want) {
    ASSERT_TRUE(got.count(tok)) << "token " << tok << " missing";
    EXPECT_NEAR(got.at(tok), p, tol) << "token " << tok;
  }
}

SamplingParams seeded(uint64_t seed = 1) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// ---- the chain, table-driven -----------------------------------------------

struct ChainCase {
  const char* name;
  std::function<void(SamplingParams&)> set;
  std::vector<float> logits;
  std::vector<TokenId> history;
  Dist expected;
};

class Chain : public ::testing::TestWithParam<ChainCase> {};

TEST_P(Chain, FinalDistributionIsExact) {
  const ChainCase& c = GetParam();
  SamplingParams p = seeded();
  c.set(p);
  Sampler s(p, static_cast<int32_t>(c.logits.size()));
  expect_dist(to_dist(s.distribution(c.logits, c.history)), c.expected);
}

const std::vector<float> k1234 = {1, 2, 3, 4};
// Combination input: logits, history; window = last 4 = [0, 3, 1, 3].
//   penalised (rep 1.5, freq 0.2, pres 0.1): t0 1/1.5-0.3 = 0.3667, t1 2.5/1.5-0.3 = 1.3667,
//   t3 3/1.5-0.4-0.1 = 1.5; bias: t4 0.5+2 = 2.5, t2 banned; t5 2.0 untouched.
const std::vector<float> kCombo = {1.0f, 2.5f, -1.0f, 3.0f, 0.5f, 2.0f};
const std::vector<TokenId> kComboHistory = {3, 0, 3, 1, 3};
void combo(SamplingParams& p) {
  p.penalty_last_n = 4;
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.2f;
  p.presence_penalty = 0.1f;
  p.logit_bias = {{4, 2.0f}, {2, -100.0f}};
  p.temperature = 0.8f;
}
const std::vector<float> kL6 = {0.5f, 1.5f, 2.0f, 3.0f, -0.5f, 2.5f, 1.0f, 0.0f};
// Penalty-window input: logits {2,-2,1,0.5,3,0}, history [0,4,1,2], repetition 2.
const std::vector<float> kPen = {2, -2, 1, 0.5f, 3, 0};
const std::vector<TokenId> kPenHistory = {0, 4, 1, 2};

INSTANTIATE_TEST_SUITE_P(
    Table, Chain,
    ::testing::Values(
        ChainCase{"defaults_are_plain_softmax", [](SamplingParams&) {}, k1234, {3, 3, 2},
                  {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013}, {3, 0.6439142598879724}}},
        ChainCase{"top_k_minus_one_is_off", [](SamplingParams& p) { p.top_k = -1; }, k1234, {},
                  {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013}, {3, 0.6439142598879724}}},
        ChainCase{"top_k_2", [](SamplingParams& p) { p.top_k = 2; }, k1234, {},
                  {{2, 0.2689414213699951}, {3, 0.7310585786300049}}},
        // T=2 then top_k 3 -> [1, 1.5, 2]; min_p 0.6: e^-1 = 0.37 < 0.6 drops token 1 -> softmax([1.5, 2])
        ChainCase{"temperature_top_k_min_p", [](SamplingParams& p) { p.temperature = 2; p.top_k = 3; p.min_p = 0.6f; },
                  k1234, {}, {{2, 0.37754066879814546}, {3, 0.6224593312018546}}},
        // Penalties + bias + temperature only: softmax([0.3667, 1.3667, 1.5, 2.5, 2.0] / 0.8)
        ChainCase{"penalties_bias_temperature", combo, kCombo, kComboHistory,
                  {{0, 0.03256369091314036}, {1, 0.11365844924764365}, {3, 0.1342715925288654},
                   {4, 0.46865390737031126}, {5, 0.25085235994003935}}},
        // + top_k 4 (drops t0) + top_p 0.85 (cum .484 .743 .882: drops t1) + min_p 0.3 (t3 at .287 of max: dropped)
        ChainCase{"full_chain_each_stage_bites",
                  [](SamplingParams& p) { combo(p); p.top_k = 4; p.top_p = 0.85f; p.min_p = 0.3f; }, kCombo,
                  kComboHistory, {{4, 0.6513548646660542}, {5, 0.34864513533394575}}},
        ChainCase{"full_chain_min_p_keeps",
                  [](SamplingParams& p) { combo(p); p.top_k = 4; p.top_p = 0.85f; p.min_p = 0.25f; }, kCombo,
                  kComboHistory, {{3, 0.15726759716415167}, {4, 0.5489178501988426}, {5, 0.2938145526370056}}},
        // Window = whole history [3,0,3,1,3]: t3 seen 3 times -> 3/1.5 - 0.6 - 0.1 = 1.3
        ChainCase{"whole_history_window", [](SamplingParams& p) { combo(p); p.penalty_last_n = -1; p.top_k = 4; },
                  kCombo, kComboHistory,
                  {{1, 0.12120522753616815}, {3, 0.11151419261852775}, {4, 0.4997719382460296}, {5, 0.2675086415992744}}},
        ChainCase{"penalties_off_window_zero", [](SamplingParams& p) { combo(p); p.penalty_last_n = 0; p.top_k = 4; },
                  kCombo, kComboHistory,
                  {{1, 0.2270917049419204}, {3, 0.4242631597241338}, {4, 0.2270917049419204}, {5, 0.12155343039202535}}},
        // logits / 1.5; top_k 6 drops t4, t7; typical 0.9 drops t0; top_p 0.8 over {3,5,2,1,6}
        // (p .349 .250 .179 .129 .092, cum .349 .600 .779 .908) drops t6; min_p 0.4 drops t1 (.368 of max).
        ChainCase{"typical_in_full_chain",
                  [](SamplingParams& p) { p.temperature = 1.5f; p.top_k = 6; p.typical_p = 0.9f; p.top_p = 0.8f; p.min_p = 0.4f; },
                  kL6, {}, {{2, 0.23023721634819053}, {3, 0.4484408637990408}, {5, 0.3213219198527688}}},
        ChainCase{"typical_top_p",
                  [](SamplingParams& p) { p.temperature = 1.5f; p.top_k = 6; p.typical_p = 0.9f; p.top_p = 0.8f; },
                  kL6, {},
                  {{1, 0.1416103989450596}, {2, 0.19763323228912325}, {3, 0.3849369741731915}, {5, 0.2758193945926258}}},
        // Window last 2 = [1, 2]: t1 -2 -> -4, t2 1 -> 0.5; t0 (outside the window) keeps 2.
        ChainCase{"penalty_window_last_2", [](SamplingParams& p) { p.repetition_penalty = 2; p.penalty_last_n = 2; },
                  kPen, kPenHistory,
                  {{0, 0.23243077913436572}, {1, 0.0005761382997035667}, {2, 0.05186231697167534},
                   {3, 0.05186231697167534}, {4, 0.6318123632955241}, {5, 0.03145608532705595}}},
        // Window larger than the history = whole history [0,4,1,2].
        ChainCase{"penalty_window_longer_than_history", [](SamplingParams& p) { p.repetition_penalty = 2; p.penalty_last_n = 10; },
                  kPen, kPenHistory,
                  {{0, 0.23604947717950053}, {1, 0.0015904888663973089}, {2, 0.14317124511850468},
                   {3, 0.14317124511850468}, {4, 0.389179793963487}, {5, 0.08683774975360578}}},
        ChainCase{"penalty_window_all", [](SamplingParams& p) { p.repetition_penalty = 2; p.penalty_last_n = -1; },
                  kPen, kPenHistory,
                  {{0, 0.23604947717950053}, {1, 0.0015904888663973089}, {2, 0.14317124511850468},
                   {3, 0.14317124511850468}, {4, 0.389179793963487}, {5, 0.08683774975360578}}},
        ChainCase{"penalty_window_off", [](SamplingParams& p) { p.repetition_penalty = 2; p.penalty_last_n = 0; },
                  kPen, kPenHistory,
                  {{0, 0.22406742483987416}, {1, 0.004103938040095722}, {2, 0.08242979903481706},
                   {3, 0.04999620038856739}, {4, 0.6090784092918429}, {5, 0.030324228404802797}}},
        // Every token banned: the greedy tie-break (token 0) with probability 1.
        ChainCase{"all_banned", [](SamplingParams& p) { p.logit_bias = {{0, -100}, {1, -100}, {2, -100}}; },
                  {1, 2, 3}, {}, {{0, 1.0}}},
        ChainCase{"greedy", [](SamplingParams& p) { p.temperature = 0; p.top_k = 1000; }, {1, 5, 2, 5}, {}, {{1, 1.0}}}),
    [](const ::testing::TestParamInfo<ChainCase>& info) { return std::string(info.param.name); });

// ---- greedy -----------------------------------------------------------------

TEST(Greedy, LowestIdWinsTiesAndIgnoresTheSeed) {
  const std::vector<float> logits = {1, 5, 5, 2};
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    SamplingParams p = seeded(seed);
    p.temperature = 0;
    Sampler s(p, 4);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(logits, {}), 1);
    // Greedy draws nothing: the Rng is where a fresh one starts.
    EXPECT_EQ(s.rng().state(), Rng(seed).state());
  }
}

TEST(Greedy, TinyTemperatureIsGreedy) {
  SamplingParams p = seeded();
  p.temperature = 1e-6f;
  Sampler s(p, 4);
  EXPECT_TRUE(s.is_greedy());
  EXPECT_EQ(s.sample(std::vector<float>{3, 1, 3.5f, 3.4999f}, {}), 2);
}

TEST(Greedy, SeesPenaltiesAndBias) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f};
  SamplingParams p = seeded();
  p.temperature = 0;
  p.repetition_penalty = 1.1f;  // t0: 3 / 1.1 = 2.727 < 2.9
  Sampler s(p, 3);
  EXPECT_EQ(s.sample(logits, std::vector<TokenId>{0}), 1);
  EXPECT_EQ(s.sample(logits, {}), 0);

  SamplingParams q = seeded();
  q.temperature = 0;
  q.logit_bias = {{0, -100}, {1, -100}};
  Sampler b(q, 3);
  EXPECT_EQ(b.sample(logits, {}), 2);
}

// ---- seeded sampling --------------------------------------------------------

// With four equal logits every probability is exactly 1/4, so the token is
// floor(4u) with u = (x >> 11) * 2^-53, i.e. x >> 62: the top two bits of
// each xoshiro256** output of splitmix64(42) (computed independently).
TEST(Seeded, FixedSeedGivesAFixedSequence) {
  const std::vector<float> logits = {0, 0, 0, 0};
  Sampler s(seeded(42), 4);
  const std::vector<TokenId> expected = {0, 1, 2, 3, 3, 3, 2, 3, 3, 2, 2, 1, 3, 1, 2, 3, 2, 3, 2, 2};
  std::vector<TokenId> got;
  for (size_t i = 0; i < expected.size(); ++i) got.push_back(s.sample(logits, {}));
  EXPECT_EQ(got, expected);
  Rng r(42);
  for (TokenId t : expected) EXPECT_EQ(static_cast<TokenId>(r.next_u64() >> 62), t);
}

std::vector<TokenId> draw(uint64_t seed, int n) {
  SamplingParams p = seeded(seed);
  p.temperature = 0.9f;
  p.top_k = 5;
  p.top_p = 0.95f;
  p.repetition_penalty = 1.2f;
  const std::vector<float> logits = {0.3f, 1.2f, -0.4f, 2.2f, 1.9f, 0.8f, 1.5f, -1.0f};
  Sampler s(p, 8);
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits, out));
  return out;
}

TEST(Seeded, SameSeedSameSequenceDifferentSeedsDiffer) {
  EXPECT_EQ(draw(7, 200), draw(7, 200));
  EXPECT_NE(draw(7, 200), draw(8, 200));
}

TEST(Seeded, SampleIsPickOfTheDistributionWithOneDraw) {
  SamplingParams p = seeded(3);
  p.top_p = 0.9f;
  Sampler s(p, 4);
  Rng mirror(3);
  for (int i = 0; i < 100; ++i) {
    std::vector<float> logits = {float(i % 3), 1.5f, 0.5f, float(i % 5) * 0.5f};
    const Dist d = to_dist(s.distribution(logits, {}));
    std::vector<Candidate> copy(s.distribution(logits, {}).begin(), s.distribution(logits, {}).end());
    const TokenId want = Sampler::pick(copy, mirror.uniform());
    EXPECT_EQ(s.sample(logits, {}), want);
    EXPECT_TRUE(d.count(want));
  }
}

TEST(Seeded, SingleCandidateStillConsumesOneDraw) {
  SamplingParams p = seeded(11);
  p.top_k = 1;
  Sampler s(p, 3);
  EXPECT_EQ(s.sample(std::vector<float>{0, 2, 1}, {}), 1);
  Rng r(11);
  r.next_u64();
  EXPECT_EQ(s.rng().state(), r.state());
}

TEST(Seeded, UnsetSeedDrawsOneFromTheOsAndReportsIt) {
  Sampler a(SamplingParams{}, 4), b(SamplingParams{}, 4);
  EXPECT_NE(a.seed(), b.seed());
  EXPECT_EQ(a.rng().state(), Rng(a.seed()).state());
  EXPECT_EQ(Sampler(seeded(5), 4).seed(), 5u);
}

// Chi-square goodness of fit of 100k draws; thresholds are the 0.999
// quantiles (df=2: 13.82, df=3: 16.27). The seed is fixed, so the test is
// deterministic; a wrong distribution (e.g. an off-by-one in pick) gives
// chi-square in the hundreds or more.
double chi_square(const std::vector<int>& counts, const Dist& expected, int n) {
  double chi = 0;
  for (const auto& [tok, p] : expected) {
    const double e = p * n;
    chi += (counts[tok] - e) * (counts[tok] - e) / e;
  }
  return chi;
}

TEST(Seeded, EmpiricalFrequenciesMatchTheDistribution) {
  const int n = 100000;
  {
    Sampler s(seeded(1234), 4);
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) ++counts[s.sample(k1234, {})];
    EXPECT_LT(chi_square(counts, {{0, 0.03205860328008499}, {1, 0.08714431874203257}, {2, 0.23688281808991013},
                                  {3, 0.6439142598879724}}, n),
              16.27);
  }
  {
    SamplingParams p = seeded(99);
    p.top_k = 3;
    Sampler s(p, 4);
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) ++counts[s.sample(k1234, {})];
    EXPECT_EQ(counts[0], 0);
    EXPECT_LT(chi_square(counts, {{1, 0.09003057317038046}, {2, 0.24472847105479764}, {3, 0.6652409557748218}}, n),
              13.82);
  }
}

TEST(Pick, InverseCdfBoundaries) {
  const std::vector<Candidate> d = {{7, 0, 0.25f}, {3, 0, 0.5f}, {9, 0, 0.25f}};
  EXPECT_EQ(Sampler::pick(d, 0.0), 7);
  EXPECT_EQ(Sampler::pick(d, 0.2499), 7);
  EXPECT_EQ(Sampler::pick(d, 0.25), 3);  // cumulative must exceed u
  EXPECT_EQ(Sampler::pick(d, 0.7499), 3);
  EXPECT_EQ(Sampler::pick(d, 0.75), 9);
  EXPECT_EQ(Sampler::pick(d, 1.0 - 0x1.0p-53), 9);
}

// ---- construction -------------------------------------------------------------

TEST(Create, RejectsInvalidParams) {
  SamplingParams p;
  p.top_p = 1.5f;
  auto s = Sampler::create(p, 10);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "top_p: expected a value in (0, 1], got 1.5");
  p.top_p = 0.5f;
  EXPECT_TRUE(Sampler::create(p, 10).ok());
}

// ---- large vocabulary against a naive reference --------------------------------

// The chain written the obvious way: full sorts, double precision.
Dist naive_chain(const std::vector<float>& raw, const std::vector<TokenId>& history, const SamplingParams& p) {
  std::vector<double> l(raw.begin(), raw.end());
  std::vector<TokenId> window = history;
  if (p.penalty_last_n == 0) window.clear();
  if (p.penalty_last_n > 0 && window.size() > size_t(p.penalty_last_n)) window.erase(window.begin(), window.end() - p.penalty_last_n);
  std::map<TokenId, int> count;
  for (TokenId t : window) ++count[t];
  for (auto [t, c] : count) {
    double x = l[t];
    x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    l[t] = x - c * double(p.frequency_penalty) - double(p.presence_penalty);
  }
  struct C { TokenId t; double l; double p; };
  std::vector<C> c;
  for (size_t i = 0; i < l.size(); ++i) c.push_back({TokenId(i), l[i] / p.temperature, 0});
  auto by_logit = [](const C& a, const C& b) { return a.l > b.l || (a.l == b.l && a.t < b.t); };
  auto softmax = [](std::vector<C>& v) {
    double m = -1e300, s = 0;
    for (auto& x : v) m = std::max(m, x.l);
    for (auto& x : v) s += (x.p = std::exp(x.l - m));
    for (auto& x : v) x.p /= s;
  };
  std::sort(c.begin(), c.end(), by_logit);
  if (p.top_k > 0 && size_t(p.top_k) < c.size()) c.resize(p.top_k);
  if (p.typical_p < 1) {
    softmax(c);
    double h = 0;
    for (auto& x : c) h -= x.p * std::log(x.p);
    std::vector<C> order = c;
    std::sort(order.begin(), order.end(), [&](const C& a, const C& b) {
      const double ka = std::fabs(-std::log(a.p) - h), kb = std::fabs(-std::log(b.p) - h);
      return ka < kb || (ka == kb && a.t < b.t);
    });
    double cum = 0;
    size_t k = 0;
    while (k < order.size()) { cum += order[k++].p; if (cum >= p.typical_p) break; }
    order.resize(k);
    std::sort(order.begin(), order.end(), by_logit);
    c = order;
  }
  if (p.top_p < 1) {
    softmax(c);
    double cum = 0;
    size_t k = 0;
    while (k < c.size()) { cum += c[k++].p; if (cum >= p.top_p) break; }
    c.resize(k);
  }
  if (p.min_p > 0) {
    const double m = c[0].l;
    std::erase_if(c, [&](const C& x) { return std::exp(x.l - m) < p.min_p; });
  }
  softmax(c);
  Dist d;
  for (auto& x : c) if (x.p > 0) d[x.t] = x.p;
  return d;
}

void expect_close_sets(const Dist& got, const Dist& want) {
  // Exact same support except possibly a token sitting within float rounding
  // of a cut-off; probabilities agree to float precision.
  size_t common = 0;
  double max_diff = 0;
  for (const auto& [t, pw] : want) {
    auto it = got.find(t);
    if (it == got.end()) continue;
    ++common;
    max_diff = std::max(max_diff, std::fabs(it->second - pw));
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(common, want.size());
  EXPECT_LT(max_diff, 1e-6);
}

TEST(LargeVocabulary, MatchesNaiveChain) {
  const int32_t n = 131072;
  Rng rng(77);
  std::vector<float> flat(n), peaked(n);
  for (int i = 0; i < n; ++i) {
    // flat: sum of four uniforms (near-normal, sd ~1.7); peaked: spread over 30 nats.
    flat[i] = float((rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform()) * 3.0);
    peaked[i] = float(rng.uniform() * 30.0);
  }
  std::vector<TokenId> history;
  for (int i = 0; i < 300; ++i) history.push_back(TokenId(rng.next_u64() % n));

  struct P { const char* name; std::function<void(SamplingParams&)> set; };
  const std::vector<P> params = {
      {"top_p", [](SamplingParams& p) { p.top_p = 0.9f; }},
      {"top_k_top_p", [](SamplingParams& p) { p.top_k = 50; p.top_p = 0.95f; }},
      {"top_k_large", [](SamplingParams& p) { p.top_k = 20000; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 0.05f; }},
      {"temp_top_p_min_p", [](SamplingParams& p) { p.temperature = 0.7f; p.top_p = 0.8f; p.min_p = 0.02f; }},
      {"typical", [](SamplingParams& p) { p.typical_p = 0.9f; }},
      {"penalties", [](SamplingParams& p) {
         p.repetition_penalty = 1.3f; p.frequency_penalty = 0.4f; p.presence_penalty = 0.3f;
         p.penalty_last_n = 64; p.top_k = 40; }},
  };
  for (const auto* logits : {&flat, &peaked}) {
    for (const P& pc : params) {
      SCOPED_TRACE(std::string(pc.name) + (logits == &flat ? " flat" : " peaked"));
      SamplingParams p = seeded(5);
      pc.set(p);
      Sampler s(p, n);
      const Dist got = to_dist(s.distribution(*logits, history));
      expect_close_sets(got, naive_chain(*logits, history, p));
    }
  }
}

TEST(LargeVocabulary, ReusesItsBuffer) {
  const int32_t n = 131072;
  std::vector<float> logits(n);
  Rng rng(1);
  for (float& l : logits) l = float(rng.uniform() * 10);
  SamplingParams p = seeded(1);
  p.top_k = 40;
  p.repetition_penalty = 1.1f;
  Sampler s(p, n);
  const Candidate* first = s.distribution(logits, {}).data();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.distribution(logits, std::vector<TokenId>{1, 2, 3}).data(), first);
}

}  // namespace
TEST(GrammarMask, OnlyAllowedTokensAreSampled) {
  const int32_t n = 200;
  std::vector<float> logits(n);
  for (int32_t i = 0; i < n; ++i) logits[(size_t)i] = (float)(i % 17) * 0.3f;
  std::vector<uint64_t> allowed((n + 63) / 64, 0);
  for (TokenId t : {3, 64, 130, 199}) allowed[(size_t)t / 64] |= 1ull << (t % 64);
  SamplingParams p;
  p.seed = 5;
  Sampler s(p, n);
  std::map<TokenId, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[s.sample(logits, {}, allowed)];
  for (auto [t, c] : seen) EXPECT_TRUE(t == 3 || t == 64 || t == 130 || t == 199) << t;
  EXPECT_EQ(seen.size(), 4u);  // every allowed token has mass
  SamplingParams g;
  g.temperature = 0;
  Sampler greedy(g, n);
  // Unmasked argmax is token 16 (logit 4.8); among the allowed, 64 % 17 = 13 is the largest.
  EXPECT_EQ(greedy.sample(logits, {}), 16);
  EXPECT_EQ(greedy.sample(logits, {}, allowed), 64);
}

}  // namespace serval
