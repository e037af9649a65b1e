// Log-probabilities reported with each generated token (OpenAI `logprobs` /
// `top_logprobs`, vLLM `logprobs`).
//
// They are log_softmax of the *raw* model logits, before penalties, bias,
// temperature and truncation: what OpenAI and vLLM report by default. A
// token the model gives -inf (or NaN, treated as -inf) reports -inf; the
// server decides how to serialise it.
//
// Free functions, no state; `out` is owned by the caller and reused so the
// per-token cost is two passes over the logits and no allocation once
// out.top has capacity for top_n entries.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "serval/sampling_params.h"

namespace serval {

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  TokenLogprob chosen;             // the sampled token
  std::vector<TokenLogprob> top;   // min(top_n, n_vocab) best, logprob desc, ties by lower token id
  int32_t rank = 1;                // the chosen token's place in that order, 1 = the most likely
};

// logits: [n_vocab], the raw model output. chosen in [0, n_vocab); top_n >= 0.
void compute_logprobs(std::span<const float> logits, TokenId chosen, int32_t top_n, TokenLogprobs& out);
TokenLogprobs compute_logprobs(std::span<const float> logits, TokenId chosen, int32_t top_n);

}  // namespace serval
