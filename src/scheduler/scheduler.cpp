#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace serval {

Status Scheduler::validate(const SchedulerConfig& cfg) {
  if (cfg.max_batch_tokens < 1)
    return invalid_argument("scheduler max_batch_tokens: expected >= 1, got " + std::to_string(cfg.max_batch_tokens));
  if (cfg.max_seqs < 1)
    return invalid_argument("scheduler max_seqs: expected >= 1, got " + std::to_string(cfg.max_seqs));
  if (cfg.max_model_len < 2)
    return invalid_argument("scheduler max_model_len: expected >= 2, got " + std::to_string(cfg.max_model_len));
  if (!(cfg.aging_per_step >= 0.0) || !std::isfinite(cfg.aging_per_step))
    return invalid_argument("scheduler aging_per_step: expected a finite value >= 0, got " +
                            std::to_string(cfg.aging_per_step));
  if (cfg.draft_max < 0 || cfg.draft_max > kMaxDraft)
    return invalid_argument("scheduler draft_max: expected 0.." + std::to_string(kMaxDraft) + ", got " +
                            std::to_string(cfg.draft_max));
  if (cfg.background_prefill_tokens < 0)
    return invalid_argument("scheduler background_prefill_tokens: expected >= 0, got " +
                            std::to_string(cfg.background_prefill_tokens));
  if (cfg.draft_min < 0 || (cfg.draft_max > 0 && cfg.draft_min > cfg.draft_max))
    return invalid_argument("scheduler draft_min: expected 0..draft_max (" + std::to_string(cfg.draft_max) +
                            "), got " + std::to_string(cfg.draft_min));
  return {};
}

Scheduler::Scheduler(SchedulerConfig cfg, KvCacheManager* kv) : cfg_(cfg), kv_(kv) {
  SERVAL_ASSERT(kv_ != nullptr);
  SERVAL_ASSERT(validate(cfg_).ok());
}

Scheduler::Seq& Scheduler::get(SeqId id) {
  auto it = seqs_.find(id);
  SERVAL_ASSERT(it != seqs_.end());
  return it->second;
}

const Scheduler::Seq& Scheduler::get(SeqId id) const {
  auto it = seqs_.find(id);
  SERVAL_ASSERT(it != seqs_.end());
  return it->second;
}

Scheduler::SeqState Scheduler::state(SeqId seq) const { return get(seq).state; }
const std::vector<TokenId>& Scheduler::tokens(SeqId seq) const { return get(seq).tokens; }
int64_t Scheduler::num_computed(SeqId seq) const { return get(seq).num_computed; }
bool Scheduler::length_reached(SeqId seq) const { return done(get(seq)); }

void Scheduler::erase_id(std::vector<SeqId>* v, SeqId id) {
  auto it = std::find(v->begin(), v->end(), id);
  if (it != v->end()) v->erase(it);
}

bool Scheduler::more_important(const Seq& a, const Seq& b) const {
  const double ea = a.priority - cfg_.aging_per_step * static_cast<double>(a.steps_waited);
  const double eb = b.priority - cfg_.aging_per_step * static_cast<double>(b.steps_waited);
  if (ea != eb) return ea < eb;
  return a.arrival < b.arrival;  // unique: a strict total order
}

std::vector<SeqId> Scheduler::by_importance(const std::vector<SeqId>& ids) const {
  std::vector<const Seq*> v;
  v.reserve(ids.size());
  for (SeqId id : ids) v.push_back(&get(id));
  std::sort(v.begin(), v.end(), [this](const Seq* a, const Seq* b) { return more_important(*a, *b); });
  std::vector<SeqId> out;
  out.reserve(v.size());
  for (const Seq* s : v) out.push_back(s->id);
  return out;
}

