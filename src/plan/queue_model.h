// The capacity planner's queueing model of one serval replica: requests
// arrive (Poisson, or at given times), wait, are admitted into continuous
// batches and leave after their last token; every engine step carries the
// running decodes and prefill chunks together under a token budget, and its
// duration comes from the profile's step-time model (plan/profile.h).
//
// It is a discrete-event simulation of a simplified scheduler written for
// the planner, not the engine's Scheduler: sequences in order of importance
// (arrival order, aged like the engine's priorities: a sequence that waits
// with work to do gains importance every step);
// decodes first, then prefills under way, then waiting requests while their
// chunk fits the budget, the sequence cap and the free KV blocks (the first
// that does not fit stops admission; nothing is admitted in a step that
// preempted); a running sequence whose next chunk finds no free block
// preempts the newest running sequence not yet scheduled in the step
// (recompute: its blocks are freed and it re-prefills prompt + generated
// tokens when readmitted). No prefix-cache hits (distinct prompts), no
// speculation. tests/plan checks it against the engine's Scheduler driven by
// the same step times.
//
// Pure functions of their arguments (seeded): thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/profile.h"

namespace serval::plan {

// The engine settings the model varies (serve's flags of the same names).
struct EngineShape {
  int32_t max_batch_tokens = 512;
  int32_t max_seqs = 64;
  int64_t kv_blocks = 0;  // blocks in the KV pool (--kv-memory / (bytes per token * block size))
  int32_t block_size = 16;
  int64_t max_model_len = 4096;
  double aging_per_step = 0.01;  // the engine's priority aging (EngineConfig::aging_per_step)
};

struct LengthSample {
  int32_t prompt = 0;  // prompt tokens (>= 1)
  int32_t gen = 0;     // generated tokens (>= 1)
};

struct Workload {
  double rate = 1;                    // requests per second, Poisson arrivals
  std::vector<LengthSample> lengths;  // each request draws one uniformly (one entry: fixed lengths)
  int32_t n_requests = 1000;          // requests in the run (from an empty engine)
  uint64_t seed = 1;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};
Percentiles percentiles_of(std::vector<double> v);

struct Prediction {
  int64_t completed = 0;
  double duration_s = 0;        // first arrival to last completion
  double req_s = 0, gen_tok_s = 0, prompt_tok_s = 0;  // over duration_s
  Percentiles ttft, itl, e2e;   // seconds; ttft from arrival to the first token
  double busy_frac = 0;         // share of duration_s with a step running
  double mean_batch = 0;        // sequences per step, averaged over steps
  double mean_step_tokens = 0;  // tokens per step, averaged over steps
  double prefill_time_frac = 0;  // share of busy time spent on prompt tokens (each step split by its tokens)
  double kv_mean_frac = 0;      // KV blocks in use, time-weighted, of kv_blocks
  double kv_peak_frac = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t max_waiting = 0;      // requests waiting at once, at most
  // Arrivals outpace completions: over the last three quarters of the
  // arrival window fewer than 90 % as many requests finished as arrived.
  bool saturated = false;
};

// One-line errors naming the flag: rate <= 0, lengths out of range or past
// the context, a request that cannot fit the KV pool alone, shapes out of range.
Status validate_inputs(const EngineShape& shape, const Workload& w);

// Runs the model. Arguments must pass validate_inputs(); the profile must be fitted.
Prediction simulate(const Profile& p, const EngineShape& shape, const Workload& w);

// The arrival times (seconds from 0) and lengths the model and its test use
// for w: exponential gaps of mean 1/rate, lengths drawn uniformly; seeded.
struct Arrival {
  double t = 0;
  LengthSample len;
};
std::vector<Arrival> make_arrivals(const Workload& w);

}  // namespace serval::plan
