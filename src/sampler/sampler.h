// Sampler: turns one sequence's logits into its next token.
//
// The chain (llama.cpp / vLLM order; DESIGN.md "logit-processor chain"):
//   1. copy the raw logits (NaN -> -inf, +inf -> FLT_MAX)
//   2. repetition / frequency / presence penalties over the window: the last
//      penalty_last_n tokens of `history` (-1: all of it, 0: none)
//   3. logit_bias (-100 bans), then the grammar mask when one is given
//      (disallowed tokens -> -inf)
//   4. temperature; temperature < 1e-5 is greedy: the distribution is the
//      argmax of steps 1-3 with probability 1 (lowest token id wins ties),
//      and steps 5-8 are skipped (they only matter for random sampling)
//   5. top_k   6. typical_p   7. top_p   8. min_p
//   9. softmax over the survivors; zero-probability tokens dropped
//  10. sample: one uniform draw u from the seeded Rng; the first candidate
//      (in distribution order) whose cumulative probability exceeds u * total.
//      Greedy sampling draws nothing, so its result is independent of the Rng.
// If every token is banned (-inf after step 3), the distribution is the
// lowest token id with probability 1 (the greedy tie-break), never NaN.
//
// distribution() exposes step 9's result so that later stages (grammar mask,
// speculative verification) work on exactly what sample() draws from:
// sample(l, h) == pick(distribution(l, h), rng().uniform()) for non-greedy
// parameters, and == distribution(l, h)[0].token for greedy ones.
//
// `history` is the token sequence the penalties look back over; the caller
// decides what it holds (the engine passes prompt + generated tokens).
//
// Cost for a 128k vocabulary: greedy and top-k (k <= 1024) are one or two
// linear passes over the logits and never sort the vocabulary; top-p and
// typical-p without top-k are linear (a mass histogram) plus a sort of the
// few candidates at the cut; without top-k every token costs one exp.
//
// Reproducibility: the Rng stream and every ordering and tie-break are
// exact and independent of the standard library; probabilities use the
// platform's expf/log, whose last bit may differ between C libraries, so a
// seeded run matches on another platform unless a draw lands within ~1e-7
// of a cumulative-probability boundary.
//
// Ownership and threads: a Sampler owns its buffers (about 16 bytes per
// vocabulary entry; 4 more with penalties; 24 more with top-p or
// typical-p), allocated once in the constructor; sample()/distribution() do
// not allocate. One Sampler per sequence, used from one thread at a time
// (the engine loop); not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "sampler/logit_processors.h"
#include "sampler/rng.h"
#include "serval/sampling_params.h"

namespace serval {

class Sampler {
 public:
  // `params` must satisfy params.validate(n_vocab) (asserted). The Rng is
  // seeded with params.seed, or with a fresh OS seed if it is unset.
  Sampler(SamplingParams params, int32_t n_vocab);

  // Validates, then constructs.
  static Expected<Sampler> create(SamplingParams params, int32_t n_vocab);

  // The next token for logits [n_vocab]. Advances the Rng by one draw unless
  // greedy.
  // `allowed`: empty, or a bitset over the vocabulary (bit t of word t/64)
  // of the tokens a grammar allows (GrammarMatcher::fill_mask).
  TokenId sample(std::span<const float> logits, std::span<const TokenId> history,
                 std::span<const uint64_t> allowed = {});

  // The final normalised distribution (token, prob > 0) after every
  // processor, in a deterministic order that does not depend on the standard
  // library: "better first" when top-k ran (or greedy), otherwise by token id. Probabilities sum to 1
  // up to float rounding. The span points into this Sampler's buffer and is
  // valid until the next sample()/distribution() call. Does not touch the Rng.
  std::span<const Candidate> distribution(std::span<const float> logits,
                                          std::span<const TokenId> history,
                                          std::span<const uint64_t> allowed = {});

  // Steps 1-3 only: the logits after sanitizing, penalties, logit_bias and
  // the mask ([n_vocab], banned tokens -inf), which beam and contrastive
  // search score. Points into this Sampler's buffer, valid until the next
  // call. Does not touch the Rng.
  std::span<const float> processed_logits(std::span<const float> logits, std::span<const TokenId> history,
                                          std::span<const uint64_t> allowed = {});

  // The token at u in [0, 1) of `dist` (inverse CDF in the given order).
  static TokenId pick(std::span<const Candidate> dist, double u);

  bool is_greedy() const { return params_.temperature < kGreedyTemperatureEpsilon; }
  uint64_t seed() const { return seed_; }  // the seed actually used
  Rng& rng() { return rng_; }
  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  SamplingParams params_;
  int32_t n_vocab_;
  uint64_t seed_;
  Rng rng_;
  bool penalties_on_;
  // top_k up to this uses select_top_k's heap; larger k uses nth_element.
  static constexpr int32_t kHeapTopKLimit = 1024;

  std::vector<float> logits_;    // [n_vocab] raw logits after penalties and bias
  CandidateSet set_;
  std::vector<int32_t> counts_;  // [n_vocab] zeros between calls; empty when penalties are off
};

}  // namespace serval
