#include "plan/queue_model.h"

#include <algorithm>
#include <cmath>

#include "common/splitmix.h"
#include "common/stats.h"

namespace serval::plan {

Percentiles percentiles_of(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.mean = mean_of(v);
  p.p50 = percentile_sorted(v, 50);
  p.p90 = percentile_sorted(v, 90);
  p.p99 = percentile_sorted(v, 99);
  return p;
}

Status validate_inputs(const EngineShape& s, const Workload& w) {
  if (!(w.rate > 0) || !std::isfinite(w.rate) || w.rate > 1e6)
    return invalid_argument("--rate: expected requests per second in (0, 1e6], got " + std::to_string(w.rate));
  if (w.n_requests < 1 || w.n_requests > 1000000)
    return invalid_argument("--requests: expected 1..1000000, got " + std::to_string(w.n_requests));
  if (w.lengths.empty()) return invalid_argument("no request lengths (--prompt-len/--gen-len or --trace)");
  if (s.max_batch_tokens < 1 || s.max_batch_tokens > (1 << 20))
    return invalid_argument("--max-batch-tokens: expected 1..1048576, got " + std::to_string(s.max_batch_tokens));
  if (s.max_seqs < 1 || s.max_seqs > (1 << 16))
    return invalid_argument("--max-seqs: expected 1..65536, got " + std::to_string(s.max_seqs));
  if (s.block_size < 1 || s.block_size > 1024)
    return invalid_argument("block size: expected 1..1024, got " + std::to_string(s.block_size));
  if (s.kv_blocks < 1) return invalid_argument("--kv-memory: holds no KV block");
  for (const LengthSample& l : w.lengths) {
    if (l.prompt < 1) return invalid_argument("--prompt-len: expected >= 1 token, got " + std::to_string(l.prompt));
    if (l.gen < 1) return invalid_argument("--gen-len: expected >= 1 token, got " + std::to_string(l.gen));
    const int64_t total = (int64_t)l.prompt + l.gen;
    if (total > s.max_model_len)
      return invalid_argument("--prompt-len + --gen-len = " + std::to_string(total) + " tokens exceed the context of " +
                              std::to_string(s.max_model_len));
    const int64_t blocks = (total - 1 + s.block_size - 1) / s.block_size;
    if (blocks > s.kv_blocks)
      return invalid_argument("--kv-memory: a request of " + std::to_string(total) + " tokens needs " +
                              std::to_string(blocks) + " KV blocks, the pool holds " + std::to_string(s.kv_blocks));
  }
  return Status{};
}

std::vector<Arrival> make_arrivals(const Workload& w) {
  std::vector<Arrival> a((size_t)w.n_requests);
  uint64_t s = w.seed * 0x2545F4914F6CDD1Dull + 7;
  double t = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double u = (double)(splitmix64_next(s) >> 11) * 0x1.0p-53;  // [0, 1)
    if (i > 0) t += -std::log1p(-u) / w.rate;
    a[i].t = t;
    a[i].len = w.lengths.size() == 1 ? w.lengths[0] : w.lengths[splitmix64_next(s) % w.lengths.size()];
  }
  return a;
}

namespace {

struct Req {
  double arrival = 0;
  int64_t prompt = 0, gen = 0;
  int64_t generated = 0;
  int64_t computed = 0;  // tokens whose K/V are in the pool
  int64_t blocks = 0;    // blocks held
  double last_token_t = 0;
  int64_t waited = 0;  // steps with work to do and none scheduled (priority aging)
  uint64_t scheduled_step = UINT64_MAX;
  enum class State { pending, waiting, running, done } state = State::pending;
  int64_t known() const { return prompt + generated; }
};

struct Chunk {
  size_t id;
  int64_t start, n;
};

}  // namespace

