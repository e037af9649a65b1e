#include "sampler/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/status.h"
#include "sampler/logit_processors.h"

namespace serval {

namespace {
bool better(const TokenLogprob& a, const TokenLogprob& b) {
  return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
}
}  // namespace

void compute_logprobs(std::span<const float> logits, TokenId chosen, int32_t top_n, TokenLogprobs& out) {
  SERVAL_ASSERT(!logits.empty());
  SERVAL_ASSERT(chosen >= 0 && static_cast<size_t>(chosen) < logits.size());
  SERVAL_ASSERT(top_n >= 0);
  const size_t n = std::min(static_cast<size_t>(top_n), logits.size());

  // Pass 1: max, and the n best (sanitised) logits by insertion into a
  // small sorted array; `out.top` holds raw logits until pass 2.
  out.top.clear();
  out.top.reserve(n);
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const TokenLogprob c{static_cast<TokenId>(i), sanitize_logit(logits[i])};
    m = std::max(m, c.logprob);
    if (n == 0) continue;
    if (out.top.size() == n && !better(c, out.top.back())) continue;
    if (out.top.size() == n) out.top.pop_back();
    out.top.insert(std::upper_bound(out.top.begin(), out.top.end(), c, better), c);
  }

  // Pass 2: log-sum-exp; logprob = (l - m) - log(sum exp(l_i - m)), in double.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  double log_sum = 0.0;
  const float chosen_logit = sanitize_logit(logits[static_cast<size_t>(chosen)]);
  size_t better_than_chosen = 0;  // ranks as `top` orders: logprob desc, ties by lower id
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = sanitize_logit(logits[i]);
    if (m != kNegInf) sum += std::exp(l - m);
    better_than_chosen += l > chosen_logit || (l == chosen_logit && i < static_cast<size_t>(chosen));
  }
  if (m != kNegInf) log_sum = std::log(sum);
  out.rank = static_cast<int32_t>(better_than_chosen + 1);
  auto logprob = [&](float l) {
    if (m == kNegInf || l == kNegInf) return kNegInf;
    return static_cast<float>((static_cast<double>(l) - m) - log_sum);
  };
  for (TokenLogprob& t : out.top) t.logprob = logprob(t.logprob);
  out.chosen = TokenLogprob{chosen, logprob(sanitize_logit(logits[chosen]))};
}

TokenLogprobs compute_logprobs(std::span<const float> logits, TokenId chosen, int32_t top_n) {
  TokenLogprobs out;
  compute_logprobs(logits, chosen, top_n, out);
  return out;
}

}  // namespace serval
