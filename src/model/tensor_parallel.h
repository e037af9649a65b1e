// Tensor parallelism for the batched forward, exact: a shard computes every
// number the whole model computes in the same order, so its logits are the
// whole model's bits. Rank r of N holds, in every layer:
//   - query heads [r*H/N, (r+1)*H/N) and KV heads [r*KV/N, (r+1)*KV/N): its
//     rows of Q/K/V and its KV cache (1/N of the whole);
//   - FFN columns [r*F/N, (r+1)*F/N): its rows of gate and up;
//   - output rows [r*D/N, (r+1)*D/N) of the attention output projection and
//     of the FFN down projection (whole rows: every column).
// Each layer gathers (Collective::allgather) the heads' outputs before the
// output projection, the FFN activations before the down projection, and each
// of those two projections' row slices after it. A projection thus always sees
// the whole input vector and computes each output over all of its columns in
// the kernels' fixed order, as unsplit. Megatron's split of those two
// projections by columns (then an all-reduce of partial sums) would add the
// partial sums in another order; with activations quantized to 8 bits per
// block, a last-bit difference can round an element of the next layer's
// input to the neighbouring step and move log-probs by ~0.1.
// Norms, embeddings and the output head are replicated.
//
// A shard is a Model whose config counts its own heads and FFN columns
// (n_heads, n_kv_heads, ffn_dim) and whose weights are its slices, all row
// slices: views of the mapping, no copies, no block-alignment constraint. Only
// the batched forward runs shards; the reference forward needs the whole model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

// The all-gather the shards' forwards meet in (MPI across processes, threads
// in one process for tests).
class Collective {
 public:
  virtual ~Collective() = default;
  // out[r * n, (r + 1) * n) becomes rank r's in[0, n), on every rank (out
  // holds N * n floats; in may not overlap it). An error (a rank gone, a
  // timeout) fails the forward.
  virtual Status allgather(const float* in, size_t n, float* out) = 0;
};

// Why this model cannot be split `size` ways; empty when it can.
std::string tensor_parallel_refusal(const ModelConfig& c, const ModelWeights& w, int32_t size);

// Cuts c and w down to tp.rank's shard (tp.size > 1; tensor_parallel_refusal
// must be empty).
Status shard_model(ModelConfig& c, ModelWeights& w, TensorParallel tp);

}  // namespace serval
