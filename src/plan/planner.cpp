#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace serval::plan {

namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

int64_t longest_request(const Workload& w) {
  int64_t m = 0;
  for (const LengthSample& l : w.lengths) m = std::max<int64_t>(m, (int64_t)l.prompt + l.gen);
  return m;
}

double mean_context(const Workload& w) {
  double s = 0;
  for (const LengthSample& l : w.lengths) s += l.prompt + l.gen / 2.0;
  return w.lengths.empty() ? 0 : s / (double)w.lengths.size();
}

// Seconds to prefill a prompt of n tokens alone, in chunks of `budget`.
double prefill_alone_s(const Profile& p, int64_t n, int64_t budget) {
  double t = 0;
  for (int64_t done = 0; done < n;) {
    const int64_t c = std::min(budget, n - done);
    t += chunk_step_seconds(p, c, done);
    done += c;
  }
  return t;
}

EngineShape shape_for(const Profile& p, const Workload& w, const PlanOptions& opt, int32_t max_seqs,
                      int32_t batch_tokens) {
  EngineShape s;
  s.max_seqs = max_seqs;
  s.max_batch_tokens = batch_tokens;
  s.block_size = p.block_size;
  s.max_model_len = opt.max_model_len;
  if (opt.kv_memory_bytes > 0) {
    s.kv_blocks = kv_blocks_for(p, opt.kv_memory_bytes, p.block_size);
  } else {
    const int64_t per_req = (longest_request(w) + p.block_size - 1) / p.block_size;
    s.kv_blocks = (int64_t)max_seqs * per_req;
  }
  return s;
}

// The most margin: the worst of the objectives' ratios (lower is better);
// without objectives, the mean end-to-end latency.
double score(const Prediction& pr, const Slo& slo) {
  double s = 0;
  if (slo.ttft_p99_s > 0) s = std::max(s, pr.ttft.p99 / slo.ttft_p99_s);
  if (slo.itl_p99_s > 0) s = std::max(s, pr.itl.p99 / slo.itl_p99_s);
  if (slo.ttft_p99_s <= 0 && slo.itl_p99_s <= 0) s = pr.e2e.mean;
  return s;
}

struct Best {
  bool found = false;
  EngineShape shape;
  Prediction pred;
  bool holds_double = false;  // still meets the objectives at twice the rate
  double score = 0;
};

// The settings that meet the objectives at `replicas`; preferred: those that
// still meet them at twice the load (headroom), then the most margin.
Best best_at(const Profile& p, Workload w, const Slo& slo, const PlanOptions& opt, int32_t replicas) {
  w.rate /= replicas;
  Workload twice = w;
  twice.rate *= 2;
  Best b;
  for (int32_t ms : opt.max_seqs_grid)
    for (int32_t bt : opt.batch_tokens_grid) {
      const EngineShape s = shape_for(p, w, opt, ms, bt);
      if (!validate_inputs(s, w).ok()) continue;
      const Prediction pr = simulate(p, s, w);
      if (!meets(pr, slo)) continue;
      const Prediction stressed = simulate(p, s, twice);
      const bool holds = meets(stressed, slo);
      const double sc = score(holds ? stressed : pr, slo);
      if (!b.found || (holds && !b.holds_double) || (holds == b.holds_double && sc < b.score))
        b = {true, s, pr, holds, sc};
    }
  return b;
}

}  // namespace

int64_t kv_blocks_for(const Profile& p, int64_t bytes, int32_t block_size) {
  const uint64_t per_block = p.kv_bytes_per_token * (uint64_t)block_size;
  return per_block ? (int64_t)((uint64_t)bytes / per_block) : 0;
}

bool meets(const Prediction& pr, const Slo& slo) {
  if (pr.saturated) return false;
  if (slo.ttft_p99_s > 0 && pr.ttft.p99 > slo.ttft_p99_s) return false;
  if (slo.itl_p99_s > 0 && pr.itl.p99 > slo.itl_p99_s) return false;
  return true;
}

