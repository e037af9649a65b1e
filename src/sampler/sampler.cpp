#include "sampler/sampler.h"

#include <limits>
#include <utility>

namespace serval {

namespace {
uint64_t choose_seed(const SamplingParams& p) { return p.seed ? *p.seed : Rng::os_seed(); }
}  // namespace

Sampler::Sampler(SamplingParams params, int32_t n_vocab)
    : params_(std::move(params)), n_vocab_(n_vocab), seed_(choose_seed(params_)), rng_(seed_) {
  SERVAL_ASSERT(params_.validate(n_vocab_, /*score_only=*/true).ok());  // max_tokens is not the sampler's
  penalties_on_ = params_.penalty_last_n != 0 &&
                  (params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                   params_.presence_penalty != 0.0f);
  logits_.resize(static_cast<size_t>(n_vocab_));
  set_.items.reserve(static_cast<size_t>(n_vocab_));
  if (params_.typical_p < 1.0f || params_.top_p < 1.0f) {
    set_.scratch_key.reserve(static_cast<size_t>(n_vocab_));
    set_.scratch_index.reserve(static_cast<size_t>(n_vocab_));
    set_.scratch_border.reserve(static_cast<size_t>(n_vocab_));
  }
  if (penalties_on_) counts_.assign(static_cast<size_t>(n_vocab_), 0);
}

Expected<Sampler> Sampler::create(SamplingParams params, int32_t n_vocab) {
  Status st = params.validate(n_vocab);
  if (!st.ok()) return st;
  return Sampler(std::move(params), n_vocab);
}

std::span<const float> Sampler::processed_logits(std::span<const float> logits, std::span<const TokenId> history,
                                                 std::span<const uint64_t> allowed) {
  SERVAL_ASSERT(logits.size() == static_cast<size_t>(n_vocab_));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  sanitize_logits(logits, logits_);
  if (penalties_on_) {
    std::span<const TokenId> window = history;
    if (params_.penalty_last_n > 0 && window.size() > static_cast<size_t>(params_.penalty_last_n)) {
      window = window.last(static_cast<size_t>(params_.penalty_last_n));
    }
    apply_penalties(logits_, window, params_.repetition_penalty, params_.frequency_penalty,
                    params_.presence_penalty, counts_);
  }
  if (!params_.logit_bias.empty()) apply_logit_bias(logits_, params_.logit_bias);
  if (!allowed.empty()) {
    SERVAL_ASSERT(allowed.size() * 64 >= logits_.size());
    for (size_t t = 0; t < logits_.size(); ++t)
      if (!((allowed[t >> 6] >> (t & 63)) & 1)) logits_[t] = kNegInf;
  }
  return logits_;
}

std::span<const Candidate> Sampler::distribution(std::span<const float> logits,
                                                 std::span<const TokenId> history,
                                                 std::span<const uint64_t> allowed) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto& items = set_.items;
  auto one_hot = [&](TokenId t, float logit) {
    items.assign(1, Candidate{t, logit, 1.0f});  // capacity is kept: no allocation
    set_.sorted = true;
    return std::span<const Candidate>(items);
  };

  // 1-3: dense logits, penalties, bias.
  processed_logits(logits, history, allowed);

  // 4: greedy.
  if (is_greedy()) {
    const TokenId t = argmax(logits_);
    return one_hot(t, logits_[t]);
  }

  // 5 (before 4, same result; see logit_processors.h): top-k.
  const bool small_top_k = params_.top_k > 0 && params_.top_k < n_vocab_ &&
                           params_.top_k <= kHeapTopKLimit;
  if (small_top_k) {
    select_top_k(logits_, params_.top_k, set_);
  } else {
    set_.reset_dense(logits_);
    if (params_.top_k > 0) apply_top_k(set_, params_.top_k);
  }
  const TokenId best = set_.sorted ? items.front().token : argmax(logits_);
  if (logits_[best] == kNegInf) return one_hot(best, kNegInf);  // everything banned

  // 4: temperature; 6-9.
  apply_temperature(set_, params_.temperature);
  if (params_.typical_p < 1.0f) apply_typical(set_, params_.typical_p);
  if (params_.top_p < 1.0f) apply_top_p(set_, params_.top_p);
  if (params_.min_p > 0.0f) apply_min_p(set_, params_.min_p);
  normalize(set_);
  return items;
}

TokenId Sampler::pick(std::span<const Candidate> dist, double u) {
  SERVAL_ASSERT(!dist.empty());
  double total = 0.0;
  for (const Candidate& c : dist) total += c.prob;
  const double target = u * total;
  double cum = 0.0;
  for (const Candidate& c : dist) {
    cum += c.prob;
    if (cum > target) return c.token;
  }
  // Only reachable through rounding with u just below 1: the last token
  // that has any mass.
  for (size_t i = dist.size(); i-- > 0;) {
    if (dist[i].prob > 0.0f) return dist[i].token;
  }
  return dist.back().token;
}

TokenId Sampler::sample(std::span<const float> logits, std::span<const TokenId> history,
                        std::span<const uint64_t> allowed) {
  std::span<const Candidate> dist = distribution(logits, history, allowed);
  if (is_greedy()) return dist.front().token;
  // Exactly one draw per non-greedy call, even when the distribution has a
  // single token, so the Rng's position depends only on the call count.
  return pick(dist, rng_.uniform());
}

}  // namespace serval
