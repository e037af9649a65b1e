// SamplingParams: how one request's tokens are chosen and when its generation
// stops. OpenAI / vLLM semantics and defaults.
//
// A plain value: built by the server from a request (or by the CLI from
// flags), checked once with validate() before the request is queued, then
// copied into the engine's per-sequence state and read by the sampler
// (src/sampler/). Thread-compatible: no shared state, no locking.
//
// Processing order of the logit processors (src/sampler/sampler.h has the
// details):
//   raw logits -> repetition/frequency/presence penalties -> logit_bias -> grammar mask
//   -> temperature -> top_k -> typical_p -> top_p -> min_p -> sample
// temperature == 0 is greedy: argmax of the penalised, biased logits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace serval {

// A token id. The tokenizer declares the same alias; identical alias
// declarations in one namespace are legal, so either header may come first.
using TokenId = int32_t;

// A compiled grammar (src/sampler/grammar/grammar.h); immutable and shared.
class CompiledGrammar;

// One logit_bias entry: `bias` is added to token `token`'s logit after the
// penalties. A bias of exactly -100 (the lower limit) bans the token (its
// logit becomes -inf), as OpenAI documents "-100 should result in a ban".
struct LogitBias {
  TokenId token = 0;
  float bias = 0.0f;
};

// Limits enforced by SamplingParams::validate (principle 11: untrusted input
// is bounded before it is used).
struct SamplingLimits {
  static constexpr float max_temperature = 100.0f;
  static constexpr float max_repetition_penalty = 10.0f;
  static constexpr float max_abs_frequency_penalty = 2.0f;  // OpenAI: [-2, 2]
  static constexpr float max_abs_presence_penalty = 2.0f;   // OpenAI: [-2, 2]
  static constexpr float max_abs_logit_bias = 100.0f;       // OpenAI: [-100, 100]
  static constexpr size_t max_logit_bias_entries = 1024;
  static constexpr size_t max_stop_strings = 16;
  static constexpr size_t max_stop_string_bytes = 256;      // each; empty strings rejected
  static constexpr size_t max_stop_token_ids = 256;
  static constexpr int32_t max_logprobs = 20;               // OpenAI top_logprobs: [0, 20]
  static constexpr int32_t max_beam_width = 16;             // beam search (EngineConfig may lower it)
  static constexpr float max_abs_length_penalty = 10.0f;
  static constexpr float max_diversity_penalty = 100.0f;
  static constexpr int32_t max_contrastive_top_k = 64;      // candidates run per contrastive step
};

// Hugging Face's `early_stopping` of beam search (docs/SEARCH_DECODING.md):
// heuristic = false (stop a beam group once no running beam can beat its worst
// finished hypothesis at the current length), yes = true (stop as soon as
// beam_width hypotheses are finished), never = "never" (the exact bound over
// the longest possible length; beam search then finds what an exhaustive
// search restricted to the beam finds).
enum class EarlyStopping { heuristic, yes, never };

// Temperatures below this are treated as 0 (greedy), as vLLM does: dividing
// by a tiny temperature only produces overflow, not a different choice.
inline constexpr float kGreedyTemperatureEpsilon = 1e-5f;

struct SamplingParams {
  // --- logit processors -----------------------------------------------------
  float temperature = 1.0f;         // [0, 100]; 0 (or < 1e-5) = greedy
  int32_t top_k = 0;                // >= -1; 0 or -1 = off; > n_vocab acts as off
  float top_p = 1.0f;               // (0, 1]; 1 = off. Keep the smallest most-likely set with mass >= top_p
  float min_p = 0.0f;               // [0, 1]; 0 = off. Drop tokens with p < min_p * p_max
  float typical_p = 1.0f;           // (0, 1]; 1 = off. Locally typical sampling
  float repetition_penalty = 1.0f;  // (0, 10]; 1 = off. CTRL/llama.cpp: logit > 0 ? logit / r : logit * r
  float frequency_penalty = 0.0f;   // [-2, 2]; subtracts count * f from each seen token's logit
  float presence_penalty = 0.0f;    // [-2, 2]; subtracts p from each seen token's logit
  int32_t penalty_last_n = 64;      // penalty window: last N tokens of history; -1 = all; 0 = penalties off
  std::vector<LogitBias> logit_bias;  // at most 1024 entries, distinct tokens in [0, n_vocab)