std::string binding_resource(const Profile& p, const EngineShape& shape, const Prediction& at, std::string* why) {
  if (at.preemptions == 0 && at.mean_batch >= 0.9 * shape.max_seqs) {
    *why = fmt("steps carry %.1f sequences on average against --max-seqs %.0f", at.mean_batch, (double)shape.max_seqs);
    return "max-seqs";
  }
  if (at.kv_peak_frac >= 0.98 && (at.preemptions > 0 || at.max_waiting > 0)) {
    *why = fmt("the KV pool (%.0f blocks) runs full at capacity (peak %.0f %%, %.0f preemptions): more --kv-memory "
               "admits more sequences at once",
               (double)shape.kv_blocks, 100.0 * at.kv_peak_frac, (double)at.preemptions);
    return "KV memory";
  }
  if (at.prefill_time_frac > 0.5) {
    *why = fmt("%.0f %% of the engine's time at capacity goes to prompt tokens (%.1f tokens per step on average): "
               "prefill is matrix work",
               100.0 * at.prefill_time_frac, at.mean_step_tokens);
    return "compute";
  }
  const double b = std::max(1.0, at.mean_batch);
  const double t1 = decode_step_seconds(p, 1, 0);
  const double tb = decode_step_seconds(p, (int64_t)std::lround(b), 0);
  const double weights_s = p.mem_read_gb_s > 0 ? (double)p.weight_bytes_per_token / (p.mem_read_gb_s * 1e9) : 0;
  if (tb < 1.5 * t1) {
    *why = fmt("a step of %.1f sequences takes %.1f ms, %.2fx a single decode: each step rereads the weights "
               "(%.1f ms at the measured bandwidth)",
               b, tb * 1e3, tb / t1, weights_s * 1e3);
    return "memory bandwidth";
  }
  *why = fmt("a step of %.1f sequences (%.0f tokens) takes %.1f ms, %.2fx a single decode: the matrix work grows with "
             "the tokens per step",
             b, at.mean_step_tokens, tb * 1e3, tb / t1);
  return "compute";
}

