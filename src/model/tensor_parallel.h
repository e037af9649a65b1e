// Tensor parallelism (Megatron-style) for the batched forward. Rank r of N
// holds, in every layer, query heads [r*H/N, (r+1)*H/N) and KV heads
// [r*KV/N, (r+1)*KV/N) (its rows of Q/K/V and its KV cache, 1/N of the
// whole), the matching columns of the attention output projection, and FFN
// columns [r*F/N, (r+1)*F/N) (rows of gate/up, columns of down). The output of
// each projection that mixes heads or FFN columns is then a partial sum: one
// all-reduce after the attention output and one after the FFN down projection
// (Collective) make every rank's hidden state whole again. Biases of those
// two outputs are added by rank 0 only. Norms, embeddings and the output head
// are replicated.
//
// A shard is a Model whose config counts its own heads and FFN columns
// (n_heads, n_kv_heads, ffn_dim) and whose weights are its slices: row slices
// are views of the mapping, column slices are copied (block-aligned: a column
// split must fall on a quantization block boundary, so the 8-bit activation
// blocks the kernels build are the same as unsplit). Only the batched forward
// runs shards; the reference forward needs the whole model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

// The all-reduce the shards' forwards meet in (MPI across processes, threads
// in one process for tests).
class Collective {
 public:
  virtual ~Collective() = default;
  // Replaces data[0, n) on every rank by the sum over ranks, added in rank
  // order (0 + 1 + ... + N-1): deterministic, and the same bits on every
  // rank. An error (a rank gone, a timeout) fails the forward.
  virtual Status allreduce_sum(float* data, size_t n) = 0;
};

// Why this model cannot be split `size` ways; empty when it can.
std::string tensor_parallel_refusal(const ModelConfig& c, const ModelWeights& w, int32_t size);

// Cuts c and w down to tp.rank's shard (tp.size > 1; tensor_parallel_refusal
// must be empty).
Status shard_model(ModelConfig& c, ModelWeights& w, TensorParallel tp);

}  // namespace serval
