// Logit processors: the stages of the sampling chain as free functions over
// a candidate array.
//
// Order used by Sampler (llama.cpp / vLLM):
//   sanitize_logits -> apply_penalties -> apply_logit_bias   (dense float logits, index == token id)
//   -> temperature -> top-k -> apply_typical -> apply_top_p
//   -> apply_min_p -> normalize                              (on the shrinking candidate set)
// Temperature keeps the order and subtracts the same maximum whether it runs
// before or after top-k, so the Sampler runs top-k (select_top_k, straight
// from the dense logits) first and scales only the survivors: the same
// floats, without a pass over the whole vocabulary.
//
// Conventions shared by every function here:
//  * The total order of candidates is "better first": higher logit, then the
//    lower token id. Every tie is broken by it, so results never depend on
//    the standard library's sort algorithm.
//  * Truncating stages (top-k, typical, top-p, min-p) shrink the set and
//    always keep at least one candidate; they compute probabilities over the
//    candidates present when they run (so top-p after top-k uses the
//    renormalised top-k mass, as llama.cpp and vLLM do).
//  * No stage allocates once the set's vectors have reached their capacity.
// Stateless functions; a CandidateSet is owned by one caller (the Sampler)
// and is not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "serval/sampling_params.h"

namespace serval {

struct Candidate {
  TokenId token = 0;
  float logit = 0.0f;  // processed logit (after temperature: up to an additive constant)
  float prob = 0.0f;   // valid after softmax()/normalize(); stale after other stages
};

// The working set of candidates. Processors shrink `items` (resize never
// frees capacity) and may reorder it.
struct CandidateSet {
  std::vector<Candidate> items;
  // true when items are in "better first" order (logit desc, token asc).
  bool sorted = false;
  // Scratch reused by apply_typical / apply_top_p; meaningless between calls.
  std::vector<float> scratch_key;       // [size] per-candidate ranking key
  std::vector<uint32_t> scratch_index;  // [size] per-candidate histogram bucket
  std::vector<std::pair<float, Candidate>> scratch_border;  // candidates of the boundary bucket

  // items[i] = {i, sanitize_logit(logits[i]), 0}; sorted = false.
  void reset_dense(std::span<const float> logits);
};

// NaN -> -inf (never chosen), +inf -> the largest float (so max-subtraction
// stays finite). Everything else unchanged.
float sanitize_logit(float x);
// out[i] = sanitize_logit(in[i]); same sizes.
void sanitize_logits(std::span<const float> in, std::span<float> out);

// "better first" comparison: a.logit > b.logit, ties by lower token id.
inline bool candidate_better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// Repetition (CTRL/llama.cpp), frequency and presence penalties (OpenAI) for
// every distinct token t in `window` with c = its count there:
//   logit = logit > 0 ? logit / repetition : logit * repetition
//   logit -= c * frequency + presence
// `logits` is dense (index == token id); window ids must be in
// [0, logits.size()). `counts` is scratch of logits.size() zeros; it is left
// all zeros again. Cost O(window.size()).
void apply_penalties(std::span<float> logits, std::span<const TokenId> window, float repetition,
                     float frequency, float presence, std::span<int32_t> counts);

// Adds each bias to its token's logit; a bias <= -100 sets it to -inf (ban).
// `logits` dense; bias tokens in range (validated upstream).
void apply_logit_bias(std::span<float> logits, std::span<const LogitBias> bias);

// The index of the largest value, the lowest index among equals. Non-empty.
TokenId argmax(std::span<const float> logits);

// The best candidate: largest logit, lowest token id among equals. Non-empty input.
const Candidate& best_candidate(std::span<const Candidate> items);

// Top-k straight from dense logits: set.items = the min(k, n) best
// candidates (ties: lower token id), sorted; k >= 1. One pass keeping a heap
// of k: O(n + k log k log(n/k)) for typical inputs; meant for small k.
void select_top_k(std::span<const float> logits, int32_t k, CandidateSet& set);

// logit = (logit - max) / t, for t > 0. Keeps the order (and `sorted`).
void apply_temperature(CandidateSet& set, float t);

// Keeps the k best candidates (ties at the boundary: lower token id wins),
// sorted. k <= 0 or k >= size: no-op. O(n + k log k).
void apply_top_k(CandidateSet& set, int32_t k);

// Locally typical sampling (Meister et al. 2022): with p_i the softmax of the
// set and H its entropy, rank candidates by |-log p_i - H| (ties: lower token
// id) and keep the smallest prefix of that ranking whose mass is >= p. The
// kept candidates stay in their previous relative order. p >= 1: no-op.
// O(n) plus a sort of the candidates near the cut (see apply_top_p).
void apply_typical(CandidateSet& set, float p);

// Nucleus sampling: keep the smallest set of best candidates whose mass is
// >= p, in their previous relative order. p >= 1: no-op. A sorted set is
// scanned; an unsorted one (the whole vocabulary) is not sorted: the mass is
// histogrammed by logit gap to the max (32 buckets per nat) to find the
// bucket where the cut falls, and only that bucket's candidates are sorted.
void apply_top_p(CandidateSet& set, float p);

// Keeps candidates with p_i >= p * p_max, i.e. logit_i - max >= log(p).
// p <= 0: no-op. Keeps the order.
void apply_min_p(CandidateSet& set, float p);

// prob = softmax(logit) over the set (float exp, double sum). If no logit is
// finite, every candidate gets 1/size.
void softmax(CandidateSet& set);

// softmax(), then drops candidates whose probability is exactly 0, keeping
// the order: the set is then the final distribution.
void normalize(CandidateSet& set);

}  // namespace serval
