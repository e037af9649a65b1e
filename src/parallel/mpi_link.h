// Tensor parallelism over MPI (Open MPI, Debian's libopenmpi-dev): one process
// per rank, `mpirun -np N serval run|serve --tp N ...`. Rank 0 runs the engine
// (server, scheduler, sampler) on its shard and broadcasts each step's work
// (TensorParallelLink); ranks 1..N-1 load their shards and run serve_steps()
// until rank 0 says stop. The shards' forwards meet in all-gathers
// (model/tensor_parallel.h): every rank ends with the same bits, which are the
// whole model's.
//
// A rank that dies or stalls never hangs the others: errors return (not
// abort), and every wait inside a step has a deadline, after which the rank
// reports which exchange it waited for and fails (rank 0's engine then fails
// its requests and the command exits non-zero). Only the idle wait of ranks
// 1..N-1 for rank 0's next step has none: a server may be idle for days.
//
// Threads: MPI is initialized MPI_THREAD_SERIALIZED; on rank 0 only the engine
// loop thread uses the link between send_pool() and send_stop().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "engine/tensor_parallel_link.h"
#include "model/model.h"

namespace serval::parallel {

class MpiLink final : public TensorParallelLink {
 public:
  // Initializes MPI; the world must have exactly `size` ranks. timeout_s
  // bounds every wait inside a step.
  static Expected<std::unique_ptr<MpiLink>> join(int32_t size, double timeout_s = 60.0);
  ~MpiLink() override;  // rank 0 sends stop if it has not; MPI_Finalize

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  TensorParallel shard() const { return {rank_, size_}; }

  Status allgather(const float* in, size_t n, float* out) override;
  Status send_pool(int32_t n_blocks, int32_t block_size, KvType type) override;
  Status send_copies(std::span<const BlockCopy> copies) override;
  Status send_batch(const Batch& batch) override;
  // Rank 0, once at the end: the other ranks leave serve_steps().
  Status send_stop();

  // Ranks 1..N-1: runs `shard` on every step rank 0 sends, until stop.
  Status serve_steps(const Model& shard, ThreadPool* pool);

  // Bytes of the step broadcasts, and bytes this rank received in all-gathers
  // (the other ranks' slices: (N - 1) * n floats per call).
  uint64_t bytes_broadcast() const { return bytes_bcast_; }
  uint64_t bytes_gathered() const { return bytes_gather_; }

 private:
  MpiLink(int32_t rank, int32_t size, double timeout_s) : rank_(rank), size_(size), timeout_s_(timeout_s) {}
  // Rank 0 sends (type, payload); the others receive into them.
  Status broadcast(int64_t* type, std::vector<uint8_t>* payload, bool idle);
  Status wait(void* request, bool idle, const char* what);

  int32_t rank_ = 0, size_ = 1;
  double timeout_s_ = 60.0;
  bool stopped_ = false;
  uint64_t bytes_bcast_ = 0, bytes_gather_ = 0;
};

}  // namespace serval::parallel
