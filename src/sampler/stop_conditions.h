// Token-level stop conditions: EOS, stop_token_ids and max_tokens.
//
// Called by the engine after each sampled token (stop strings are checked on
// the detokenized text by StopMatcher). Precedence as in vLLM: a stop token
// wins over the length limit, so a stop token that is also the max_tokens-th
// token reports `stop`. The token that triggers `stop` here is not part of
// the visible text. Stateless; any thread.
#pragma once

#include <cstdint>
#include <span>

#include "serval/sampling_params.h"

namespace serval {

// OpenAI's finish_reason values, plus `none` for "keep going".
enum class FinishReason { none, stop, length };

// "stop", "length", or "" for none.
const char* finish_reason_name(FinishReason r);

// `token` is the token just generated and n_generated counts it (>= 1).
// eos_ids are the model's end-of-generation tokens (EOS, EOT, ...); they
// stop unless params.ignore_eos. stop_token_ids always stop.
FinishReason check_token_stop(const SamplingParams& params, TokenId token, int32_t n_generated,
                              std::span<const TokenId> eos_ids);

}  // namespace serval
