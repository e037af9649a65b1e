// Runner: executes one SchedulerOutput — block copies and swaps, then one
// batched forward over the scheduled sequences — and returns the logits of the
// sequences that need sampling. It never touches queues or the allocator
// (DESIGN.md): everything it needs is in the SchedulerOutput.
//
// Speculative decoding. The verifying forward feeds each seq's chunk followed
// by its drafted tokens and returns logits at the chunk's last token and at
// every draft. With a draft model, the runner also owns the draft side: the
// draft model keeps its K/V in a pool of its own (`draft_kv`, sized for the
// draft's geometry) indexed by the SAME block ids as the target's, so the
// scheduler's block tables, copies, swaps, truncation and prefix cache serve
// both. The draft's K/V may lag behind the target's (it only runs for seqs
// that draft); the scheduler tracks how far and hands out the catch-up tokens,
// which the first draft round computes before the chunk. (K/V at a position
// depends only on the tokens up to it, so catching up inside a block shared
// with another seq rewrites the same values.)
//
// Engine loop thread only.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "kv_cache/kv_storage.h"
#include "engine/tensor_parallel_link.h"
#include "model/batch_forward.h"
#include "scheduler/scheduler_output.h"

namespace serval {

class Runner {
 public:
  // draft / draft_kv: both null, or a draft model and its pool with the
  // target pool's block count, host block count and block size.
  Runner(const Model& model, KvStorage& kv, ThreadPool* pool, const Model* draft = nullptr,
         KvStorage* draft_kv = nullptr);

  // Swaps and copies of `out` (in the order kv_cache_manager.h requires), in
  // both pools. Once per step, before draft() and execute().
  void apply_block_moves(const SchedulerOutput& out);

  // Chooses draft token j (0-based) of out.seqs[seq_index] from the draft's logits.
  using DraftPick = std::function<TokenId(size_t seq_index, int32_t j, std::span<const float> logits)>;
  // Draft model only: (*drafts)[i] = out.seqs[i].n_draft tokens proposed by
  // running the draft autoregressively (one batched draft forward per round,
  // all drafting seqs together; round 0 also computes each seq's
  // draft_catch_up), empty for seqs without draft slots.
  Status draft(const SchedulerOutput& out, const DraftPick& pick, std::vector<std::vector<TokenId>>* drafts);

  // The forward pass: each seq's chunk followed by drafts[i] (at most its
  // n_draft tokens; `drafts` empty = no drafts anywhere). logits: [n_rows,
  // n_vocab], for each seq with needs_logits 1 + drafts[i].size() rows (its
  // chunk's last token, then each draft), for each seq with all_logits
  // n_tokens rows (every token of its chunk), in order.
  // hidden (optional): the final-normed hidden states of every token of the
  // seqs with want_hidden, in order ([n, dim]).
  // loras: empty, or per seq of `out` its LoRA adapter (null: the base).
  Status execute(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                 std::vector<float>* logits, std::vector<float>* hidden = nullptr,
                 std::span<const LoraAdapter* const> loras = {});

  bool has_draft_model() const { return draft_forward_ != nullptr; }

  // Tensor parallelism (the model is rank 0's shard): every step's block
  // copies and batch go to the other ranks first, and the forward meets them
  // in the link's all-gathers. Set once, before the first step.
  void set_tensor_parallel(TensorParallelLink* link) {
    link_ = link;
    forward_.set_collective(link);
  }
  // Mixture-of-experts models: tokens routed to each expert so far (BatchForward::expert_tokens).
  const std::vector<int64_t>& expert_tokens() const { return forward_.expert_tokens(); }
  // The target forward's MoE layer passes and expert weight sets read (BatchForward::expert_reads).
  int64_t moe_layer_passes() const { return forward_.moe_layer_passes(); }
  int64_t expert_reads() const { return forward_.expert_reads(); }

 private:
  KvStorage& kv_;
  KvStorage* draft_kv_;
  BatchForward forward_;
  std::unique_ptr<BatchForward> draft_forward_;
  Batch batch_;
  std::vector<float> draft_logits_;
  TensorParallelLink* link_ = nullptr;
  Status link_error_;  // a failed send of block copies, reported by the next execute()
};

}  // namespace serval
