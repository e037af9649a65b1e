// Rank 0's side of a tensor-parallel group (model/tensor_parallel.h). The
// engine on rank 0 runs the server, scheduler and sampler and its own shard
// of the model; before each piece of work its runner hands the same work to
// the other ranks (their KV pool once, then each step's block copies and
// batch), which run their shards in lockstep and meet rank 0's forward in its
// all-gathers (the Collective this link also is). parallel/mpi_link.h
// implements it over MPI.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "kv_cache/kv_types.h"
#include "model/batch_forward.h"
#include "model/tensor_parallel.h"
#include "tensor/kv_type.h"

namespace serval {

class TensorParallelLink : public Collective {
 public:
  // Once, before the first step: the pool every rank builds (its own K/V
  // heads, these block counts).
  virtual Status send_pool(int32_t n_blocks, int32_t block_size, KvType type) = 0;
  // The step's block copies (copy-on-write of shared blocks), before its batch.
  virtual Status send_copies(std::span<const BlockCopy> copies) = 0;
  // The step's batch, just before rank 0 runs it.
  virtual Status send_batch(const Batch& batch) = 0;
};

}  // namespace serval
