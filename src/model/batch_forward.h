// The batched forward pass over the paged KV cache: one call computes a mixed
// batch of prefill chunks and decode tokens of many sequences (variable
// lengths), writing each token's K/V into its sequence's blocks and reading
// attention context through the block tables (paged attention). Logits are
// produced only for the sequences that need sampling.
//
// Batch invariance: each token's result depends only on its own sequence's
// tokens, never on what else is in the batch (kernels/matmul.h), so a sequence
// gets bit-identical logits alone or batched, whole or in prefill chunks.
//
// One instance per engine (owned by the runner, engine loop thread); not
// thread-safe. The model and the storage must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/matmul.h"
#include "kv_cache/kv_storage.h"
#include "model/lora.h"
#include "model/matmul_observer.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "serval/types.h"

namespace serval {

struct BatchSeq {
  BatchSeq() = default;
  BatchSeq(int64_t start, int32_t n, std::span<const BlockId> table, bool logits = false, int32_t n_logit_rows = 1,
           bool hidden = false, std::span<const BlockId> swa_table = {})
      : start_pos(start), n_tokens(n), block_table(table), needs_logits(logits), n_logits(n_logit_rows),
        want_hidden(hidden), swa_block_table(swa_table) {}

  int64_t start_pos = 0;                 // position of the first token of this chunk
  int32_t n_tokens = 0;                  // tokens of this sequence in the batch (>= 1)
  std::span<const BlockId> block_table;  // covers positions [0, start_pos + n_tokens)
  bool needs_logits = false;             // produce logits for the chunk's last token
  int32_t n_logits = 1;                  // with needs_logits: for its last n_logits tokens (1..n_tokens),
                                         // e.g. a token and the drafts after it (speculative verify)
  bool want_hidden = false;              // the final-normed hidden state of each of its tokens (contrastive search)
  // With a storage that has a sliding-window pool: that pool's block table,
  // as long as block_table, -1 for blocks behind the window of start_pos
  // (never read); the layers in that pool read and write through it.
  std::span<const BlockId> swa_block_table;
  // A LoRA adapter (model/lora.h) for this sequence's tokens, or null (the
  // base model). It must be loaded against this model and outlive the call.
  const LoraAdapter* lora = nullptr;
};

struct Batch {
  std::vector<TokenId> tokens;  // all sequences' tokens, in seqs order
  std::vector<BatchSeq> seqs;
};

class BatchForward {
 public:
  BatchForward(const Model& model, KvStorage& kv, ThreadPool* pool);

  // Runs the batch; `logits` becomes [n_outputs, n_vocab] (n_logits rows per
  // sequence with needs_logits, in batch order). Errors: token out of range, block table too
  // short, position beyond max_positions.
  // `hidden` (optional) becomes [n_hidden, dim]: the final-normed hidden
  // state (the input of the output projection) of every token of each
  // sequence with want_hidden, in batch order.
  Status forward(const Batch& batch, std::vector<float>* logits, std::vector<float>* hidden = nullptr);

  // Calls `obs` with the input of every matrix product from now on (nullptr:
  // none, the default). The observer must outlive its use.
  void set_observer(const MatmulObserver* obs) { observer_ = obs; }

  // A tensor-parallel shard's all-gather (model/tensor_parallel.h), called
  // around the attention output and the FFN down projection of every layer.
  // Required when the model is a shard; must outlive its use.
  void set_collective(Collective* c) { collective_ = c; }

  // The kernel level the forward runs at ("ref", "avx2", ..., "avx512vnni").
  static const char* kernel_level();

  // Mixture-of-experts models: tokens routed to each expert since
  // construction, [n_layers * n_expert] (layer-major); empty otherwise.
  const std::vector<int64_t>& expert_tokens() const { return expert_tokens_; }
  // Mixture-of-experts models: MoE layer passes since construction, and the
  // expert weight sets they read (each expert routed at least one of a
  // pass's tokens is read once for all of them). reads / passes is the
  // experts a step reads per layer: n_expert_used for one token, more for a
  // batch (the bound on what batching saves).
  int64_t moe_layer_passes() const { return moe_layer_passes_; }
  int64_t expert_reads() const { return expert_reads_; }

 private:
  void ensure_capacity(int64_t n_tokens);
  // mm: one product (matrix, input, rows, output); mm_same_input: several of
  // one input; pool: the step's pool (null: the calling thread alone).
  template <class MM, class MMSame>
  void moe_ffn(const LayerWeights& l, int64_t n, const MM& mm, const MMSame& mm_same_input, ThreadPool* pool);

  const Model& model_;
  KvStorage& kv_;
  ThreadPool* pool_;
  const MatmulObserver* observer_ = nullptr;
  Collective* collective_ = nullptr;
  // scratch, [n_tokens, ...]
  std::vector<float> x_, xn_, q_, k_, v_, attn_, proj_, gate_, up_, hidden_, out_rows_;
  // Tensor parallel: this rank's output rows, the gathered whole, the collective's buffer.
  std::vector<float> tp_part_, tp_full_, tp_recv_;
  // Every rank's [n, w] slice, gathered into full[n, N * w] (rank r's at columns [r * w, (r + 1) * w)).
  Status tp_gather(const float* local, int64_t n, int64_t w, std::vector<float>& full);
  std::vector<float> cs_full_, cs_swa_;  // RoPE cos/sin per token, [n_tokens, rope_dim]
  // Mixture of experts: router logits [n, n_expert], each token's experts and
  // weights [n, n_used], where each expert's group starts in group order (the
  // (token, slot) rows by expert, then token), each row's place in it, each
  // group row's token, and the gathered inputs and the outputs, both
  // [n * n_used, dim] in group order.
  std::vector<float> router_, sel_w_, moe_in_, moe_out_;
  std::vector<int32_t> sel_;
  std::vector<int64_t> group_start_, group_pos_, group_tok_;
  std::vector<kernels::GroupedProduct> moe_products_;
  std::vector<int64_t> expert_tokens_;  // [n_layers, n_expert]: tokens routed, since construction
  int64_t moe_layer_passes_ = 0, expert_reads_ = 0;
};

}  // namespace serval
