// SamplingParams::validate (declared in include/serval/sampling_params.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "serval/sampling_params.h"

namespace serval {

namespace {

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string num(int64_t x) { return std::to_string(x); }

Status bad(const std::string& field, const std::string& expected, const std::string& got) {
  return invalid_argument(field + ": expected " + expected + ", got " + got);
}

// Closed range [lo, hi]; rejects NaN.
Status check_closed(const char* field, float v, float lo, float hi) {
  if (v >= lo && v <= hi) return {};
  return bad(field, "a value in [" + num(lo) + ", " + num(hi) + "]", num(v));
}

// Half-open range (lo, hi]; rejects NaN.
Status check_open_closed(const char* field, float v, float lo, float hi) {
  if (v > lo && v <= hi) return {};
  return bad(field, "a value in (" + num(lo) + ", " + num(hi) + "]", num(v));
}

Status check_token(const std::string& field, TokenId t, int32_t n_vocab) {
  if (t >= 0 && t < n_vocab) return {};
  return bad(field, "a token id in [0, " + num(int64_t{n_vocab}) + ")", num(int64_t{t}));
}

}  // namespace

Status SamplingParams::validate(int32_t n_vocab, bool score_only) const {
  using L = SamplingLimits;
  if (n_vocab <= 0) return bad("n_vocab", "a positive vocabulary size", num(int64_t{n_vocab}));

  SERVAL_RETURN_IF_ERROR(check_closed("temperature", temperature, 0.0f, L::max_temperature));
  if (top_k < -1) return bad("top_k", "-1 or 0 (off) or a positive count", num(int64_t{top_k}));
  SERVAL_RETURN_IF_ERROR(check_open_closed("top_p", top_p, 0.0f, 1.0f));
  SERVAL_RETURN_IF_ERROR(check_closed("min_p", min_p, 0.0f, 1.0f));
  SERVAL_RETURN_IF_ERROR(check_open_closed("typical_p", typical_p, 0.0f, 1.0f));
  SERVAL_RETURN_IF_ERROR(
      check_open_closed("repetition_penalty", repetition_penalty, 0.0f, L::max_repetition_penalty));
  SERVAL_RETURN_IF_ERROR(check_closed("frequency_penalty", frequency_penalty, -L::max_abs_frequency_penalty,
                                      L::max_abs_frequency_penalty));
  SERVAL_RETURN_IF_ERROR(check_closed("presence_penalty", presence_penalty, -L::max_abs_presence_penalty,
                                      L::max_abs_presence_penalty));
  if (penalty_last_n < -1) {
    return bad("penalty_last_n", "-1 (whole history), 0 (off) or a positive count", num(int64_t{penalty_last_n}));
  }

  if (logit_bias.size() > L::max_logit_bias_entries) {
    return bad("logit_bias", "at most " + num(int64_t(L::max_logit_bias_entries)) + " entries",
               num(int64_t(logit_bias.size())));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const std::string f = "logit_bias[" + std::to_string(i) + "]";
    SERVAL_RETURN_IF_ERROR(check_token(f + ".token", logit_bias[i].token, n_vocab));
    SERVAL_RETURN_IF_ERROR(check_closed((f + ".bias").c_str(), logit_bias[i].bias, -L::max_abs_logit_bias,
                                        L::max_abs_logit_bias));
  }
  if (logit_bias.size() > 1) {
    // Duplicates would be ambiguous (OpenAI's logit_bias is a map). Sort
    // (token, index) pairs to name both entries.
    std::vector<std::pair<TokenId, size_t>> ids(logit_bias.size());
    for (size_t i = 0; i < logit_bias.size(); ++i) ids[i] = {logit_bias[i].token, i};
    std::sort(ids.begin(), ids.end());
    for (size_t i = 1; i < ids.size(); ++i) {
      if (ids[i].first == ids[i - 1].first) {
        return bad("logit_bias[" + std::to_string(ids[i].second) + "].token",
                   "a token id not already in logit_bias[" + std::to_string(ids[i - 1].second) + "]",
                   num(int64_t{ids[i].first}));
      }
    }
  }

  if (stop.size() > L::max_stop_strings) {
    return bad("stop", "at most " + num(int64_t(L::max_stop_strings)) + " strings", num(int64_t(stop.size())));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty() || stop[i].size() > L::max_stop_string_bytes) {
      return bad("stop[" + std::to_string(i) + "]",
                 "a string of 1 to " + num(int64_t(L::max_stop_string_bytes)) + " bytes",
                 num(int64_t(stop[i].size())) + " bytes");
    }
  }
  if (stop_token_ids.size() > L::max_stop_token_ids) {
    return bad("stop_token_ids", "at most " + num(int64_t(L::max_stop_token_ids)) + " entries",
               num(int64_t(stop_token_ids.size())));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    SERVAL_RETURN_IF_ERROR(check_token("stop_token_ids[" + std::to_string(i) + "]", stop_token_ids[i], n_vocab));
  }
  if (max_tokens && *max_tokens < (score_only ? 0 : 1))
    return bad("max_tokens", score_only ? "a value >= 0" : "a value >= 1", num(int64_t{*max_tokens}));
  if (logprobs < 0 || logprobs > L::max_logprobs) {
    return bad("logprobs", "a value in [0, " + num(int64_t{L::max_logprobs}) + "]", num(int64_t{logprobs}));
  }
  return validate_search();
}

Status SamplingParams::validate_search() const {
  using L = SamplingLimits;
  if (beam_width < 0 || beam_width > L::max_beam_width)
    return bad("beam_width", "a value in [0, " + num(int64_t{L::max_beam_width}) + "]", num(int64_t{beam_width}));
  SERVAL_RETURN_IF_ERROR(
      check_closed("length_penalty", length_penalty, -L::max_abs_length_penalty, L::max_abs_length_penalty));
  SERVAL_RETURN_IF_ERROR(check_closed("diversity_penalty", diversity_penalty, 0.0f, L::max_diversity_penalty));
  SERVAL_RETURN_IF_ERROR(check_closed("penalty_alpha", penalty_alpha, 0.0f, 1.0f));
  const int32_t width = std::max(beam_width, 1);
  if (num_beam_groups < 1 || num_beam_groups > width || width % num_beam_groups != 0)
    return bad("num_beam_groups", "a divisor of beam_width (" + num(int64_t{width}) + ")",
               num(int64_t{num_beam_groups}));
  if (diversity_penalty > 0.0f && num_beam_groups < 2)
    return bad("diversity_penalty", "0 unless num_beam_groups > 1", num(diversity_penalty));
  if (penalty_alpha > 0.0f) {
    if (beam_search()) return bad("penalty_alpha", "0 with beam search", num(penalty_alpha));
    if (top_k < 2 || top_k > L::max_contrastive_top_k)
      return bad("top_k", "a value in [2, " + num(int64_t{L::max_contrastive_top_k}) + "] with penalty_alpha > 0",
                 num(int64_t{top_k}));
  }
  if ((beam_search() || contrastive_search()) && grammar)
    return bad(beam_search() ? "beam_width" : "penalty_alpha", "no search decoding with a grammar (response_format, "
               "tools, guided decoding)", "both");
  if (beam_search() && !stop.empty())
    return bad("stop", "no stop strings with beam search (stop_token_ids work)", num(int64_t(stop.size())) + " strings");
  if ((beam_search() || contrastive_search()) && logprobs > 0)
    return bad("logprobs", "0 with beam or contrastive search", num(int64_t{logprobs}));
  return {};
}

}  // namespace serval