Prediction simulate(const Profile& p, const EngineShape& shape, const Workload& w) {
  const std::vector<Arrival> arrivals = make_arrivals(w);
  std::vector<Req> reqs(arrivals.size());
  for (size_t i = 0; i < arrivals.size(); ++i) {
    reqs[i].arrival = arrivals[i].t;
    reqs[i].prompt = arrivals[i].len.prompt;
    reqs[i].gen = arrivals[i].len.gen;
  }
  const int64_t bs = shape.block_size;
  auto blocks_for = [&](int64_t n) { return (n + bs - 1) / bs; };
  std::vector<size_t> waiting, running;  // request ids (= arrival order)
  // Importance: aged priority (all requests have priority 0), then arrival,
  // in the same arithmetic as the engine's scheduler.
  auto more_important = [&](size_t a, size_t b) {
    const double ea = 0.0 - shape.aging_per_step * (double)reqs[a].waited;
    const double eb = 0.0 - shape.aging_per_step * (double)reqs[b].waited;
    if (ea != eb) return ea < eb;
    return a < b;
  };
  auto by_importance = [&](std::vector<size_t> v) {
    std::sort(v.begin(), v.end(), more_important);
    return v;
  };
  auto erase_id = [](std::vector<size_t>& v, size_t id) {
    auto it = std::find(v.begin(), v.end(), id);
    if (it != v.end()) v.erase(it);
  };
  int64_t free_blocks = shape.kv_blocks;
  size_t next_arrival = 0;
  double t = 0, busy = 0, prefill_busy = 0, kv_area = 0, last_completion = 0;
  int64_t peak_used = 0, steps = 0, batch_sum = 0, token_sum = 0, preemptions = 0, max_waiting = 0;
  std::vector<double> ttft, itl, e2e, completion_t;
  ttft.reserve(reqs.size());
  e2e.reserve(reqs.size());
  completion_t.reserve(reqs.size());
  std::vector<Chunk> chunks;
  chunks.reserve((size_t)shape.max_seqs);
  size_t n_done = 0;

  auto preempt = [&](size_t id) {
    Req& r = reqs[id];
    free_blocks += r.blocks;
    r.blocks = 0;
    r.computed = 0;
    r.state = Req::State::waiting;
    erase_id(running, id);
    waiting.push_back(id);
    ++preemptions;
  };

  while (n_done < reqs.size()) {
    while (next_arrival < reqs.size() && reqs[next_arrival].arrival <= t) {
      reqs[next_arrival].state = Req::State::waiting;
      waiting.push_back(next_arrival++);
    }
    if (running.empty() && waiting.empty()) {
      t = reqs[next_arrival].arrival;  // idle until the next arrival
      continue;
    }
    max_waiting = std::max<int64_t>(max_waiting, (int64_t)waiting.size());
    // Schedule one step.
    const uint64_t step = (uint64_t)steps;
    chunks.clear();
    int64_t budget = shape.max_batch_tokens;
    bool preempted = false;
    const std::vector<size_t> order = by_importance(running);
    for (int pass = 0; pass < 2; ++pass) {
      const bool decodes = pass == 0;
      for (size_t id : order) {
        if (budget == 0 || (int64_t)chunks.size() >= shape.max_seqs) break;
        Req& r = reqs[id];
        if (r.state != Req::State::running || r.scheduled_step == step) continue;
        const int64_t gap = r.known() - r.computed;
        if (gap <= 0 || decodes != (gap == 1)) continue;
        const int64_t n = std::min(gap, budget);
        while (blocks_for(r.computed + n) - r.blocks > free_blocks) {
          // The newest running request not yet scheduled in this step (maybe r).
          size_t victim = id;
          for (auto it = order.rbegin(); it != order.rend(); ++it)
            if (reqs[*it].state == Req::State::running && reqs[*it].scheduled_step != step) {
              victim = *it;
              break;
            }
          preempt(victim);
          preempted = true;
          if (victim == id) break;
        }
        if (r.state != Req::State::running) continue;
        const int64_t need = blocks_for(r.computed + n) - r.blocks;
        free_blocks -= need;
        r.blocks += need;
        r.scheduled_step = step;
        chunks.push_back({id, r.computed, n});
        budget -= n;
      }
    }
    if (!preempted) {
      std::vector<size_t> admitted;
      for (size_t id : by_importance(waiting)) {
        if (budget == 0 || (int64_t)chunks.size() >= shape.max_seqs || (int64_t)running.size() >= shape.max_seqs)
          break;
        Req& r = reqs[id];
        const int64_t n = std::min(r.known(), budget);
        const int64_t need = blocks_for(n);
        if (need > free_blocks) break;
        free_blocks -= need;
        r.blocks = need;
        r.state = Req::State::running;
        r.scheduled_step = step;
        running.push_back(id);
        admitted.push_back(id);
        chunks.push_back({id, 0, n});
        budget -= n;
      }
      for (size_t id : admitted) erase_id(waiting, id);
    }
    // Aging: every request with work to do that got none in this step.
    for (size_t id : waiting) ++reqs[id].waited;
    for (size_t id : running)
      if (reqs[id].scheduled_step != step && reqs[id].computed < reqs[id].known()) ++reqs[id].waited;
    // Run it.
    int64_t n_tokens = 0;
    double decode_pairs = 0, prefill_pairs = 0;
    for (const Chunk& c : chunks) {
      n_tokens += c.n;
      (c.n == 1 ? decode_pairs : prefill_pairs) += attn_pairs_of(c.start, c.n);
    }
    const double dt = step_seconds(p, n_tokens, decode_pairs, prefill_pairs, (int64_t)chunks.size());
    int64_t prompt_tokens = 0;  // tokens of prefill chunks (one-token chunks are decodes)
    for (const Chunk& c : chunks) prompt_tokens += c.n > 1 ? c.n : 0;
    prefill_busy += dt * (double)prompt_tokens / (double)std::max<int64_t>(1, n_tokens);
    const int64_t used = shape.kv_blocks - free_blocks;
    peak_used = std::max(peak_used, used);
    kv_area += (double)used * dt;
    busy += dt;
    t += dt;
    ++steps;
    batch_sum += (int64_t)chunks.size();
    token_sum += n_tokens;
    // Advance: a chunk that reaches the end of the known tokens samples one.
    for (const Chunk& c : chunks) {
      Req& r = reqs[c.id];
      if (r.state != Req::State::running) continue;
      r.computed += c.n;
      if (r.computed < r.known()) continue;
      ++r.generated;
      if (r.generated == 1) ttft.push_back(t - r.arrival);
      else itl.push_back(t - r.last_token_t);
      r.last_token_t = t;
      if (r.generated >= r.gen) {
        r.state = Req::State::done;
        free_blocks += r.blocks;
        r.blocks = 0;
        erase_id(running, c.id);
        e2e.push_back(t - r.arrival);
        completion_t.push_back(t);
        last_completion = t;
        ++n_done;
      }
    }
  }

  Prediction out;
  out.completed = (int64_t)n_done;
  const double start = reqs.empty() ? 0 : reqs.front().arrival;
  out.duration_s = std::max(1e-12, last_completion - start);
  int64_t gen_total = 0, prompt_total = 0;
  for (const Req& r : reqs) gen_total += r.gen, prompt_total += r.prompt;
  out.req_s = (double)n_done / out.duration_s;
  out.gen_tok_s = (double)gen_total / out.duration_s;
  out.prompt_tok_s = (double)prompt_total / out.duration_s;
  out.ttft = percentiles_of(ttft);
  out.itl = percentiles_of(itl);
  out.e2e = percentiles_of(e2e);
  out.busy_frac = busy / out.duration_s;
  out.prefill_time_frac = busy > 0 ? prefill_busy / busy : 0;
  out.mean_batch = steps ? (double)batch_sum / (double)steps : 0;
  out.mean_step_tokens = steps ? (double)token_sum / (double)steps : 0;
  out.kv_mean_frac = kv_area / out.duration_s / (double)shape.kv_blocks;
  out.kv_peak_frac = (double)peak_used / (double)shape.kv_blocks;
  out.preemptions = preemptions;
  out.steps = steps;
  out.max_waiting = max_waiting;
  // Saturation: completions against arrivals over the last three quarters
  // of the arrival window.
  if (reqs.size() >= 8) {
    const double a0 = reqs[reqs.size() / 4].arrival, a1 = reqs.back().arrival;
    if (a1 > a0) {
      int64_t arrived = 0, finished = 0;
      for (const Req& r : reqs) arrived += r.arrival > a0 && r.arrival <= a1;
      for (double c : completion_t) finished += c > a0 && c <= a1;
      out.saturated = (double)finished < 0.9 * (double)arrived;
    }
  }
  return out;
}

}  // namespace serval::plan