Status Scheduler::add(SeqRequest r) {
  const std::string where = "request seq " + std::to_string(r.seq) + ": ";
  if (seqs_.count(r.seq)) return invalid_argument(where + "seq id already in use");
  const auto n_prompt = static_cast<int64_t>(r.prompt.size());
  if (n_prompt == 0) return invalid_argument(where + "prompt: expected >= 1 token, got 0");
  if (r.max_total_tokens <= n_prompt || r.max_total_tokens > cfg_.max_model_len)
    return invalid_argument(where + "max_total_tokens: expected " + std::to_string(n_prompt + 1) + ".." +
                            std::to_string(cfg_.max_model_len) + ", got " + std::to_string(r.max_total_tokens));
  // The newest sampled token never needs K/V: max_total_tokens - 1 positions.
  const int64_t n_positions = r.max_total_tokens - 1;
  const int64_t n_blocks = kv_->blocks_for(n_positions);
  if (n_blocks > kv_->n_blocks())
    return invalid_argument(where + "max_total_tokens " + std::to_string(r.max_total_tokens) + " needs " +
                            std::to_string(n_blocks) + " KV blocks, the pool has " + std::to_string(kv_->n_blocks()));
  if (!cfg_.enable_chunked_prefill && n_positions > cfg_.max_batch_tokens)
    return invalid_argument(where + "max_total_tokens - 1 = " + std::to_string(n_positions) +
                            " exceeds max_batch_tokens " + std::to_string(cfg_.max_batch_tokens) +
                            " (chunked prefill off)");
  Seq s;
  s.id = r.seq;
  s.tokens = std::move(r.prompt);
  s.priority = r.priority;
  s.max_total_tokens = r.max_total_tokens;
  s.key = r.prefix_key;
  s.speculate = r.speculate && cfg_.draft_max > 0;
  s.swappable = r.swappable;
  s.prefix_hits = r.prefix_hits;
  if (r.max_chunk > 0 && cfg_.enable_chunked_prefill) s.max_chunk = r.max_chunk;
  s.arrival = next_arrival_++;
  s.state = SeqState::waiting;
  seqs_.emplace(s.id, std::move(s));
  waiting_.push_back(r.seq);
  return {};
}

void Scheduler::fork(SeqId parent, SeqId child) {
  const Seq& p = get(parent);
  SERVAL_ASSERT(p.state == SeqState::running);
  SERVAL_ASSERT(!seqs_.count(child));
  Seq c = p;
  c.id = child;
  c.arrival = next_arrival_++;
  c.scheduled_step = UINT64_MAX;
  kv_->fork(parent, child);
  seqs_.emplace(child, std::move(c));
  running_.push_back(child);
}

void Scheduler::fork(SeqId parent, SeqId child, TokenId last_token) {
  fork(parent, child);
  set_last_token(child, last_token);
}

void Scheduler::set_last_token(SeqId seq, TokenId token) {
  Seq& s = get(seq);
  // Only the newest token may change: it has no K/V yet.
  SERVAL_ASSERT(!s.tokens.empty() && s.num_computed == static_cast<int64_t>(s.tokens.size()) - 1);
  s.tokens.back() = token;
}

int64_t Scheduler::num_cached_prompt_tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  return std::max<int64_t>(0, it->second.cached_prompt_tokens);
}

int32_t Scheduler::draft_len(SeqId seq) const {
  const Seq& s = get(seq);
  if (!s.speculate) return 0;
  const int32_t lo = std::max(1, cfg_.draft_min);
  if (s.accepted_mean < 0) return cfg_.draft_max;
  if (cfg_.draft_min == 0 && s.accepted_mean < kPauseBelowAccepted && s.decodes_without_draft < kProbeEvery) return 0;
  const auto k = static_cast<int64_t>(std::ceil(s.accepted_mean - 1e-9)) + 1;
  return static_cast<int32_t>(std::clamp<int64_t>(k, lo, cfg_.draft_max));
}

void Scheduler::finish(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  switch (it->second.state) {
    case SeqState::waiting: erase_id(&waiting_, seq); break;
    case SeqState::running: erase_id(&running_, seq); break;
    case SeqState::swapped: erase_id(&swapped_, seq); break;
  }
  kv_->free(seq);
  seqs_.erase(it);
}

void Scheduler::preempt(Seq& v, SchedulerOutput* out) {
  SERVAL_ASSERT(v.state == SeqState::running);
  ++n_preemptions_;
  out->preempted.push_back(v.id);
  erase_id(&running_, v.id);
  if (cfg_.preemption == SchedulerConfig::Preemption::swap && v.swappable && kv_->can_swap_out(v.id)) {
    kv_->swap_out(v.id, &out->swap_out);
    v.state = SeqState::swapped;
    swapped_.push_back(v.id);
  } else {
    to_waiting(v);
  }
}

