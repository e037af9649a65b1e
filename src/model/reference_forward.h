// The plain, obviously-correct F32 forward pass of every family's block recipe
// (model_config.h), one token at a time, over a contiguous F32 KV cache. It dequantizes
// weights on the fly (any supported tensor type), accumulates dot products in
// double, and stays in the tree for good as the reference that faster paths
// (SIMD kernels, batched engine, paged KV) are tested against.
//
// One instance = one sequence. Not thread-safe; uses the optional thread pool
// (owned by the caller) to split matrix rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/matmul_observer.h"
#include "model/model.h"

namespace serval {

class ReferenceForward {
 public:
  // n_ctx: positions the KV cache holds (1..n_ctx_train is typical; bounded by
  // the caller). pool may be null.
  ReferenceForward(const Model& model, int64_t n_ctx, ThreadPool* pool = nullptr);

  // Runs token `token` at position n_past() and appends its K/V; when logits is
  // non-empty (n_vocab floats) writes the next-token logits there.
  // Errors: token out of [0, n_vocab), context full.
  // When hidden is non-empty (dim floats), writes the final-normed hidden
  // state there (the input of the output projection).
  Status eval(int32_t token, std::span<float> logits, std::span<float> hidden = {});

  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Forgets positions >= n (rolls the cache back); n <= n_past().
  void truncate(int64_t n);

  // Calls `obs` with the input of every matrix-vector product from now on
  // (nullptr: none). The observer must outlive its use.
  void set_observer(const MatmulObserver* obs) { observer_ = obs; }

 private:
  void matvec(const Matrix& m, const float* x, float* y);

  const Model& model_;
  ThreadPool* pool_;
  const MatmulObserver* observer_ = nullptr;
  int64_t n_ctx_;
  int64_t n_past_ = 0;
  std::vector<float> k_cache_, v_cache_;  // [n_layers, n_ctx, kv_dim]
  // scratch
  std::vector<float> x_, xn_, q_, k_, v_, att_, attn_out_, proj_, gate_, up_, ffn_;
};

// The reference of EmbedForward (model/embed_forward.h): one input, pooled
// with `pooling` (Pooling::none: the model's), unnormalized; out_dim floats.
// Encoders run the encoder layout token by token with double accumulation;
// decoders run ReferenceForward and pool its final-normed hidden states.
Expected<std::vector<float>> reference_embed(const Model& model, std::span<const int32_t> tokens,
                                             Pooling pooling = Pooling::none, ThreadPool* pool = nullptr);

}  // namespace serval
