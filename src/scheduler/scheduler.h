// Scheduler: continuous batching over a paged KV cache (vLLM v1 style).
//
// No prefill/decode modes (DESIGN.md principle 2): a sequence knows its tokens
// (prompt + generated) and num_computed, the count of leading tokens whose K/V
// are in the cache; each step the scheduler hands out part of the gap under a
// token budget (max_batch_tokens) and a sequence cap (max_seqs). A decode is a
// gap of 1 (the newest sampled token); a prompt is a larger gap, split across
// steps (chunked prefill); a prefix-cache hit simply starts num_computed past 0.
//
// One step, schedule():
//   1. running seqs with a gap of 1 (decodes), most important first;
//   2. running seqs with a larger gap (prefills under way), most important first,
//      each a chunk of min(gap, budget left);
//   3. unless this step preempted anything: waiting and swapped-out seqs, most
//      important first (swapped ones are swapped in), each a chunk of
//      min(gap, budget left), while they fit; the first that does not fit in
//      the KV pool stops admission (no overtaking).
// A running seq that cannot get the blocks for its chunk preempts the least
// important running seq not yet scheduled in this step (possibly itself):
// recompute (its blocks are freed, num_computed restarts at its prefix-cache
// hit; generated tokens are kept and re-prefilled) or, with Preemption::swap
// and host blocks free, swap (its blocks go to host memory and come back later
// with num_computed intact). Importance: lower effective priority value first,
// then earlier arrival (add()/fork() order). Decisions depend only on the calls
// made, so equal call sequences give equal SchedulerOutputs.
//
// Ownership and threads: single-threaded; the engine loop thread owns the
// Scheduler and the KvCacheManager it is given (which must outlive it) and
// makes every call. The SchedulerOutput is a plain value for the runner; apply
// its swap_out, copies (in order), swap_in lists in that order before the
// forward pass (kv_cache_manager.h).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kv_cache/kv_cache_manager.h"
#include "kv_cache/kv_types.h"
#include "scheduler/scheduler_output.h"
#include "serval/types.h"

