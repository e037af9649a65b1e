#include "sampler/logit_processors.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "common/status.h"

namespace serval {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float max_logit(const CandidateSet& set) {
  if (set.items.empty()) return kNegInf;
  if (set.sorted) return set.items.front().logit;
  float m = kNegInf;
  for (const Candidate& c : set.items) m = std::max(m, c.logit);
  return m;
}

// Stable in-place filter.
template <typename Keep>
void keep_if(std::vector<Candidate>& items, Keep keep) {
  size_t w = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (keep(items[i])) items[w++] = items[i];
  }
  items.resize(w);
}

}  // namespace

void CandidateSet::reset_dense(std::span<const float> logits) {
  items.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    items[i] = Candidate{static_cast<TokenId>(i), sanitize_logit(logits[i]), 0.0f};
  }
  sorted = false;
}

float sanitize_logit(float x) {
  if (std::isnan(x)) return kNegInf;
  if (x == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return x;
}

void sanitize_logits(std::span<const float> in, std::span<float> out) {
  SERVAL_ASSERT(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = sanitize_logit(in[i]);
}

void apply_penalties(std::span<float> logits, std::span<const TokenId> window, float repetition,
                     float frequency, float presence, std::span<int32_t> counts) {
  SERVAL_ASSERT(counts.size() == logits.size());
  const size_t n = logits.size();
  for (TokenId t : window) {
    SERVAL_ASSERT(t >= 0 && static_cast<size_t>(t) < n);
    ++counts[t];
  }
  for (TokenId t : window) {
    const int32_t c = counts[t];
    if (c == 0) continue;  // already applied for an earlier occurrence
    counts[t] = 0;
    float& l = logits[t];
    if (repetition != 1.0f) l = l > 0.0f ? l / repetition : l * repetition;
    l -= static_cast<float>(c) * frequency + presence;
  }
}

void apply_logit_bias(std::span<float> logits, std::span<const LogitBias> bias) {
  for (const LogitBias& b : bias) {
    SERVAL_ASSERT(b.token >= 0 && static_cast<size_t>(b.token) < logits.size());
    float& l = logits[b.token];
    l = b.bias <= -SamplingLimits::max_abs_logit_bias ? kNegInf : l + b.bias;
  }
}

TokenId argmax(std::span<const float> logits) {
  SERVAL_ASSERT(!logits.empty());
  size_t best = 0;
  float best_l = logits[0];
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > best_l) {
      best_l = logits[i];
      best = i;
    }
  }
  return static_cast<TokenId>(best);
}

void select_top_k(std::span<const float> logits, int32_t k, CandidateSet& set) {
  SERVAL_ASSERT(k >= 1);
  auto& v = set.items;
  const size_t n = logits.size();
  const size_t kk = std::min(static_cast<size_t>(k), n);
  v.clear();
  for (size_t i = 0; i < kk; ++i) v.push_back(Candidate{static_cast<TokenId>(i), logits[i], 0.0f});
  // A heap ordered by candidate_better has the *worst* kept candidate at
  // the front. Later tokens have higher ids, so one with an equal logit
  // is worse than the front and skipped: strict > is the whole test.
  std::make_heap(v.begin(), v.end(), candidate_better);
  for (size_t i = kk; i < n; ++i) {
    const float l = logits[i];
    if (!(l > v.front().logit)) continue;
    std::pop_heap(v.begin(), v.end(), candidate_better);
    v.back() = Candidate{static_cast<TokenId>(i), l, 0.0f};
    std::push_heap(v.begin(), v.end(), candidate_better);
  }
  std::sort_heap(v.begin(), v.end(), candidate_better);  // better first
  set.sorted = true;
}

const Candidate& best_candidate(std::span<const Candidate> items) {
  SERVAL_ASSERT(!items.empty());
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    if (candidate_better(items[i], items[best])) best = i;
  }
  return items[best];
}

void apply_temperature(CandidateSet& set, float t) {
  SERVAL_ASSERT(t > 0.0f);
  if (t == 1.0f) return;
  const float m = max_logit(set);
  if (m == kNegInf) return;  // nothing finite to scale
  // Subtracting the max first keeps the quotient finite for tiny t and loses
  // less precision than logit / t - max / t; softmax is shift-invariant.
  for (Candidate& c : set.items) c.logit = (c.logit - m) / t;
}

void apply_top_k(CandidateSet& set, int32_t k) {
  auto& v = set.items;
  if (k <= 0 || static_cast<size_t>(k) >= v.size()) return;
  if (!set.sorted) {
    std::nth_element(v.begin(), v.begin() + k, v.end(), candidate_better);
    v.resize(k);
    std::sort(v.begin(), v.end(), candidate_better);
    set.sorted = true;
  } else {
    v.resize(k);
  }
}

void softmax(CandidateSet& set) {
  auto& v = set.items;
  if (v.empty()) return;
  const float m = max_logit(set);
  if (m == kNegInf) {
    const float u = 1.0f / static_cast<float>(v.size());
    for (Candidate& c : v) c.prob = u;
    return;
  }
  double sum = 0.0;
  for (Candidate& c : v) {
    c.prob = std::exp(c.logit - m);
    sum += c.prob;
  }
  const double inv = 1.0 / sum;
  for (Candidate& c : v) c.prob = static_cast<float>(c.prob * inv);
}

