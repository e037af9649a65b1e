// Capacity planning over the queueing model (plan/queue_model.h): for a
// workload and latency objectives, the engine settings and the number of
// replicas that meet them, the headroom left, and — where nothing does —
// which resource binds.
//
// Pure functions (each runs many seeded simulations): thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/profile.h"
#include "plan/queue_model.h"

namespace serval::plan {

struct Slo {
  double ttft_p99_s = 0;  // 0: no objective
  double itl_p99_s = 0;
};

struct PlanOptions {
  int64_t kv_memory_bytes = 0;  // 0: sized by the planner (what max_seqs requests need)
  int32_t max_replicas = 64;
  int64_t max_model_len = 4096;
  // The settings searched (serve's defaults are always among them).
  std::vector<int32_t> max_seqs_grid{4, 8, 16, 32, 64, 128};
  std::vector<int32_t> batch_tokens_grid{32, 64, 128, 256, 512, 1024, 2048};
};

struct Recommendation {
  bool feasible = false;
  int32_t replicas = 0;
  EngineShape shape;            // the settings of each replica
  int64_t kv_memory_bytes = 0;  // shape.kv_blocks in bytes
  Prediction per_replica;       // at rate / replicas
  double max_rate_per_replica = 0;  // the highest rate one replica sustains within the SLOs
  double headroom = 0;              // max_rate_per_replica / (rate / replicas) - 1
  std::string binding;  // what limits a replica: "memory bandwidth", "compute", "KV memory", "max-seqs"
  std::string why;      // one sentence, with figures
};

// KV blocks that `bytes` hold for the profile's model.
int64_t kv_blocks_for(const Profile& p, int64_t bytes, int32_t block_size);

// Does a prediction meet the objectives (and is it not saturated)?
bool meets(const Prediction& pr, const Slo& slo);

// Searches replicas 1..max_replicas and the settings grid; the first replica
// count with a setting that meets the SLOs wins, and among its settings the
// one with the most margin. Not feasible: `binding` and `why` say what stops it.
Recommendation recommend(const Profile& p, const Workload& w, const Slo& slo, const PlanOptions& opt);

// What limits one replica at shape under w (used for the report): KV memory
// when the pool ran full, max-seqs when the batch sat at the cap, else the
// decode step's bound from the roofline (memory bandwidth or compute).
std::string binding_resource(const Profile& p, const EngineShape& shape, const Prediction& at_capacity,
                             std::string* why);

}  // namespace serval::plan
