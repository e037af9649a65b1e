// verify_draft: the output distribution of "draw d ~ q, then verify" is p,
// checked by exact quadrature over both uniforms (no sampling noise) on
// hand-made p, q pairs, and by a chi-square test with the seeded Rng; the
// acceptance rule min(1, p/q) at its boundary; point-mass (n-gram) drafts.
#include "sampler/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace serval {
namespace {

std::vector<Candidate> dist(std::map<TokenId, float> m) {
  std::vector<Candidate> v;
  for (auto [t, p] : m) v.push_back({t, 0.0f, p});
  return v;
}

// P(output = t) when d ~ q and both uniforms are integrated on a midpoint grid.
std::map<TokenId, double> output_distribution(const std::vector<Candidate>& p, const std::vector<Candidate>& q) {
  std::vector<float> scratch;
  std::map<TokenId, double> out;
  const int grid = 400;
  double q_total = 0;
  for (const Candidate& c : q) q_total += c.prob;
  for (const Candidate& d : q) {
    for (int a = 0; a < grid; ++a) {
      const double ua = (a + 0.5) / grid;
      for (int r = 0; r < grid; ++r) {
        const double ur = (r + 0.5) / grid;
        const DraftVerdict v = verify_draft(p, q, d.token, ua, ur, &scratch);
        out[v.token] += d.prob / q_total / grid / grid;
        if (v.accepted) {  // the resampling uniform does not matter then
          out[v.token] += d.prob / q_total / grid * (grid - 1 - r) / grid;
          break;
        }
      }
    }
  }
  for (float x : scratch) EXPECT_EQ(x, 0.0f) << "scratch must be left zeroed";
  return out;
}

void expect_matches(const std::map<TokenId, double>& got, const std::vector<Candidate>& p, double tol) {
  double total = 0;
  for (const Candidate& c : p) total += c.prob;
  for (const Candidate& c : p) {
    const double g = got.count(c.token) ? got.at(c.token) : 0.0;
    EXPECT_NEAR(g, c.prob / total, tol) << "token " << c.token;
  }
  for (const auto& [t, g] : got) {
    bool in_p = false;
    for (const Candidate& c : p) in_p = in_p || (c.token == t && c.prob > 0);
    if (!in_p) {
      EXPECT_EQ(g, 0.0) << "token " << t << " is outside p's support";
    }
  }
}

TEST(VerifyDraft, OutputIsDistributedAsTargetByQuadrature) {
  const std::vector<std::pair<std::vector<Candidate>, std::vector<Candidate>>> cases = {
      // overlapping supports, q sharper than p
      {dist({{0, 0.5f}, {1, 0.3f}, {2, 0.2f}}), dist({{0, 0.1f}, {1, 0.8f}, {2, 0.1f}})},
      // q has mass where p has none (e.g. p cut by top-k), p unnormalised
      {dist({{3, 1.0f}, {5, 1.0f}}), dist({{3, 0.25f}, {4, 0.5f}, {5, 0.25f}})},
      // q's support inside p's
      {dist({{0, 0.1f}, {1, 0.2f}, {2, 0.3f}, {7, 0.4f}}), dist({{7, 0.9f}, {1, 0.1f}})},
      // n-gram point mass
      {dist({{0, 0.6f}, {1, 0.4f}}), dist({{1, 1.0f}})},
      // identical: always accepted
      {dist({{2, 0.7f}, {9, 0.3f}}), dist({{9, 0.3f}, {2, 0.7f}})},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    // The grid resolves probabilities to about 1/grid.
    expect_matches(output_distribution(cases[i].first, cases[i].second), cases[i].first, 4e-3);
  }
}

TEST(VerifyDraft, AcceptsWithProbabilityMinOneRatio) {
  std::vector<float> scratch;
  const auto p = dist({{0, 0.2f}, {1, 0.8f}});
  const auto q = dist({{0, 0.8f}, {1, 0.2f}});
  // p(0)/q(0) = 0.25: accepted below 0.25, rejected above; on rejection the
  // residual max(0, p - q) = {1: 0.6} is all on token 1.
  EXPECT_TRUE(verify_draft(p, q, 0, 0.24, 0.5, &scratch).accepted);
  const DraftVerdict r = verify_draft(p, q, 0, 0.26, 0.0, &scratch);
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.token, 1);
  // p(1) > q(1): always accepted.
  EXPECT_TRUE(verify_draft(p, q, 1, 0.999, 0.5, &scratch).accepted);
  // Draft outside p's support: always rejected, resampled from p - q where positive.
  const DraftVerdict out = verify_draft(dist({{1, 1.0f}}), dist({{0, 1.0f}}), 0, 0.0, 0.3, &scratch);
  EXPECT_FALSE(out.accepted);
  EXPECT_EQ(out.token, 1);
}

TEST(VerifyDraft, ChiSquareWithSeededRng) {
  const auto p = dist({{0, 0.05f}, {1, 0.15f}, {2, 0.3f}, {3, 0.1f}, {4, 0.4f}});
  const auto q = dist({{0, 0.3f}, {1, 0.3f}, {2, 0.1f}, {3, 0.25f}, {5, 0.05f}});
  Rng rng(2024);
  std::vector<float> scratch;
  const int n = 200000;
  std::map<TokenId, int> seen;
  for (int i = 0; i < n; ++i) {
    // d ~ q by inverse CDF, then verify.
    const double u = rng.uniform();
    double cum = 0;
    TokenId d = q.back().token;
    for (const Candidate& c : q) {
      cum += c.prob;
      if (u < cum) {
        d = c.token;
        break;
      }
    }
    ++seen[verify_draft(p, q, d, rng, &scratch).token];
  }
  double chi2 = 0;
  for (const Candidate& c : p) {
    const double ex = c.prob * n;
    chi2 += (seen[c.token] - ex) * (seen[c.token] - ex) / ex;
  }
  EXPECT_EQ(seen.count(5), 0u);
  EXPECT_LT(chi2, 18.47) << "chi-square, 4 degrees of freedom, 99.9% quantile";
}

}  // namespace
}  // namespace serval