void normalize(CandidateSet& set) {
  softmax(set);
  keep_if(set.items, [](const Candidate& c) { return c.prob > 0.0f; });
}

namespace {

// Histogram resolution for keep_mass_prefix: keys are in nats.
constexpr size_t kMassBuckets = 1024;
constexpr float kBucketsPerNat = 32.0f;  // keys >= 1023/32 nats share the last bucket

size_t bucket_of(float key) {
  constexpr float kLimit = static_cast<float>(kMassBuckets - 1) / kBucketsPerNat;
  if (!(key < kLimit)) return kMassBuckets - 1;  // also +inf
  return key <= 0.0f ? 0 : static_cast<size_t>(key * kBucketsPerNat);
}

// Keeps the smallest prefix, in the total order `before` over (key, candidate)
// pairs, whose probability mass reaches p; kept candidates keep their
// relative order. set.scratch_key[i] >= 0 must be monotone in that order
// (before(a, b) implies key a <= key b) and probs must be normalised.
// O(n) plus a sort of the one histogram bucket the cut falls in; no
// standard-library-specific ordering (the result is unique).
template <typename Before>
void keep_mass_prefix(CandidateSet& set, double p, Before before) {
  auto& v = set.items;
  const auto& key = set.scratch_key;
  auto& bucket = set.scratch_index;
  const size_t n = v.size();
  bucket.resize(n);
  std::array<double, kMassBuckets> mass{};
  for (size_t i = 0; i < n; ++i) {
    bucket[i] = static_cast<uint32_t>(bucket_of(key[i]));
    mass[bucket[i]] += v[i].prob;
  }
  double cum = 0.0;
  size_t edge = kMassBuckets;
  for (size_t b = 0; b < kMassBuckets; ++b) {
    if (mass[b] > 0.0 && cum + mass[b] >= p) {
      edge = b;
      break;
    }
    cum += mass[b];
  }
  if (edge == kMassBuckets) return;  // rounding kept the total below p: keep all

  auto& border = set.scratch_border;
  border.clear();
  for (size_t i = 0; i < n; ++i) {
    if (bucket[i] == edge) border.emplace_back(key[i], v[i]);
  }
  std::sort(border.begin(), border.end(), before);
  size_t last = 0;
  for (; last < border.size(); ++last) {
    cum += border[last].second.prob;
    if (cum >= p) break;
  }
  if (last == border.size()) --last;  // rounding: keep the whole bucket
  const std::pair<float, Candidate> cut = border[last];

  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool keep = bucket[i] < edge || (bucket[i] == edge && !before(cut, std::pair{key[i], v[i]}));
    if (keep) v[w++] = v[i];
  }
  v.resize(w);
}

}  // namespace

void apply_typical(CandidateSet& set, float p) {
  auto& v = set.items;
  const size_t n = v.size();
  if (p >= 1.0f || n <= 1) return;
  softmax(set);
  double entropy = 0.0;
  for (const Candidate& c : v) {
    if (c.prob > 0.0f) entropy -= static_cast<double>(c.prob) * std::log(static_cast<double>(c.prob));
  }
  auto& key = set.scratch_key;
  key.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double pr = v[i].prob;
    key[i] = pr > 0.0 ? static_cast<float>(std::fabs(-std::log(pr) - entropy))
                      : std::numeric_limits<float>::infinity();
  }
  keep_mass_prefix(set, p, [](const std::pair<float, Candidate>& a, const std::pair<float, Candidate>& b) {
    return a.first < b.first || (a.first == b.first && a.second.token < b.second.token);
  });
}

void apply_top_p(CandidateSet& set, float p) {
  auto& v = set.items;
  const size_t n = v.size();
  if (p >= 1.0f || n <= 1) return;
  softmax(set);
  if (set.sorted) {
    double cum = 0.0;
    size_t i = 0;
    while (i < n) {
      cum += v[i++].prob;
      if (cum >= p) break;
    }
    v.resize(i);
    return;
  }
  // Key: the gap to the max logit (>= 0, monotone in candidate_better).
  const float m = max_logit(set);
  auto& key = set.scratch_key;
  key.resize(n);
  for (size_t i = 0; i < n; ++i) key[i] = m - v[i].logit;
  keep_mass_prefix(set, p, [](const std::pair<float, Candidate>& a, const std::pair<float, Candidate>& b) {
    return candidate_better(a.second, b.second);
  });
}

void apply_min_p(CandidateSet& set, float p) {
  if (p <= 0.0f || set.items.size() <= 1) return;
  const float m = max_logit(set);
  if (m == kNegInf) return;
  const float min_delta = std::log(p);  // p_i / p_max = exp(logit_i - max)
  keep_if(set.items, [&](const Candidate& c) { return c.logit - m >= min_delta; });
}

}  // namespace serval