namespace serval {

struct SchedulerConfig {
  int32_t max_batch_tokens = 2048;  // token budget of one step
  int32_t max_seqs = 64;            // at most this many seqs in one step and running at once
  int64_t max_model_len = 2048;     // bound on a request's max_total_tokens
  // Off: a waiting seq is only admitted when its whole gap fits in the budget
  // left (requests whose max_total_tokens - 1 exceeds max_batch_tokens are
  // then rejected by add(), as they could not be recomputed after preemption).
  bool enable_chunked_prefill = true;
  enum class Preemption { recompute, swap } preemption = Preemption::recompute;
  // Aging: every step in which a seq has tokens to compute but gets none
  // (waiting, swapped out, or running but left out by the budget or the seq
  // cap) lowers its effective priority value by aging_per_step; the steps
  // count over its whole life, across preemptions. Effective priority =
  // priority - aging_per_step * steps_waited orders admission, the running
  // seqs' claim on the budget, and the choice of preemption victims, so with
  // aging_per_step > 0 every request eventually outranks any newcomer and
  // nothing starves. 0 = strict priority (FCFS within a priority).
  double aging_per_step = 0.0;
  // Background work (batch jobs): seqs whose priority is >= background_priority
  // are scheduled only after every foreground seq (steps 1-3 run for the
  // foreground first, then for the background with the budget left), get at
  // most background_prefill_tokens prompt tokens of a step all together (0:
  // no cap of their own; their decodes are not capped), and get none in a
  // step in which a foreground seq prefills (a new request's first chunk
  // then runs without them). A foreground seq that cannot be admitted (no KV
  // blocks) does not hold them back, so the blocks they hold are freed as
  // they finish. INT32_MAX: off (one pass, as above).
  int32_t background_priority = INT32_MAX;
  int32_t background_prefill_tokens = 0;
  // Speculative decoding (0: off). A running decode of a seq added with
  // speculate gets n_draft = k slots for drafted tokens, which count against
  // the budget and get KV blocks; k adapts per seq to its running acceptance:
  // k = clamp(ceil(mean accepted drafts per step) + 1, max(1, draft_min),
  // draft_max), starting at draft_max, also capped by the budget left and by
  // max_total_tokens. A seq whose blocks for k drafts are not free decodes
  // without drafts rather than preempting anyone. With draft_min == 0, a seq
  // whose running mean falls below kPauseBelowAccepted accepted drafts per
  // verification stops drafting (k = 0) and probes again with a draft after
  // kProbeEvery decodes without one: drafts that are mostly rejected cost
  // more than they save.
  int32_t draft_max = 0;
  int32_t draft_min = 0;
  // A draft model keeps K/V under the same block ids: track per seq how far
  // it has computed and hand out the catch-up with each draft slot grant, so
  // the draft only runs for seqs that draft (ScheduledSeq::draft_catch_up).
  bool track_draft_kv = false;
};

struct SeqRequest {
  SeqId seq = 0;
  std::vector<TokenId> prompt;
  int32_t priority = 0;           // lower value = more important (as in vLLM)
  int64_t max_total_tokens = 0;   // prompt + max new tokens; > prompt.size(), <= max_model_len
  PrefixKey prefix_key;
  bool speculate = true;          // draft slots when SchedulerConfig::draft_max > 0
  // false: preempted by recompute even under Preemption::swap (search
  // decoding holds seqs whose tokens are all computed; a swapped-out one
  // would have no gap to be swapped back in for). Forks inherit it.
  bool swappable = true;
  // false: never starts from a prefix-cache hit (admission and recompute
  // compute every position from 0; its full blocks still enter the cache).
  // Prompt log-probs need the logits of every prompt position.
  bool prefix_hits = true;
  // > 0: prefill chunks of this seq are at most this many tokens (a seq that
  // wants logits for every position bounds the step's logits buffer).
  int32_t max_chunk = 0;
};

// What the engine did with one seq's logits in a step: `tokens` = the accepted
// drafted tokens followed by the one sampled token (so tokens.size() - 1 of the
// n_drafted drafts were accepted). Without drafts: just the sampled token.
struct SeqAdvance {
  SeqId seq = 0;
  std::vector<TokenId> tokens;
  int32_t n_drafted = 0;  // <= the ScheduledSeq's n_draft
};

class Scheduler {
 public:
  enum class SeqState { waiting, running, swapped };

  static constexpr int32_t kMaxDraft = 64;  // bound on draft_max
  static constexpr double kPauseBelowAccepted = 0.3;
  static constexpr int32_t kProbeEvery = 8;
  static Status validate(const SchedulerConfig& cfg);
  // cfg must be valid (asserted); kv is not owned.
  Scheduler(SchedulerConfig cfg, KvCacheManager* kv);

  // Validates and queues a request: invalid_argument for a duplicate seq id, an
  // empty prompt, max_total_tokens out of (prompt.size(), max_model_len], more
  // KV blocks than the whole pool, or (chunked prefill off) more than
  // max_batch_tokens tokens to prefill. Anything accepted can run alone.
  Status add(SeqRequest r);

  // n > 1 samples: after update() appended the parent's first sampled token,
  // child starts running with the parent's tokens, num_computed and blocks
  // (shared, copy-on-write). The second form replaces the child's newest token
  // (not yet computed) with its own sample. Parent must be running.
  void fork(SeqId parent, SeqId child);
  void fork(SeqId parent, SeqId child, TokenId last_token);
  // Replaces seq's newest token, which must not be computed yet (num_computed
  // == tokens.size() - 1): a forked child's own first sample.
  void set_last_token(SeqId seq, TokenId token);

  SchedulerOutput schedule();

  // Preempts a running seq by recompute outside schedule(): its blocks are
  // freed and it waits to be recomputed. The engine's way out when every
  // running seq of search decoding waits for a sibling that cannot be
  // admitted (nothing else would ever free their blocks).
  void requeue(SeqId seq);

