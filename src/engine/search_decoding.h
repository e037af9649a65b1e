// Search decoding (docs/SEARCH_DECODING.md): beam search, diverse (group)
// beam search and contrastive search, as state machines over opaque sequence
// ids. The engine owns the sequences (they share KV blocks copy-on-write
// through Scheduler::fork) and executes each step's SearchPlan: `advance`
// appends a token to a running seq, `fork` starts a child sharing the
// parent's blocks with its own newest token, `finish` drops a seq. These
// classes never touch the scheduler, the KV cache or the model.
//
// A step runs once every live seq of the request has its next-token logits
// (the engine holds each seq's row until its siblings have theirs: seqs may
// be scheduled in different engine steps, or preempted and recomputed).
//
// Engine loop thread only; not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "kv_cache/kv_types.h"
#include "sampler/stop_conditions.h"
#include "serval/sampling_params.h"

namespace serval {

struct SearchPlan {
  struct Fork {
    SeqId parent = 0, child = 0;
    TokenId token = 0;
  };
  std::vector<std::pair<SeqId, TokenId>> advance;  // in order; before the forks
  std::vector<Fork> fork;                          // parent was advanced first (its newest token is not computed)
  std::vector<SeqId> finish;
};

// log_softmax(x) in double precision, written as floats; -inf stays -inf.
void log_softmax(std::span<const float> x, std::vector<float>* out);

// Logits rows held until every live seq of a request has one.
class HeldRows {
 public:
  void put(SeqId seq, std::span<const float> row);
  void drop(SeqId seq) { rows_.erase(seq); }
  bool has(SeqId seq) const { return rows_.count(seq) != 0; }
  std::span<const float> get(SeqId seq) const { return rows_.at(seq); }
  bool has_all(std::span<const SeqId> seqs) const;
  void clear() { rows_.clear(); }

 private:
  std::map<SeqId, std::vector<float>> rows_;
};

struct BeamHypothesis {
  std::vector<TokenId> tokens;  // generated tokens, the stop token included when finish == stop
  double sum_logprob = 0;       // with diverse beam search: including the diversity penalties
  double score = 0;             // sum_logprob / tokens.size()^length_penalty
  FinishReason finish = FinishReason::length;
};

struct BeamSearchConfig {
  int32_t width = 2;             // beams in all groups
  int32_t groups = 1;            // divides width
  double length_penalty = 1.0;
  EarlyStopping early_stopping = EarlyStopping::heuristic;
  double diversity_penalty = 0;  // Hamming diversity between groups
  int32_t max_new_tokens = 1;    // >= 1
};

// Hugging Face's (group) beam search, step by step. Each group of
// width/groups beams keeps the best 2 x its width candidates of a step
// (scores: beam sum + log-prob - diversity penalty; ties: lower beam, then
// lower token id first): a candidate the token-level stop says ends (EOS,
// stop_token_ids) becomes a finished hypothesis if it ranks within the
// group's width, the others continue until the group has its width of beams.
// A group's finished hypotheses keep its width best scores. A group is done
// per early_stopping, or at max_new_tokens (its running beams then finish
// with reason length); the search is done when all groups are.
class BeamSearch {
 public:
  struct Beam {
    SeqId seq = 0;
    std::vector<TokenId> tokens;
    double sum_logprob = 0;
  };
  // Log-probabilities over the vocabulary of a live seq's next token.
  using LogprobsFn = std::function<std::span<const float>(SeqId)>;
  // Token-level stop of a candidate (stop or none; length is handled here).
  using StopFn = std::function<FinishReason(TokenId token, int32_t n_generated)>;

  BeamSearch(BeamSearchConfig cfg, SeqId root);

  // The distinct seqs of the live beams (at first: the root).
  std::vector<SeqId> live_seqs() const;
  // One step over every live beam. New seq ids for forks come from new_seq.
  SearchPlan step(const LogprobsFn& logprobs, const StopFn& stop, const std::function<SeqId()>& new_seq);
  bool done() const;
  // The n best finished hypotheses of all groups, best first (at most n;
  // fewer when fewer finished).
  std::vector<BeamHypothesis> best(int32_t n) const;
  const std::vector<std::vector<Beam>>& groups() const { return beams_; }

 private:
  struct Hyps {
    std::vector<BeamHypothesis> items;
    double worst = 1e300;
    void add(BeamHypothesis h, int32_t capacity);
  };
  bool group_done(const Hyps& h, double best_sum, int32_t cur_len) const;

  BeamSearchConfig cfg_;
  int32_t group_width_;
  int32_t n_steps_ = 0;
  std::vector<std::vector<Beam>> beams_;  // [group][beam]
  std::vector<Hyps> hyps_;                // [group]
  std::vector<bool> done_;                // [group]
};

// Contrastive search (Su et al. 2022; Hugging Face penalty_alpha/top_k).
struct ContrastiveCandidate {
  TokenId token = 0;
  float prob = 0;
};
// The k most probable tokens of softmax(logits) with probability > 0, most
// probable first (ties: lower token id first).
std::vector<ContrastiveCandidate> contrastive_candidates(std::span<const float> logits, int32_t k);
// Index of the candidate maximising (1 - alpha) p - alpha max_j cos(h, ctx_j)
// (first on ties). cand_hidden: [n_cand, dim]; ctx_hidden: [n_ctx, dim].
size_t contrastive_pick(std::span<const ContrastiveCandidate> cands, std::span<const float> cand_hidden,
                        std::span<const float> ctx_hidden, int64_t dim, float alpha);

}  // namespace serval