Recommendation recommend(const Profile& p, const Workload& w, const Slo& slo, const PlanOptions& opt) {
  Recommendation rec;
  // Objectives no replica count can meet: one decode step at batch 1, or one
  // prompt prefilled alone, already takes longer.
  const double ctx = mean_context(w);
  const double t1 = decode_step_seconds(p, 1, (int64_t)ctx);
  if (slo.itl_p99_s > 0 && t1 > slo.itl_p99_s) {
    const double weights_s = p.mem_read_gb_s > 0 ? (double)p.weight_bytes_per_token / (p.mem_read_gb_s * 1e9) : 0;
    rec.binding = weights_s >= 0.5 * t1 || p.mem_read_gb_s <= 0 ? "memory bandwidth" : "compute";
    rec.why = fmt("one decode step at batch 1 takes %.1f ms (at a context of %.0f tokens), above the ITL p99 objective "
                  "of %.1f ms at any number of replicas; reading the weights alone takes %.1f ms at the measured "
                  "bandwidth",
                  t1 * 1e3, ctx, slo.itl_p99_s * 1e3, weights_s * 1e3);
    return rec;
  }
  int64_t longest_prompt = 0;
  for (const LengthSample& l : w.lengths) longest_prompt = std::max<int64_t>(longest_prompt, l.prompt);
  const int32_t widest = *std::max_element(opt.batch_tokens_grid.begin(), opt.batch_tokens_grid.end());
  const double pre = prefill_alone_s(p, longest_prompt, widest);
  if (slo.ttft_p99_s > 0 && pre > slo.ttft_p99_s) {
    rec.binding = "compute";
    rec.why = fmt("prefilling the longest prompt (%.0f tokens) alone takes %.2f s, above the TTFT p99 objective of "
                  "%.2f s at any number of replicas",
                  (double)longest_prompt, pre, slo.ttft_p99_s);
    return rec;
  }
  // Replicas: doubling until a count meets the objectives, then bisection.
  Best found;
  int32_t hi = 0, lo = 0;
  for (int32_t n = 1;; n = std::min(opt.max_replicas, n * 2)) {
    Best b = best_at(p, w, slo, opt, n);
    if (b.found) {
      found = b;
      hi = n;
      break;
    }
    lo = n;
    if (n >= opt.max_replicas) break;
  }
  if (!found.found) {
    // Which objective each setting misses at the most replicas: prompts
    // either stall the decodes past the ITL objective (large chunks) or take
    // past the TTFT objective (small chunks), or the KV memory admits too few.
    Workload wn = w;
    wn.rate /= opt.max_replicas;
    rec.replicas = opt.max_replicas;
    bool any_valid = false, any_ttft = false, any_itl = false, any_unsaturated = false;
    int32_t itl_ok_max_budget = 0, ttft_ok_min_budget = 0;
    double best = -1;
    for (int32_t ms : opt.max_seqs_grid)
      for (int32_t bt : opt.batch_tokens_grid) {
        const EngineShape s = shape_for(p, w, opt, ms, bt);
        if (!validate_inputs(s, wn).ok()) continue;
        any_valid = true;
        const Prediction pr = simulate(p, s, wn);
        const bool ttft_ok = slo.ttft_p99_s <= 0 || pr.ttft.p99 <= slo.ttft_p99_s;
        const bool itl_ok = slo.itl_p99_s <= 0 || pr.itl.p99 <= slo.itl_p99_s;
        any_unsaturated = any_unsaturated || !pr.saturated;
        if (ttft_ok) any_ttft = true, ttft_ok_min_budget = ttft_ok_min_budget ? std::min(ttft_ok_min_budget, bt) : bt;
        if (itl_ok) any_itl = true, itl_ok_max_budget = std::max(itl_ok_max_budget, bt);
        const double sc = score(pr, slo);
        if (best < 0 || sc < best) best = sc, rec.shape = s, rec.per_replica = pr;
      }
    const std::string n = std::to_string(opt.max_replicas);
    if (!any_valid) {
      rec.binding = "KV memory";
      rec.why = "no setting's KV pool holds a request of " + std::to_string(longest_request(w)) + " tokens";
    } else if (!any_unsaturated) {
      rec.binding = binding_resource(p, rec.shape, rec.per_replica, &rec.why);
      rec.why = "even " + n + " replicas are saturated (" + rec.why + ")";
    } else if (any_ttft && any_itl) {
      rec.binding = "compute";
      rec.why = fmt("prefill: chunks that keep ITL p99 within %.3f s (budgets up to %.0f tokens) make TTFT p99 exceed "
                    "%.2f s, and budgets of %.0f tokens or more that meet the TTFT objective stall decodes past the "
                    "ITL objective, at any number of replicas up to ",
                    slo.itl_p99_s, (double)itl_ok_max_budget, slo.ttft_p99_s, (double)ttft_ok_min_budget) +
                n + "; relax one objective or shorten the prompts";
    } else {
      rec.binding = "compute";
      rec.why = std::string(any_ttft ? "ITL" : "TTFT") + " p99 misses its objective with every setting at " + n +
                " replicas: the step times of this model on this machine are too long for it";
    }
    return rec;
  }
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    Best b = best_at(p, w, slo, opt, mid);
    if (b.found) hi = mid, found = b;
    else lo = mid;
  }
  rec.feasible = true;
  rec.replicas = hi;
  rec.shape = found.shape;
  rec.kv_memory_bytes = (int64_t)(found.shape.kv_blocks * p.block_size * (int64_t)p.kv_bytes_per_token);
  rec.per_replica = found.pred;
  // Headroom: the highest rate one replica sustains within the objectives.
  Workload wr = w;
  const double base = w.rate / hi;
  double ok_rate = base, bad_rate = 0;
  for (int i = 0; i < 24; ++i) {
    wr.rate = ok_rate * 2;
    if (!meets(simulate(p, found.shape, wr), slo)) {
      bad_rate = wr.rate;
      break;
    }
    ok_rate = wr.rate;
  }
  Prediction at_cap = found.pred;
  if (bad_rate > 0) {
    for (int i = 0; i < 10; ++i) {
      wr.rate = (ok_rate + bad_rate) / 2;
      const Prediction pr = simulate(p, found.shape, wr);
      if (meets(pr, slo)) ok_rate = wr.rate, at_cap = pr;
      else bad_rate = wr.rate;
    }
  }
  rec.max_rate_per_replica = ok_rate;
  rec.headroom = ok_rate / base - 1;
  rec.binding = binding_resource(p, found.shape, at_cap, &rec.why);
  return rec;
}

}  // namespace serval::plan