void Scheduler::to_waiting(Seq& v) {
  kv_->free(v.id);
  v.num_computed = 0;
  v.draft_computed = 0;
  v.state = SeqState::waiting;
  waiting_.push_back(v.id);
}

void Scheduler::requeue(SeqId seq) {
  Seq& v = get(seq);
  SERVAL_ASSERT(v.state == SeqState::running);
  ++n_preemptions_;
  erase_id(&running_, v.id);
  to_waiting(v);
}

void Scheduler::emit(Seq& s, int64_t n_tokens, SchedulerOutput* out, int32_t n_draft) {
  ScheduledSeq ss;
  ss.seq = s.id;
  ss.start_pos = s.num_computed;
  ss.n_tokens = static_cast<int32_t>(n_tokens);
  ss.n_draft = n_draft;
  ss.tokens.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + n_tokens);
  const auto table = kv_->block_table(s.id);
  ss.block_table.assign(table.begin(), table.end());
  const auto swa_table = kv_->swa_block_table(s.id);
  ss.swa_block_table.assign(swa_table.begin(), swa_table.end());
  ss.needs_logits = s.num_computed + n_tokens == static_cast<int64_t>(s.tokens.size());
  s.draft_last_fed = -1;
  if (n_draft > 0 && cfg_.track_draft_kv) {
    SERVAL_ASSERT(s.draft_computed <= s.num_computed);
    ss.draft_start_pos = s.draft_computed;
    ss.draft_catch_up.assign(s.tokens.begin() + s.draft_computed, s.tokens.begin() + s.num_computed);
    s.draft_last_fed = s.num_computed + n_tokens - 1;
  }
  out->n_tokens += ss.n_tokens + ss.n_draft;
  out->seqs.push_back(std::move(ss));
  s.scheduled_step = step_;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step = step_;
  int64_t budget = cfg_.max_batch_tokens;
  // Foreground first, then (unless a foreground seq prefilled) background
  // seqs under their own token cap. Without background_priority set, every
  // seq is foreground and this is one pass of steps 1-3.
  const bool split = cfg_.background_priority != INT32_MAX;
  const bool fg_prefilled = schedule_phase(&out, &budget, split ? 1 : 0, INT64_MAX);
  if (split && !fg_prefilled)
    schedule_phase(&out, &budget, 2, cfg_.background_prefill_tokens > 0 ? cfg_.background_prefill_tokens : INT64_MAX);
  // Aging: every seq with work to do that got none in this step.
  for (SeqId id : waiting_) ++get(id).steps_waited;
  for (SeqId id : swapped_) ++get(id).steps_waited;
  for (SeqId id : running_) {
    Seq& s = get(id);
    if (s.scheduled_step != step_ && !done(s) && s.num_computed < static_cast<int64_t>(s.tokens.size()))
      ++s.steps_waited;
  }
  ++step_;
  return out;
}