  // After the runner executed `out`: each scheduled seq's num_computed
  // advances by its n_tokens and its newly full blocks enter the prefix cache;
  // then each {seq, token} in `sampled` (seqs whose chunk had needs_logits) is
  // appended to that seq's tokens. Seqs finished since schedule() are skipped.
  void update(const SchedulerOutput& out, std::span<const std::pair<SeqId, TokenId>> sampled);
  // The general form: each advance's tokens are appended; its accepted drafts
  // already have their K/V (written by the verifying forward), so num_computed
  // also advances past them, and the blocks past num_computed, which hold only
  // rejected drafts, are released (rollback). Only blocks wholly below
  // num_computed ever enter the prefix cache.
  void update(const SchedulerOutput& out, std::span<const SeqAdvance> advances);

  // Stop, length or cancel, in any state: forgets the seq and frees its blocks
  // (device or host). A seq whose tokens reached max_total_tokens is never
  // scheduled again; the engine finishes it (finish reason: length).
  void finish(SeqId seq);

  bool has_unfinished() const { return !seqs_.empty(); }
  size_t n_waiting() const { return waiting_.size(); }  // incl. preempted by recompute
  size_t n_running() const { return running_.size(); }
  size_t n_swapped() const { return swapped_.size(); }
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  SeqState state(SeqId seq) const;
  const std::vector<TokenId>& tokens(SeqId seq) const;
  int64_t num_computed(SeqId seq) const;
  bool length_reached(SeqId seq) const;  // tokens.size() >= max_total_tokens
  // Prompt tokens served by the prefix cache at the seq's first admission (a
  // forked child inherits its parent's count); 0 for an unknown seq.
  int64_t num_cached_prompt_tokens(SeqId seq) const;
  int32_t draft_len(SeqId seq) const;  // the k its next decode asks for (0: no speculation)
  int64_t n_preemptions() const { return n_preemptions_; }
  uint64_t n_steps() const { return step_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Seq {
    SeqId id = 0;
    std::vector<TokenId> tokens;  // prompt + generated
    int64_t num_computed = 0;
    int32_t priority = 0;
    int64_t max_total_tokens = 0;
    PrefixKey key;
    int64_t cached_prompt_tokens = -1;  // -1 until first admitted
    uint64_t arrival = 0;       // add()/fork() order
    int64_t steps_waited = 0;   // steps with work to do but none scheduled, for aging
    SeqState state = SeqState::waiting;
    uint64_t scheduled_step = UINT64_MAX;  // the step it was last scheduled in
    bool speculate = false;
    bool swappable = true;
    bool prefix_hits = true;
    int64_t max_chunk = INT64_MAX;
    double accepted_mean = -1;  // running mean of accepted drafts per verify; < 0: none yet
    int32_t decodes_without_draft = 0;
    int64_t draft_computed = 0;  // track_draft_kv: positions the draft model has K/V for (<= num_computed)
    int64_t draft_last_fed = -1;  // this step: position of the chunk's last token when drafting
  };

  Seq& get(SeqId id);
  const Seq& get(SeqId id) const;
  // Steps 1-3 of schedule() for one class of seqs (0: all, 1: foreground,
  // 2: background) under *budget; true when it scheduled a prefill chunk.
  // At most prefill_cap prompt tokens (INT64_MAX: none).
  bool schedule_phase(SchedulerOutput* out, int64_t* budget, int which, int64_t prefill_cap);
  bool more_important(const Seq& a, const Seq& b) const;
  std::vector<SeqId> by_importance(const std::vector<SeqId>& ids) const;
  bool done(const Seq& s) const { return static_cast<int64_t>(s.tokens.size()) >= s.max_total_tokens; }
  void preempt(Seq& victim, SchedulerOutput* out);
  void to_waiting(Seq& v);  // recompute: blocks freed, num_computed 0, appended to waiting_
  void emit(Seq& s, int64_t n_tokens, SchedulerOutput* out, int32_t n_draft = 0);
  static void erase_id(std::vector<SeqId>* v, SeqId id);

  SchedulerConfig cfg_;
  KvCacheManager* kv_;
  std::unordered_map<SeqId, Seq> seqs_;  // lookup only, never iterated
  std::vector<SeqId> waiting_, running_, swapped_;  // insertion order
  uint64_t step_ = 0;
  uint64_t next_arrival_ = 0;
  int64_t n_preemptions_ = 0;
};

}  // namespace serval
