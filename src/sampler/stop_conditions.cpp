#include "sampler/stop_conditions.h"

#include <algorithm>

#include "common/status.h"

namespace serval {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::none: break;
  }
  return "";
}

FinishReason check_token_stop(const SamplingParams& params, TokenId token, int32_t n_generated,
                              std::span<const TokenId> eos_ids) {
  SERVAL_ASSERT(n_generated >= 1);
  auto contains = [token](std::span<const TokenId> ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if (!params.ignore_eos && contains(eos_ids)) return FinishReason::stop;
  if (contains(params.stop_token_ids)) return FinishReason::stop;
  if (params.max_tokens && n_generated >= *params.max_tokens) return FinishReason::length;
  return FinishReason::none;
}

}  // namespace serval