bool Scheduler::schedule_phase(SchedulerOutput* out_ptr, int64_t* budget_ptr, int which, int64_t prefill_cap) {
  SchedulerOutput& out = *out_ptr;
  int64_t& budget = *budget_ptr;
  int64_t prefill_left = prefill_cap;  // prompt tokens this phase may still schedule
  const auto max_seqs = static_cast<size_t>(cfg_.max_seqs);
  // which: 0 every seq, 1 foreground only, 2 background only.
  auto in_phase = [&](const Seq& s) {
    return which == 0 || (which == 1) == (s.priority < cfg_.background_priority);
  };
  bool prefilled = false;

  // 1 + 2: running seqs, decodes first, then prefill chunks.
  const std::vector<SeqId> order = by_importance(running_);
  for (int pass = 0; pass < 2; ++pass) {
    const bool decodes = pass == 0;
    for (SeqId id : order) {
      if (budget == 0 || out.seqs.size() >= max_seqs) break;
      Seq& s = get(id);
      if (!in_phase(s)) continue;
      if (s.state != SeqState::running || s.scheduled_step == step_ || done(s)) continue;
      const int64_t gap = static_cast<int64_t>(s.tokens.size()) - s.num_computed;
      if (gap <= 0 || decodes != (gap == 1)) continue;
      const int64_t chunk = decodes ? std::min(gap, budget) : std::min({gap, budget, prefill_left, s.max_chunk});
      if (chunk == 0) continue;
      if (!cfg_.enable_chunked_prefill && chunk < gap) continue;
      // Draft slots: never past max_total_tokens (the accepted drafts plus the
      // sampled token must fit), never beyond the budget, never at the cost of
      // a preemption.
      int64_t n_draft = 0;
      if (decodes && s.speculate) {
        n_draft = std::min<int64_t>({draft_len(id), budget - chunk,
                                     s.max_total_tokens - static_cast<int64_t>(s.tokens.size()) - 1});
        n_draft = std::max<int64_t>(n_draft, 0);
        if (n_draft > 0 && !kv_->can_allocate(id, s.num_computed + chunk + n_draft, s.num_computed)) n_draft = 0;
      }
      // Make room: preempt the least important running seq not yet scheduled
      // in this step, until this one fits or is itself the victim (a
      // background seq, less important than every foreground one, never
      // preempts a foreground seq: it is itself reached first).
      while (!kv_->can_allocate(id, s.num_computed + chunk, s.num_computed)) {
        Seq* victim = nullptr;
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
          Seq& c = get(*it);
          if (c.state == SeqState::running && c.scheduled_step != step_) {
            victim = &c;
            break;
          }
        }
        SERVAL_ASSERT(victim != nullptr);  // s itself qualifies
        preempt(*victim, &out);
        if (victim == &s) break;
      }
      if (s.state != SeqState::running) continue;
      const bool ok = kv_->allocate(id, s.num_computed + chunk + n_draft, s.num_computed, &out.copies);
      SERVAL_ASSERT(ok);
      emit(s, chunk, &out, static_cast<int32_t>(n_draft));
      budget -= chunk + n_draft;
      if (!decodes) {
        prefilled = true;
        prefill_left -= chunk;
      }
    }
  }

  // 3: admit waiting and swapped-out seqs, unless memory was short this step.
  std::vector<SeqId> admitted;
  if (out.preempted.empty()) {
    std::vector<SeqId> pending;
    for (SeqId id : waiting_)
      if (in_phase(get(id))) pending.push_back(id);
    for (SeqId id : swapped_)
      if (in_phase(get(id))) pending.push_back(id);
    for (SeqId id : by_importance(pending)) {
      if (budget == 0 || prefill_left == 0 || out.seqs.size() >= max_seqs || running_.size() >= max_seqs) break;
      Seq& s = get(id);
      if (done(s)) continue;  // waits for finish()
      const auto n = static_cast<int64_t>(s.tokens.size());
      const size_t n_copies = out.copies.size();
      if (s.state == SeqState::swapped) {
        const int64_t gap = n - s.num_computed;
        const int64_t chunk = std::min({gap, budget, prefill_left, s.max_chunk});
        if (gap <= 0) continue;
        if (!cfg_.enable_chunked_prefill && chunk < gap) break;
        if (!kv_->can_swap_in(id, s.num_computed + chunk)) break;
        kv_->swap_in(id, &out.swap_in);
        const bool ok = kv_->allocate(id, s.num_computed + chunk, s.num_computed, &out.copies);
        SERVAL_ASSERT(ok);
        s.state = SeqState::running;
        emit(s, chunk, &out);
        budget -= chunk;
      } else {
        SERVAL_ASSERT(s.num_computed == 0);
        // Its blocks on the disk tier are still being read into memory (off
        // this thread): it waits for them, the others go ahead.
        if (s.prefix_hits && !kv_->prefix_ready(s.tokens, s.key)) continue;
        const int64_t hit = s.prefix_hits ? kv_->find_cached_prefix(s.tokens, s.key) : 0;
        const int64_t gap = n - hit;
        const int64_t chunk = std::min({gap, budget, prefill_left, s.max_chunk});
        if (!cfg_.enable_chunked_prefill && chunk < gap) break;
        if (s.prefix_hits ? !kv_->can_admit(s.tokens, s.key, hit + chunk) : !kv_->can_allocate(id, chunk, 0)) break;
        // A block of a lower KV tier can fail its check as it is loaded: the
        // hit is then shorter than found (never longer), and this step
        // computes `chunk` tokens from there.
        const int64_t got = s.prefix_hits ? kv_->acquire_cached_prefix(id, s.tokens, s.key) : 0;
        SERVAL_ASSERT(got <= hit);
        s.num_computed = got;
        if (s.cached_prompt_tokens < 0) s.cached_prompt_tokens = got;
        const bool ok = kv_->allocate(id, got + chunk, got, &out.copies);
        SERVAL_ASSERT(ok);
        s.state = SeqState::running;
        emit(s, chunk, &out);
        budget -= chunk;
      }
      // Admitted seqs write only blocks they own alone: no copy-on-write here,
      // which keeps the copies-before-swap_in order of the runner safe.
      SERVAL_ASSERT(out.copies.size() == n_copies);
      running_.push_back(id);
      admitted.push_back(id);
      prefilled = true;
      prefill_left -= out.seqs.back().n_tokens;
    }
  }
  for (SeqId id : admitted) {
    erase_id(&waiting_, id);
    erase_id(&swapped_, id);
  }
  return prefilled;
}


