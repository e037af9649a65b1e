// The embedding forward pass: many whole inputs per call, each pooled into
// one vector (model_config.h Pooling), no KV cache kept between calls.
//   - Encoders (bert, nomic-bert) run the encoder layout (EncoderRecipe):
//     attention over the whole input, batched matrix products over every
//     token of every input at once (each weight matrix read once per call).
//   - Decoders (a llama/qwen3/... file with a pooling type, e.g.
//     Qwen3-Embedding, or one the caller pools) run BatchForward over a
//     scratch KV pool sized for the call (of the caller's KV type; freed on
//     return: at most one call's tokens of KV, outside the engine's pool) and
//     pool its final-normed hidden states (causal attention, as trained).
// Rank pooling ends in the classification head and yields one score.
//
// Batch invariance: an input's output depends only on its own tokens, never
// on the other inputs of the call (the kernels' guarantee, kernels/matmul.h;
// attention and pooling are per input), so it is bit-identical alone or batched.
//
// One instance per caller thread (engine loop); not thread-safe. The model
// must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "serval/types.h"
#include "tensor/kv_type.h"

namespace serval {

class EmbedForward {
 public:
  // pooling: Pooling::none takes the model's own (config().pooling);
  // scratch_kv: the KV type of decoders' scratch pool.
  EmbedForward(const Model& model, ThreadPool* pool, Pooling pooling = Pooling::none,
               KvType scratch_kv = KvType::f16);

  // The pooling this instance applies, and the floats one input yields
  // (dim; 1 for rank: the score).
  Pooling pooling() const { return pooling_; }
  int64_t out_dim() const;

  // out becomes [inputs.size(), out_dim()], unnormalized. Errors: no pooling
  // (a decoder without one), an empty input, a token out of range, an input
  // longer than the model's positions (encoders with absolute positions:
  // n_ctx_train).
  Status embed(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out);

 private:
  Status encode(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out);
  Status decode(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out);
  // Pools rows [n_tokens_i, dim] of each input (x, consecutive) into out.
  void pool_rows(std::span<const std::vector<TokenId>> inputs, const float* x, std::vector<float>* out);

  const Model& model_;
  ThreadPool* pool_;
  Pooling pooling_;
  KvType scratch_kv_;
  std::vector<float> x_, q_, k_, v_, attn_, proj_, up_, gate_;  // scratch, [n_tokens, ...]
};

}  // namespace serval
