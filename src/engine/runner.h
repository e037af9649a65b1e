// Runner: executes one SchedulerOutput — block copies and swaps, then one
// batched forward over the scheduled sequences — and returns the logits of the
// sequences that need sampling. It never touches queues or the allocator
// (DESIGN.md): everything it needs is in the SchedulerOutput.
//
// Engine loop thread only.
#pragma once

#include <vector>

#include "common/status.h"
#include "kv_cache/kv_storage.h"
#include "model/batch_forward.h"
#include "scheduler/scheduler_output.h"

namespace serval {

class Runner {
 public:
  Runner(const Model& model, KvStorage& kv, ThreadPool* pool) : kv_(kv), forward_(model, kv, pool) {}

  // logits: [n_outputs, n_vocab], one row per ScheduledSeq with needs_logits, in order.
  Status execute(const SchedulerOutput& out, std::vector<float>* logits);

 private:
  KvStorage& kv_;
  BatchForward forward_;
  Batch batch_;
};

}  // namespace serval
