// SchedulerOutput: the decision of one engine step, as a plain value that can
// be logged, diffed and unit-tested (DESIGN.md). The scheduler produces it;
// the runner (engine/) executes it and never looks at queues or the allocator.
#pragma once

#include <cstdint>
#include <vector>

#include "kv_cache/kv_types.h"
#include "serval/types.h"

namespace serval {

// One sequence's share of the step: compute tokens[start_pos, start_pos + n_tokens)
// of the sequence, whose K/V go to (and are read from) `block_table`.
struct ScheduledSeq {
  SeqId seq = 0;
  int64_t start_pos = 0;              // == the sequence's num_computed_tokens before the step
  int32_t n_tokens = 0;               // >= 1
  std::vector<TokenId> tokens;        // the n_tokens token ids to feed
  std::vector<BlockId> block_table;   // covers positions [0, start_pos + n_tokens + n_draft)
  // The sliding-window pool's table (kv_cache_manager.h), as long as
  // block_table, -1 behind the window; empty without that pool.
  std::vector<BlockId> swa_block_table;
  bool needs_logits = false;          // the chunk reaches the end of the known tokens: sample after it
  // Speculative decoding: up to n_draft drafted tokens may follow the chunk
  // (positions start_pos + n_tokens ...), verified in the same forward with
  // logits at each of them. Only for a decode (n_tokens == 1, needs_logits).
  int32_t n_draft = 0;
  // Draft model (SchedulerConfig::track_draft_kv), with n_draft > 0: the
  // draft's K/V covers positions [0, draft_start_pos) only; it first computes
  // draft_catch_up, the tokens of [draft_start_pos, start_pos), then the chunk.
  int64_t draft_start_pos = 0;
  std::vector<TokenId> draft_catch_up;
  // Set by the engine, not the scheduler: return the final-normed hidden
  // state of each of the chunk's tokens too (contrastive search).
  bool want_hidden = false;
  // Set by the engine: logits for every token of the chunk, not only after
  // its last (prompt log-probs). No drafts then; with needs_logits the last
  // of its n_tokens rows is the one sampled from.
  bool all_logits = false;
};

struct SchedulerOutput {
  uint64_t step = 0;
  std::vector<ScheduledSeq> seqs;     // decodes first, then prefill chunks
  // Block moves, all before the forward pass. swap_out first: a block released
  // by preemption may be handed out again in the same step. Then copies (in
  // list order) and swap_in, in either order: swap_in only happens in steps
  // without preemption, so no swap_in block is a copy's source or target.
  // Whenever preempted (hence swap_out) is non-empty, seqs is non-empty too.
  std::vector<BlockCopy> copies;      // copy-on-write
  std::vector<BlockSwap> swap_out;    // device -> host
  std::vector<BlockSwap> swap_in;     // host -> device
  std::vector<SeqId> preempted;       // sequences preempted in this step (not in `seqs`)
  int32_t n_tokens = 0;               // sum of seqs[i].n_tokens + n_draft (<= the token budget)
};

}  // namespace serval