void Scheduler::update(const SchedulerOutput& out, std::span<const std::pair<SeqId, TokenId>> sampled) {
  std::vector<SeqAdvance> adv;
  adv.reserve(sampled.size());
  for (const auto& [id, token] : sampled) adv.push_back({id, {token}, 0});
  update(out, adv);
}

void Scheduler::update(const SchedulerOutput& out, std::span<const SeqAdvance> advances) {
  auto running = [&](SeqId id) -> Seq* {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || it->second.state != SeqState::running) return nullptr;  // finished meanwhile
    return &it->second;
  };
  for (const ScheduledSeq& ss : out.seqs) {
    Seq* s = running(ss.seq);
    if (!s) continue;
    SERVAL_ASSERT(ss.start_pos == s->num_computed);
    s->num_computed += ss.n_tokens;
    SERVAL_ASSERT(s->num_computed <= static_cast<int64_t>(s->tokens.size()));
  }
  for (const SeqAdvance& a : advances) {
    Seq* s = running(a.seq);
    if (!s) continue;
    SERVAL_ASSERT(s->num_computed == static_cast<int64_t>(s->tokens.size()));
    SERVAL_ASSERT(!a.tokens.empty() && static_cast<int64_t>(a.tokens.size()) - 1 <= a.n_drafted);
    const auto n_accepted = static_cast<int64_t>(a.tokens.size()) - 1;
    s->tokens.insert(s->tokens.end(), a.tokens.begin(), a.tokens.end());
    SERVAL_ASSERT(static_cast<int64_t>(s->tokens.size()) <= s->max_total_tokens);
    s->num_computed += n_accepted;
    // Rollback: blocks past the accepted tokens hold only rejected drafts (or
    // unused draft slots); without drafts this releases nothing.
    kv_->truncate(s->id, s->num_computed);
    s->decodes_without_draft = a.n_drafted > 0 ? 0 : s->decodes_without_draft + 1;
    // The draft wrote its catch-up, the chunk and all drafts but the last.
    if (s->draft_last_fed >= 0 && a.n_drafted > 0) s->draft_computed = s->draft_last_fed + a.n_drafted;
    s->draft_computed = std::min(s->draft_computed, s->num_computed);
    if (a.n_drafted > 0) {
      constexpr double kDecay = 0.7;  // weight of the history in the running mean
      const auto acc = static_cast<double>(n_accepted);
      s->accepted_mean = s->accepted_mean < 0 ? acc : kDecay * s->accepted_mean + (1.0 - kDecay) * acc;
    }
  }
  // Newly full blocks enter the prefix cache; only positions < num_computed,
  // all of them accepted tokens, count.
  for (const ScheduledSeq& ss : out.seqs) {
    if (Seq* s = running(ss.seq)) kv_->cache_full_blocks(s->id, s->tokens, s->num_computed, s->key);
  }
}

}  // namespace serval
