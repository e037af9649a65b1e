// The planner's queueing model (src/plan) against the engine's own Scheduler
// and KvCacheManager driven by a virtual clock: the same arrivals, the same
// step-time function (a synthetic profile), every scheduling decision taken
// by the real scheduler. The model must predict throughput and latency
// percentiles within 10 % (the bound) in light, near-saturation,
// overloaded, KV-starved and mixed-length workloads.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "kv_cache/kv_cache_manager.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/queue_model.h"
#include "scheduler/scheduler.h"

namespace serval::plan {
namespace {

// A 1B-class model on a small CPU: 20 ms per decode step at batch 1, matmul
// time growing with the tokens of a step, attention by context.
Profile synthetic_profile() {
  Profile p;
  p.threads = 2;
  p.n_ctx = 8192;
  p.kv_bytes_per_token = 22528;
  p.block_size = 16;
  p.weight_bytes_per_token = 600u << 20;
  p.mem_read_gb_s = 32;
  p.matmul = {{1, 0.020}, {8, 0.022}, {32, 0.034}, {128, 0.080}, {512, 0.260}};
  p.attn_decode_s_per_pair = 2e-8;
  p.attn_prefill_s_per_pair = 4e-9;
  p.per_seq = {{1, 0.0}, {4, 0.001}, {8, 0.006}, {64, 0.020}};
  p.engine_step_s = 4e-4;
  p.engine_seq_s = 6e-5;
  return p;
}

// The reference: the engine's Scheduler under a virtual clock.
Prediction run_scheduler(const Profile& p, const EngineShape& shape, const Workload& w) {
  KvCacheConfig kc;
  kc.n_blocks = (int32_t)shape.kv_blocks;
  kc.block_size = shape.block_size;
  kc.enable_prefix_caching = false;  // the model assumes distinct prompts
  KvCacheManager kv(kc);
  SchedulerConfig sc;
  sc.max_batch_tokens = shape.max_batch_tokens;
  sc.max_seqs = shape.max_seqs;
  sc.max_model_len = shape.max_model_len;
  sc.aging_per_step = shape.aging_per_step;  // serve's default unless a case sets it
  Scheduler s(sc, &kv);

  const std::vector<Arrival> arr = make_arrivals(w);
  struct Track {
    double last = 0;
    int64_t generated = 0;
  };
  std::map<SeqId, Track> live;
  std::vector<double> ttft, itl, e2e;
  size_t next = 0, done = 0;
  double t = 0, last_completion = 0;
  int64_t steps = 0;
  while (done < arr.size()) {
    while (next < arr.size() && arr[next].t <= t) {
      SeqRequest r;
      r.seq = (SeqId)next;
      r.prompt.assign((size_t)arr[next].len.prompt, (TokenId)(next % 1000 + 1));
      r.max_total_tokens = (int64_t)arr[next].len.prompt + arr[next].len.gen;
      EXPECT_TRUE(s.add(std::move(r)).ok());
      live[(SeqId)next] = {};
      ++next;
    }
    if (!s.has_unfinished()) {
      t = arr[next].t;
      continue;
    }
    const SchedulerOutput out = s.schedule();
    int64_t n_tokens = 0;
    double decode_pairs = 0, prefill_pairs = 0;
    std::vector<std::pair<SeqId, TokenId>> sampled;
    for (const ScheduledSeq& ss : out.seqs) {
      n_tokens += ss.n_tokens;
      (ss.n_tokens == 1 ? decode_pairs : prefill_pairs) += attn_pairs_of(ss.start_pos, ss.n_tokens);
      if (ss.needs_logits) sampled.emplace_back(ss.seq, 7);
    }
    t += step_seconds(p, n_tokens, decode_pairs, prefill_pairs, (int64_t)out.seqs.size());
    ++steps;
    s.update(out, sampled);
    for (const auto& [id, tok] : sampled) {
      Track& tr = live[id];
      ++tr.generated;
      if (tr.generated == 1) ttft.push_back(t - arr[(size_t)id].t);
      else itl.push_back(t - tr.last);
      tr.last = t;
      if (s.length_reached(id)) {
        s.finish(id);
        e2e.push_back(t - arr[(size_t)id].t);
        last_completion = t;
        ++done;
      }
    }
  }
  Prediction r;
  r.completed = (int64_t)done;
  r.duration_s = last_completion - arr.front().t;
  int64_t gen = 0;
  for (const Arrival& a : arr) gen += a.len.gen;
  r.req_s = (double)done / r.duration_s;
  r.gen_tok_s = (double)gen / r.duration_s;
  r.ttft = percentiles_of(ttft);
  r.itl = percentiles_of(itl);
  r.e2e = percentiles_of(e2e);
  r.preemptions = s.n_preemptions();
  r.steps = steps;
  return r;
}

struct Case {
  std::string name;
  double rate;
  std::vector<LengthSample> lengths;
  int32_t max_seqs = 64, max_batch_tokens = 512;
  int64_t kv_blocks = 4096;
  int32_t n_requests = 400;
  bool saturated = false;  // the workload's character, checked too
  bool preempts = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class QueueModelVsScheduler : public ::testing::TestWithParam<Case> {};

void expect_within(const char* what, double model, double reference, double tol) {
  const double rel = std::abs(model - reference) / std::max(std::abs(reference), 1e-9);
  EXPECT_LE(rel, tol) << what << ": model " << model << " vs scheduler " << reference;
}

TEST_P(QueueModelVsScheduler, PredictsWithinTenPercent) {
  const Case c = GetParam();
  const Profile p = synthetic_profile();
  EngineShape shape;
  shape.max_seqs = c.max_seqs;
  shape.max_batch_tokens = c.max_batch_tokens;
  shape.kv_blocks = c.kv_blocks;
  shape.block_size = p.block_size;
  shape.max_model_len = 8192;
  Workload w;
  w.rate = c.rate;
  w.lengths = c.lengths;
  w.n_requests = c.n_requests;
  w.seed = 42;
  ASSERT_TRUE(validate_inputs(shape, w).ok());
  const Prediction m = simulate(p, shape, w);
  const Prediction r = run_scheduler(p, shape, w);
  ASSERT_EQ(m.completed, c.n_requests);
  ASSERT_EQ(r.completed, c.n_requests);
  expect_within("requests/s", m.req_s, r.req_s, 0.10);
  expect_within("generated tokens/s", m.gen_tok_s, r.gen_tok_s, 0.10);
  expect_within("TTFT p50", m.ttft.p50, r.ttft.p50, 0.10);
  expect_within("TTFT p99", m.ttft.p99, r.ttft.p99, 0.10);
  expect_within("ITL p50", m.itl.p50, r.itl.p50, 0.10);
  expect_within("ITL p99", m.itl.p99, r.itl.p99, 0.10);
  expect_within("end-to-end p50", m.e2e.p50, r.e2e.p50, 0.10);
  // Preemption happens in the model exactly when it happens in the scheduler.
  EXPECT_EQ(m.preemptions > 0, r.preemptions > 0) << m.preemptions << " vs " << r.preemptions;
  EXPECT_EQ(m.preemptions > 0, c.preempts) << "the case does not exercise what it is named for";
  EXPECT_EQ(m.saturated, c.saturated) << "the case does not exercise what it is named for";
}

const std::vector<LengthSample> kFixed{{64, 64}};
const std::vector<LengthSample> kMixed{{16, 200}, {300, 40}, {900, 120}, {64, 64}, {2000, 16}, {128, 400}};

INSTANTIATE_TEST_SUITE_P(
    Workloads, QueueModelVsScheduler,
    ::testing::Values(Case{"light", 1.0, kFixed}, Case{"busy", 6.0, kFixed}, Case{"near_saturation", 9.0, kFixed},
                      Case{"overloaded", 20.0, kFixed, 64, 512, 4096, 400, true},
                      Case{"seq_cap", 4.0, kFixed, 4, 512, 4096, 400, true},
                      Case{"small_budget_chunked", 1.2, kMixed, 64, 128},
                      Case{"mixed_lengths", 1.5, kMixed},
                      Case{"mixed_overloaded", 6.0, kMixed, 64, 512, 4096, 400, true},
                      Case{"kv_starved", 6.0, kFixed, 64, 512, 48, 400, true, true},
                      Case{"kv_tight", 0.6, kMixed, 64, 512, 400, 400, false, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(QueueModel, SaturationIsDetected) {
  const Profile p = synthetic_profile();
  EngineShape shape;
  shape.kv_blocks = 4096;
  Workload w;
  w.lengths = kFixed;
  w.n_requests = 400;
  w.rate = 1.0;
  EXPECT_FALSE(simulate(p, shape, w).saturated);
  w.rate = 40.0;
  const Prediction over = simulate(p, shape, w);
  EXPECT_TRUE(over.saturated);
  EXPECT_LT(over.req_s, 0.9 * w.rate);
}

TEST(QueueModel, RejectsNonsense) {
  EngineShape shape;
  shape.kv_blocks = 100;
  shape.max_model_len = 4096;
  Workload w;
  w.lengths = kFixed;
  auto err = [&](const std::string& needle) {
    const Status st = validate_inputs(shape, w);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  w.rate = 0;
  err("--rate");
  w.rate = -3;
  err("--rate");
  w.rate = NAN;
  err("--rate");
  w.rate = 1;
  w.lengths = {{0, 10}};
  err("--prompt-len");
  w.lengths = {{10, 0}};
  err("--gen-len");
  w.lengths = {{4000, 200}};
  err("exceed the context");
  w.lengths = {{2000, 10}};
  err("--kv-memory");
  w.lengths = kFixed;
  w.n_requests = 0;
  err("--requests");
  w.n_requests = 10;
  EXPECT_TRUE(validate_inputs(shape, w).ok());
}

TEST(Profile, FitRecoversTheStepModel) {
  // Points generated from known coefficients are fitted back.
  Profile truth = synthetic_profile();
  Profile p;
  p.threads = 2;
  p.n_ctx = 8192;
  p.kv_bytes_per_token = 100;
  auto forward_only = [&](double engine_seqs) { return truth.engine_step_s + truth.engine_seq_s * engine_seqs; };
  for (int n : {1, 8, 32, 128, 512})
    for (int start : {0, 256}) p.prefill.push_back({n, chunk_step_seconds(truth, n, start) - forward_only(1), start});
  for (int b : {1, 4, 16})
    for (int d : {32, 1024}) p.decode.push_back({b, d, decode_step_seconds(truth, b, d) - forward_only(b)});
  for (int b : {1, 16}) p.engine.push_back({b, 64, decode_step_seconds(truth, b, 64)});
  ASSERT_TRUE(fit_step_model(&p).ok());
  EXPECT_NEAR(p.attn_decode_s_per_pair, truth.attn_decode_s_per_pair, 1e-12);
  EXPECT_NEAR(p.attn_prefill_s_per_pair, truth.attn_prefill_s_per_pair, 1e-12);
  ASSERT_EQ(p.per_seq.size(), 3u);  // batches 1 (anchor), 4, 16
  for (int n : {2, 3, 4, 16}) EXPECT_NEAR(step_seconds(p, 20, 0, 0, n), step_seconds(truth, 20, 0, 0, n), 1e-7) << n;
  EXPECT_NEAR(p.engine_step_s, truth.engine_step_s, 1e-7);
  EXPECT_NEAR(p.engine_seq_s, truth.engine_seq_s, 1e-8);
  for (int n : {1, 3, 50, 300, 700})
    EXPECT_NEAR(step_seconds(p, n, 100, 2000, 2), step_seconds(truth, n, 100, 2000, 2), 1e-6) << n;
  // And survives a JSON round trip.
  auto back = profile_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_NEAR(step_seconds(*back, 77, 5000, 9000, 3), step_seconds(p, 77, 5000, 9000, 3), 1e-12);
}

// A machine running f times slower: every step f times longer, so a
// lightly loaded replica's latencies scale by f (the batching is the same).
TEST(Profile, ScaledIsTheSameMachineSlower) {
  const Profile p = synthetic_profile();
  const Profile q = scaled(p, 1.25);
  for (int n : {1, 7, 64, 900})
    EXPECT_NEAR(step_seconds(q, n, 300, 4000, 3), 1.25 * step_seconds(p, n, 300, 4000, 3), 1e-12) << n;
  EXPECT_NEAR(decode_step_seconds(q, 4, 100), 1.25 * decode_step_seconds(p, 4, 100), 1e-12);
  EngineShape shape;
  shape.kv_blocks = 4096;
  Workload w;
  w.rate = 0.05;  // one request at a time: nothing batches
  w.n_requests = 20;
  w.lengths = {{64, 32}};
  const Prediction a = simulate(p, shape, w), b = simulate(q, shape, w);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_NEAR(b.itl.p50, 1.25 * a.itl.p50, 1e-9);
  EXPECT_NEAR(b.ttft.p50, 1.25 * a.ttft.p50, 1e-9);
}

TEST(Profile, RejectsMalformedFiles) {
  const nlohmann::json good = to_json(synthetic_profile());
  ASSERT_TRUE(profile_from_json(good).ok()) << profile_from_json(good).status().message();
  auto bad = [&](const char* ptr, const nlohmann::json& v, const std::string& needle) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(ptr)] = v;
    auto r = profile_from_json(j);
    ASSERT_FALSE(r.ok()) << ptr;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  bad("/version", 99, "version");
  bad("/kv/bytes_per_token", 0, "kv.bytes_per_token");
  bad("/kv/block_size", "16", "kv.block_size");
  bad("/machine/threads", -1, "machine.threads");
  bad("/step_model/matmul", nlohmann::json::array(), "step_model.matmul");
  bad("/step_model/attn_decode_s_per_pair", -1.0, "attn_decode_s_per_pair");
  bad("/prefill", 5, "prefill");
  EXPECT_FALSE(profile_from_json(nlohmann::json::array()).ok());
}

TEST(Planner, RecommendsAndFindsWhatBinds) {
  const Profile p = synthetic_profile();
  Workload w;
  w.lengths = kFixed;
  w.n_requests = 300;
  w.rate = 20;  // several replicas' worth
  PlanOptions opt;
  opt.max_seqs_grid = {8, 32, 64};
  opt.batch_tokens_grid = {256, 512};
  Slo slo{2.0, 0.1};
  const Recommendation r = recommend(p, w, slo, opt);
  ASSERT_TRUE(r.feasible) << r.why;
  EXPECT_GE(r.replicas, 2);
  // The recommendation holds when simulated on its own.
  Workload per = w;
  per.rate = w.rate / r.replicas;
  EXPECT_TRUE(meets(simulate(p, r.shape, per), slo));
  EXPECT_GE(r.headroom, 0.0);
  // An ITL objective below one batch-1 decode step cannot be met by replicas.
  const Recommendation no = recommend(p, w, Slo{0, 0.010}, opt);
  EXPECT_FALSE(no.feasible);
  EXPECT_EQ(no.binding, "memory bandwidth") << no.why;
  // A TTFT objective below the prefill of one prompt alone: compute.
  Workload big = w;
  big.lengths = {{2000, 16}};
  const Recommendation no2 = recommend(p, big, Slo{0.05, 0}, opt);
  EXPECT_FALSE(no2.feasible);
  EXPECT_EQ(no2.binding, "compute") << no2.why;
}

}  // namespace
}  // namespace serval::plan