  // --- randomness -------------------------------------------------------------
  // Same seed -> same tokens on any machine for the same logits. Unset: a
  // random seed from the OS (the Sampler reports the one it drew).
  std::optional<uint64_t> seed;

  // --- stopping ---------------------------------------------------------------
  std::vector<std::string> stop;       // at most 16, each 1..256 bytes; output is truncated before the match
  std::vector<TokenId> stop_token_ids;  // at most 256, in [0, n_vocab); the stop token is not part of the text
  std::optional<int32_t> max_tokens;   // >= 1 when set; unset = until EOS / the context window is full
  bool ignore_eos = false;             // EOS does not end generation (stop_token_ids still do)

  // --- output -----------------------------------------------------------------
  // Number of top log-probabilities reported per generated token, [0, 20];
  // 0 = off. They are log_softmax of the raw model logits (before penalties,
  // bias, temperature and truncation), as OpenAI and vLLM report by default.
  int32_t logprobs = 0;

  // --- structured output ------------------------------------------------------
  // When set, every sampled token keeps the output a prefix of a sentence of
  // this grammar (disallowed tokens get -inf after logit_bias), and
  // end-of-generation is allowed only where the grammar may end. Each
  // sequence (each of the n samples) keeps its own matcher state. Built by
  // compile_gbnf / compile_json_schema / ... (src/sampler/grammar/grammar.h).
  std::shared_ptr<const CompiledGrammar> grammar;

  // --- search decoding (docs/SEARCH_DECODING.md) --------------------------------
  // beam_width >= 2: beam search (deterministic; temperature, top_p, top_k,
  // min_p, typical_p and the seed do not apply; penalties and logit_bias do).
  // Candidates are scored by the log-softmax of the processed logits, finished
  // hypotheses by sum_logprob / generated_len^length_penalty (Hugging Face).
  // num_beam_groups > 1 with diversity_penalty: diverse beam search (Hamming
  // diversity): group g's log-probs are lowered by diversity_penalty x the
  // number of times each token was chosen by groups < g in the same step.
  int32_t beam_width = 0;           // 0 or 1 = off; 2..16
  float length_penalty = 1.0f;      // [-10, 10]
  EarlyStopping early_stopping = EarlyStopping::heuristic;
  int32_t num_beam_groups = 1;      // >= 1, divides beam_width
  float diversity_penalty = 0.0f;   // [0, 100]; needs num_beam_groups > 1
  // penalty_alpha > 0 with top_k >= 2: contrastive search (Su et al. 2022):
  // among the top_k most probable tokens v pick argmax (1 - alpha) p(v) -
  // alpha max_j cos(h_v, h_j), h the model's final-normed hidden states of
  // the context. Deterministic; top_k <= 64.
  float penalty_alpha = 0.0f;       // [0, 1]

  bool beam_search() const { return beam_width >= 2; }
  bool contrastive_search() const { return penalty_alpha > 0.0f && top_k >= 2; }

  // Range-checks every field against the documented limits for a model with
  // n_vocab tokens. The message names the field and the expected vs actual
  // value, e.g. "top_p: expected a value in (0, 1], got 1.5". NaN is
  // rejected everywhere. score_only: max_tokens may be 0 (a request that
  // only scores its prompt: Request::prompt_logprobs).
  Status validate(int32_t n_vocab, bool score_only = false) const;
  // The search-decoding fields alone (part of validate).
  Status validate_search() const;
};

}  // namespace serval
