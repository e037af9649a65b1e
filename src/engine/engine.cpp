#include "serval/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "common/thread_pool.h"
#include "engine/ngram_draft.h"
#include "engine/search_decoding.h"
#include "engine/runner.h"
#include "engine/token_trie_for.h"
#include "kv_cache/kv_cache_manager.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "sampler/speculative.h"
#include "sampler/stop_matcher.h"
#include "scheduler/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr size_t kMaxTimedChunks = 64;  // RequestTiming::prefill_chunks bound

}  // namespace

// ---------------------------------------------------------------------------
// RequestStream

void RequestStream::push(OutputEvent ev) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(ev));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  notify_ = std::move(fn);
}

bool RequestStream::next_for(OutputEvent* ev, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return !q_.empty() || open_samples_ <= 0 || failed_; };
  if (timeout_ms < 0) cv_.wait(lk, ready);
  else if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready)) return false;
  if (q_.empty()) return false;
  *ev = std::move(q_.front());
  q_.pop_front();
  if (!ev->error.ok()) failed_ = true;
  else if (ev->finish != FinishReason::none) --open_samples_;
  return true;
}

bool RequestStream::next(OutputEvent* ev) { return next_for(ev, -1); }

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return q_.empty() && (open_samples_ <= 0 || failed_);
}

// ---------------------------------------------------------------------------
// parse_kv_memory

Expected<size_t> parse_kv_memory(const std::string& text) {
  const auto bad = [&] {
    return invalid_argument("--kv-memory: expected bytes (e.g. 512M, 2G) or a fraction of free RAM in (0, 1), got '" +
                            text + "'");
  };
  if (text.empty() || text.size() > 32) return bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return bad();
  }
  if (!std::isfinite(v) || v <= 0) return bad();
  const std::string suffix = text.substr(used);
  if (text.find('.') != std::string::npos && suffix.empty()) {
    if (v >= 1.0) return bad();
    std::ifstream in("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
      if (key == "MemAvailable:") return (size_t)(v * (double)kb * 1024.0);
    return invalid_argument("--kv-memory: cannot read MemAvailable from /proc/meminfo for a fraction");
  }
  double mult = 1;
  if (suffix == "" || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  const double bytes = v * mult;
  if (bytes > 1e15) return bad();
  return (size_t)bytes;
}

// ---------------------------------------------------------------------------
// Engine::Impl

struct Engine::Impl {
  struct RequestState;

  struct SeqState {
    RequestState* req = nullptr;
    int32_t index = 0;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StreamingDetokenizer> detok;
    std::unique_ptr<StopMatcher> stop;
    std::unique_ptr<GrammarMatcher> grammar;  // params.grammar's state for this sequence
    std::vector<uint64_t> grammar_mask;       // scratch: allowed tokens
    // Draft model: picks draft tokens with the request's processors; q[j] is
    // the distribution draft token j of this step was drawn from (sampling).
    std::unique_ptr<Sampler> draft_sampler;
    std::vector<std::vector<Candidate>> q;
    std::vector<TokenId> draft_history;
    int32_t n_generated = 0;
    int64_t cached_prompt_tokens = -1;  // start_pos of the first scheduled chunk: the prefix-cache hit
    bool finished = false;
    int64_t first_token_ns = 0, detokenize_ns = 0;
    double compute_s = 0;
  };

  // Beam or contrastive search of one request (search_decoding.h). Its seqs
  // get bare SeqStates; `out` samples (processed logits), detokenizes and
  // stops on behalf of the request.
  struct SearchState {
    std::unique_ptr<SeqState> out;
    std::unique_ptr<BeamSearch> beam;
    HeldRows rows;  // beam: log-probs; contrastive: processed logits, per live seq
    // Contrastive: the seq whose context is committed, the candidates forked
    // from it (cand_seqs[0] == main after an expansion; empty before the
    // first), their last hidden states and the context's hidden states.
    SeqId main = 0;
    std::vector<ContrastiveCandidate> cands;
    std::vector<SeqId> cand_seqs;
    HeldRows hidden;
    std::vector<float> ctx_hidden;  // [positions, dim]
    std::vector<SeqId> live() const {
      if (beam) return beam->live_seqs();
      return cand_seqs.empty() ? std::vector<SeqId>{main} : cand_seqs;
    }
  };

  struct RequestState {
    uint64_t id = 0;
    std::unique_ptr<SearchState> search;
    int64_t cached_prompt_tokens = -1;  // the first chunk's start: the prefix-cache hit
    Request req;
    std::shared_ptr<RequestStream> stream;
    std::vector<SeqId> seqs;       // [n]; children get ids when forked
    int32_t n_open = 0;
    bool children_forked = false;
    int64_t max_total = 0;         // prompt + max new tokens, capped by the context
    int64_t arrival_ns = 0, scheduled_ns = 0;
    std::vector<RequestTiming::Chunk> prefill_chunks;
  };

  std::shared_ptr<const Model> model;
  Tokenizer tok;
  EngineConfig cfg;
  std::vector<TokenId> eog;
  std::shared_ptr<const TokenTrie> token_trie;  // built on the first grammar request

  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<KvStorage> storage;
  std::unique_ptr<KvStorage> draft_storage;  // draft model's pool (same block ids)
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<Runner> runner;

  // Inbox (any thread -> loop).
  std::mutex inbox_mu;
  std::condition_variable inbox_cv;
  std::vector<std::unique_ptr<RequestState>> inbox;
  std::vector<uint64_t> cancels;
  bool stopping = false;
  std::atomic<uint64_t> next_request_id{1};
  // Stepping control (Engine::pause), under inbox_mu: a pause is requested,
  // the loop may still run steps_allowed iterations, the loop is parked.
  bool pause_requested = false;
  int steps_allowed = 0;
  bool parked = false;
  std::condition_variable parked_cv;

  // Loop-owned.
  std::map<uint64_t, std::unique_ptr<RequestState>> requests;
  std::map<SeqId, SeqState> seqs;
  SeqId next_seq = 1;
  std::vector<float> verify_scratch;
  double waste_sum = 0;
  int64_t waste_steps = 0;

  mutable std::mutex stats_mu;
  EngineStats stats;

  std::thread loop_thread;

  Impl(std::shared_ptr<const Model> m, Tokenizer t, EngineConfig c) : model(std::move(m)), tok(std::move(t)), cfg(c) {}

  void loop();
  bool wait_for_work();
  void drain_inbox();
  void admit(std::unique_ptr<RequestState> rs);
  void fail_request(RequestState& rs, const Status& st);
  void finish_seq(SeqId id, FinishReason reason);
  void close_request_if_done(RequestState& rs);
  SeqState make_seq_state(RequestState* rs, int32_t index, const SamplingParams& p);
  Status propose(const SchedulerOutput& out, std::vector<std::vector<TokenId>>* drafts);
  SeqAdvance verify(const ScheduledSeq& s, std::span<const TokenId> draft, const float* rows);
  void after_step(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                  const std::vector<float>& logits, const std::vector<float>& hidden, int64_t step_start_ns);
  void record_step_timing(const SchedulerOutput& out, int64_t step_start_ns, int64_t step_end_ns);
  void publish_stats();
  TokenId sample_seq(SeqState& ss, std::span<const float> logits, std::span<const TokenId> history);
  OutputEvent make_event(SeqState& ss, std::span<const TokenId> tokens, const float* logits_rows, int64_t time_ns,
                         FinishReason final_reason = FinishReason::none);
  // Search decoding (search_decoding.h).
  void search_chunk(RequestState& rs, const ScheduledSeq& s, const float* logits_row, const float* hidden_rows);
  void search_step(RequestState& rs, int64_t time_ns, std::vector<std::pair<RequestStream*, OutputEvent>>* events,
                   std::vector<uint64_t>* closed);
  void apply_plan(RequestState& rs, const SearchPlan& plan);
  void contrastive_expand(RequestState& rs, SeqId from);
  void requeue_stalled_search();

  static RequestTiming timing_of(const SeqState& ss, int64_t finished_ns) {
    RequestTiming t;
    t.arrival_ns = ss.req->arrival_ns;
    t.scheduled_ns = ss.req->scheduled_ns;
    t.first_token_ns = ss.first_token_ns;
    t.finished_ns = finished_ns;
    t.prefill_chunks = ss.req->prefill_chunks;
    t.detokenize_ns = ss.detokenize_ns;
    t.compute_s = ss.compute_s;
    return t;
  }
};

// Samples under the sequence's grammar (if any) and advances its state.
TokenId Engine::Impl::sample_seq(SeqState& ss, std::span<const float> logits, std::span<const TokenId> history) {
  if (!ss.grammar) return ss.sampler->sample(logits, history);
  ss.grammar->fill_mask(ss.grammar_mask);
  const TokenId t = ss.sampler->sample(logits, history, ss.grammar_mask);
  ss.grammar->accept_token(t);
  return t;
}

void Engine::Impl::fail_request(RequestState& rs, const Status& st) {
  OutputEvent ev;
  ev.error = st;
  rs.stream->push(std::move(ev));
  for (SeqId s : rs.seqs) {
    if (s == 0) continue;
    auto it = seqs.find(s);
    if (it == seqs.end()) continue;
    if (!it->second.finished) sched->finish(s);
    seqs.erase(it);
  }
  rs.n_open = 0;
}

// A new sequence's sampler, detokenizer, stop matcher, grammar state and
// draft sampler.
Engine::Impl::SeqState Engine::Impl::make_seq_state(RequestState* rs, int32_t index, const SamplingParams& p) {
  SeqState ss;
  ss.req = rs;
  ss.index = index;
  ss.sampler = std::make_unique<Sampler>(p, (int32_t)model->config().n_vocab);
  ss.detok = std::make_unique<StreamingDetokenizer>(tok);
  ss.stop = std::make_unique<StopMatcher>(p.stop);
  if (p.grammar) {
    if (!token_trie) token_trie = token_trie_for(tok);
    ss.grammar = std::make_unique<GrammarMatcher>(p.grammar, token_trie);
  }
  if (cfg.spec.mode == SpecConfig::Mode::draft_model) {
    SamplingParams dp = p;
    // The draft's own random stream: independent of the target's, reproducible with a seed.
    if (dp.seed) dp.seed = *dp.seed ^ 0x5bd1e9955bd1e995ull;
    ss.draft_sampler = std::make_unique<Sampler>(dp, (int32_t)model->config().n_vocab);
  }
  return ss;
}

void Engine::Impl::admit(std::unique_ptr<RequestState> rs) {
  const SeqId id = next_seq++;
  SeqRequest sr;
  sr.seq = id;
  sr.prompt = rs->req.prompt;
  sr.priority = rs->req.priority;
  sr.max_total_tokens = rs->max_total;
  sr.prefix_key = PrefixKey{rs->req.tenant_salt, 0};
  const SamplingParams& rp = rs->req.params;
  // Drafts are not grammar-checked yet: constrained requests decode plainly.
  sr.speculate = rs->req.speculate && !rp.grammar && !rp.beam_search() && !rp.contrastive_search();
  sr.swappable = !rp.beam_search() && !rp.contrastive_search();
  if (rp.contrastive_search()) {
    // Contrastive search needs the hidden state of every prompt token: no
    // prefix-cache hit may skip them (a key of its own; its forks share it).
    sr.prefix_key.adapter_id = ~rs->id;
    // The candidates of the last committed token need one position more.
    sr.max_total_tokens = rs->max_total + 1;
  }
  Status st = sched->add(std::move(sr));
  if (!st.ok()) {
    OutputEvent ev;
    ev.error = st;
    rs->stream->push(std::move(ev));
    return;
  }
  rs->seqs.assign((size_t)rs->req.n, 0);
  rs->seqs[0] = id;
  rs->n_open = rs->req.n;
  if (rp.beam_search() || rp.contrastive_search()) {
    rs->children_forked = true;  // the search forks its own seqs
    rs->search = std::make_unique<SearchState>();
    rs->search->out = std::make_unique<SeqState>(make_seq_state(rs.get(), 0, rp));
    rs->search->main = id;
    if (rp.beam_search()) {
      BeamSearchConfig bc;
      bc.width = rp.beam_width;
      bc.groups = rp.num_beam_groups;
      bc.length_penalty = rp.length_penalty;
      bc.early_stopping = rp.early_stopping;
      bc.diversity_penalty = rp.diversity_penalty;
      bc.max_new_tokens = (int32_t)(rs->max_total - (int64_t)rs->req.prompt.size());
      rs->search->beam = std::make_unique<BeamSearch>(bc, id);
    }
    SeqState bare;
    bare.req = rs.get();
    seqs.emplace(id, std::move(bare));
  } else {
    seqs.emplace(id, make_seq_state(rs.get(), 0, rp));
  }
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.prompt_tokens += (int64_t)rs->req.prompt.size();
  }
  requests.emplace(rs->id, std::move(rs));
}

void Engine::Impl::drain_inbox() {
  std::vector<std::unique_ptr<RequestState>> in;
  std::vector<uint64_t> cancel_ids;
  {
    std::lock_guard<std::mutex> lk(inbox_mu);
    in.swap(inbox);
    cancel_ids.swap(cancels);
  }
  for (auto& rs : in) admit(std::move(rs));
  for (uint64_t rid : cancel_ids) {
    auto it = requests.find(rid);
    if (it == requests.end()) continue;
    RequestState& rs = *it->second;
    for (SeqId s : rs.seqs) {
      auto sit = seqs.find(s);
      if (s == 0 || sit == seqs.end() || sit->second.finished) continue;
      sched->finish(s);
      sit->second.finished = true;
    }
    OutputEvent ev;
    ev.error = Status(StatusCode::invalid_argument, "request cancelled");
    rs.stream->push(std::move(ev));
    for (SeqId s : rs.seqs) seqs.erase(s);
    requests.erase(it);
  }
}

void Engine::Impl::finish_seq(SeqId id, FinishReason reason) {
  SeqState& ss = seqs.at(id);
  ss.finished = true;
  sched->finish(id);
  --ss.req->n_open;
  (void)reason;
}

void Engine::Impl::close_request_if_done(RequestState& rs) {
  if (rs.n_open > 0) return;
  for (SeqId s : rs.seqs) seqs.erase(s);
  requests.erase(rs.id);
}

// Queue end, prefill chunks and each sequence's share of the step's wall time
// (by tokens run). Loop thread only; no locks.
void Engine::Impl::record_step_timing(const SchedulerOutput& out, int64_t step_start_ns, int64_t step_end_ns) {
  int64_t total = 0;
  for (const ScheduledSeq& s : out.seqs) total += s.n_tokens;
  const double step_s = (double)(step_end_ns - step_start_ns) * 1e-9;
  for (const ScheduledSeq& s : out.seqs) {
    auto it = seqs.find(s.seq);
    if (it == seqs.end()) continue;
    SeqState& ss = it->second;
    RequestState& rs = *ss.req;
    if (rs.scheduled_ns == 0) rs.scheduled_ns = step_start_ns;
    if (total > 0) ss.compute_s += step_s * (double)s.n_tokens / (double)total;
    if (s.start_pos < (int64_t)rs.req.prompt.size() && rs.prefill_chunks.size() < kMaxTimedChunks)
      rs.prefill_chunks.push_back({step_start_ns, step_end_ns, s.n_tokens});
  }
}

Status Engine::Impl::propose(const SchedulerOutput& out, std::vector<std::vector<TokenId>>* drafts) {
  drafts->clear();
  bool any = false;
  for (const ScheduledSeq& s : out.seqs) any = any || s.n_draft > 0;
  if (!any) return {};
  const SpecConfig& sp = cfg.spec;
  if (sp.mode == SpecConfig::Mode::ngram) {
    drafts->assign(out.seqs.size(), {});
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSeq& s = out.seqs[i];
      if (s.n_draft == 0) continue;
      auto d = ngram_draft(sched->tokens(s.seq), sp.ngram_min, sp.ngram_max, s.n_draft);
      if ((int32_t)d.size() >= std::max(1, sp.draft_min)) (*drafts)[i] = std::move(d);
    }
    return {};
  }
  auto pick = [&](size_t i, int32_t j, std::span<const float> lg) {
    SeqState& ss = seqs.at(out.seqs[i].seq);
    if (j == 0) {
      ss.q.clear();
      const auto& h = sched->tokens(out.seqs[i].seq);
      ss.draft_history.assign(h.begin(), h.end());
    }
    const auto dist = ss.draft_sampler->distribution(lg, ss.draft_history);
    TokenId d = dist.front().token;
    if (!ss.draft_sampler->is_greedy()) {
      ss.q.emplace_back(dist.begin(), dist.end());
      d = Sampler::pick(dist, ss.draft_sampler->rng().uniform());
    }
    ss.draft_history.push_back(d);
    return d;
  };
  return runner->draft(out, pick, drafts);
}

// The target's verdict on one seq's logits rows (its chunk's last token, then
// one per draft): the accepted drafts, then one token of the target's own.
SeqAdvance Engine::Impl::verify(const ScheduledSeq& s, std::span<const TokenId> draft, const float* rows) {
  const auto n_vocab = (size_t)model->config().n_vocab;
  SeqState& ss = seqs.at(s.seq);
  Sampler& smp = *ss.sampler;
  SeqAdvance adv{s.seq, {}, (int32_t)draft.size()};
  const auto& tokens = sched->tokens(s.seq);
  if (draft.empty()) {
    adv.tokens.push_back(sample_seq(ss, {rows, n_vocab}, tokens));
    return adv;
  }
  SERVAL_ASSERT(!ss.grammar);  // constrained sequences do not speculate (admit)
  // Penalties look back over the accepted drafts too.
  std::vector<TokenId> history(tokens.begin(), tokens.end());
  for (size_t j = 0;; ++j) {
    std::span<const float> lg(rows + j * n_vocab, n_vocab);
    if (j == draft.size() || smp.is_greedy()) {
      const TokenId t = smp.sample(lg, history);
      adv.tokens.push_back(t);
      if (j == draft.size() || t != draft[j]) return adv;
    } else {
      const Candidate point{draft[j], 0.0f, 1.0f};  // an n-gram draft is a point mass
      const std::span<const Candidate> q = ss.draft_sampler ? std::span<const Candidate>(ss.q[j])
                                                            : std::span<const Candidate>(&point, 1);
      const DraftVerdict v = verify_draft(smp.distribution(lg, history), q, draft[j], smp.rng(), &verify_scratch);
      adv.tokens.push_back(v.token);
      if (!v.accepted) return adv;
    }
    history.push_back(draft[j]);
  }
}

// The event for `tokens` of one sample (logits_rows: their rows, for
// logprobs): each token in turn, a stop ends the sample there and the rest is
// dropped. On a finish (or final_reason when no stop came first) the event
// carries the finish fields; the caller ends the seq.
OutputEvent Engine::Impl::make_event(SeqState& ss, std::span<const TokenId> tokens, const float* logits_rows,
                                     int64_t time_ns, FinishReason final_reason) {
  RequestState& rs = *ss.req;
  const SamplingParams& p = rs.req.params;
  const auto n_vocab = (size_t)model->config().n_vocab;
  OutputEvent ev;
  ev.index = ss.index;
  ev.time_ns = time_ns;
  if (ss.first_token_ns == 0) ss.first_token_ns = time_ns;
  FinishReason reason = FinishReason::none;
  const int64_t detok_start = now_ns();
  for (size_t j = 0; j < tokens.size() && reason == FinishReason::none; ++j) {
    const TokenId t = tokens[j];
    ++ss.n_generated;
    ev.tokens.push_back(t);
    if (p.logprobs > 0 && logits_rows)
      ev.logprobs.push_back(compute_logprobs({logits_rows + j * n_vocab, n_vocab}, t, p.logprobs));
    reason = check_token_stop(p, t, ss.n_generated, eog);
    if (reason != FinishReason::stop) {
      if (ss.stop->feed(ss.detok->push(t), ev.text)) reason = FinishReason::stop;
    }
    if (reason == FinishReason::none && (int64_t)rs.req.prompt.size() + ss.n_generated >= rs.max_total)
      reason = FinishReason::length;
  }
  if (reason == FinishReason::none) reason = final_reason;
  if (reason != FinishReason::none) {
    if (!ss.stop->stopped()) {
      std::string tail = ss.detok->flush(), out_tail;
      if (!ss.stop->feed(tail, out_tail)) ss.stop->finish(out_tail);
      ev.text += out_tail;
    }
    ss.detokenize_ns += now_ns() - detok_start;
    ev.timing = timing_of(ss, time_ns);
    ev.finish = reason;
    ev.prompt_tokens = (int64_t)rs.req.prompt.size();
    ev.completion_tokens = ss.n_generated;
    ev.cached_prompt_tokens = std::max<int64_t>(0, rs.cached_prompt_tokens);
  } else {
    ss.detokenize_ns += now_ns() - detok_start;
  }
  return ev;
}

// A search seq's chunk ran: keep its next-token row (beam: log-probs;
// contrastive: processed logits) and, for contrastive search, hidden states.
void Engine::Impl::search_chunk(RequestState& rs, const ScheduledSeq& s, const float* logits_row,
                                const float* hidden_rows) {
  SearchState& st = *rs.search;
  const auto n_vocab = (size_t)model->config().n_vocab, dim = (size_t)model->config().dim;
  if (hidden_rows && st.cand_seqs.empty() && s.seq == st.main) {
    // The prompt's hidden states, by position (a recompute rewrites equal values).
    const size_t end = (size_t)(s.start_pos + s.n_tokens) * dim;
    if (st.ctx_hidden.size() < end) st.ctx_hidden.resize(end);
    std::copy(hidden_rows, hidden_rows + (size_t)s.n_tokens * dim, st.ctx_hidden.begin() + s.start_pos * (int64_t)dim);
  } else if (hidden_rows && logits_row) {
    const float* last = hidden_rows + (size_t)(s.n_tokens - 1) * dim;
    st.hidden.put(s.seq, {last, dim});
  }
  if (!logits_row) return;
  const auto processed = st.out->sampler->processed_logits({logits_row, n_vocab}, sched->tokens(s.seq));
  if (st.beam) {
    std::vector<float> lp;
    log_softmax(processed, &lp);
    st.rows.put(s.seq, lp);
  } else {
    st.rows.put(s.seq, processed);
  }
}

void Engine::Impl::apply_plan(RequestState& rs, const SearchPlan& plan) {
  std::vector<SeqAdvance> adv;
  for (const auto& [seq, token] : plan.advance) adv.push_back({seq, {token}, 0});
  sched->update(SchedulerOutput{}, adv);
  for (const SearchPlan::Fork& f : plan.fork) {
    sched->fork(f.parent, f.child, f.token);
    SeqState bare;
    bare.req = &rs;
    seqs.emplace(f.child, std::move(bare));
  }
  for (SeqId id : plan.finish) {
    sched->finish(id);
    seqs.erase(id);
  }
  rs.search->rows.clear();
  rs.search->hidden.clear();
}

// Contrastive search: the top-k candidates after `from`'s context run as
// `from` (the first) and forks of it (the others).
void Engine::Impl::contrastive_expand(RequestState& rs, SeqId from) {
  SearchState& st = *rs.search;
  st.main = from;
  st.cands = contrastive_candidates(st.rows.get(from), rs.req.params.top_k);
  if (st.cands.empty()) st.cands.push_back({0, 1.0f});  // everything banned: the sampler's tie-break
  SearchPlan plan;
  plan.advance.emplace_back(from, st.cands[0].token);
  st.cand_seqs.assign(1, from);
  for (size_t i = 1; i < st.cands.size(); ++i) {
    const SeqId child = next_seq++;
    plan.fork.push_back({from, child, st.cands[i].token});
    st.cand_seqs.push_back(child);
  }
  apply_plan(rs, plan);
}

// Nothing could run: search seqs that hold their rows may be keeping the
// blocks (or running slots) a sibling of theirs, or of another search, waits
// for. The newest such request gives its held seqs back (they recompute).
void Engine::Impl::requeue_stalled_search() {
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
    RequestState& rs = *it->second;
    if (!rs.search || rs.n_open <= 0) continue;
    bool any = false;
    for (SeqId id : rs.search->live()) {
      if (!rs.search->rows.has(id) || !sched->contains(id) || sched->state(id) != Scheduler::SeqState::running)
        continue;
      sched->requeue(id);
      rs.search->rows.drop(id);
      rs.search->hidden.drop(id);
      any = true;
    }
    if (any) return;
  }
}

// One search step of a request whose live seqs all have their rows.
void Engine::Impl::search_step(RequestState& rs, int64_t time_ns,
                               std::vector<std::pair<RequestStream*, OutputEvent>>* events,
                               std::vector<uint64_t>* closed) {
  SearchState& st = *rs.search;
  if (rs.n_open <= 0 || !st.rows.has_all(st.live())) return;
  const SamplingParams& p = rs.req.params;
  auto end_request = [&] {
    for (SeqId id : st.live()) {
      sched->finish(id);
      seqs.erase(id);
    }
    st.cand_seqs.clear();
    rs.seqs.clear();
    rs.n_open = 0;
    closed->push_back(rs.id);
  };
  if (st.beam) {
    const auto token_stop = [&](TokenId t, int32_t n) {
      return check_token_stop(p, t, n, eog) == FinishReason::stop ? FinishReason::stop : FinishReason::none;
    };
    apply_plan(rs, st.beam->step([&](SeqId s) { return st.rows.get(s); }, token_stop, [&] { return next_seq++; }));
    rs.seqs = st.live();
    if (!st.beam->done()) return;
    const auto best = st.beam->best(rs.req.n);
    for (int32_t i = 0; i < rs.req.n; ++i) {
      SeqState hs = make_seq_state(&rs, i, p);
      hs.first_token_ns = st.out->first_token_ns ? st.out->first_token_ns : time_ns;
      const bool have = (size_t)i < best.size();  // fewer hypotheses than n: empty ones
      OutputEvent ev = make_event(hs, have ? std::span<const TokenId>(best[(size_t)i].tokens) : std::span<const TokenId>(),
                                  nullptr, time_ns, have ? best[(size_t)i].finish : FinishReason::stop);
      if (have) ev.search_score = best[(size_t)i].score;
      events->emplace_back(rs.stream.get(), std::move(ev));
    }
    end_request();
    return;
  }
  // Contrastive search.
  if (st.cand_seqs.empty()) {  // the prompt's logits: the first candidates
    if (st.out->first_token_ns == 0) st.out->first_token_ns = time_ns;
    contrastive_expand(rs, st.main);
    rs.seqs = st.live();
    return;
  }
  const auto dim = (size_t)model->config().dim;
  std::vector<float> cand_hidden;
  for (SeqId c : st.cand_seqs) {
    const auto h = st.hidden.get(c);
    cand_hidden.insert(cand_hidden.end(), h.begin(), h.end());
  }
  const size_t win = contrastive_pick(st.cands, cand_hidden, st.ctx_hidden, (int64_t)dim, p.penalty_alpha);
  const SeqId winner = st.cand_seqs[win];
  st.ctx_hidden.insert(st.ctx_hidden.end(), cand_hidden.begin() + (ptrdiff_t)(win * dim),
                       cand_hidden.begin() + (ptrdiff_t)((win + 1) * dim));
  const TokenId token = st.cands[win].token;
  OutputEvent ev = make_event(*st.out, std::span<const TokenId>(&token, 1), nullptr, time_ns);
  const bool finished = ev.finish != FinishReason::none;
  events->emplace_back(rs.stream.get(), std::move(ev));
  if (finished) {
    end_request();
    return;
  }
  std::vector<float> next_row(st.rows.get(winner).begin(), st.rows.get(winner).end());
  SearchPlan drop;
  for (SeqId c : st.cand_seqs)
    if (c != winner) drop.finish.push_back(c);
  apply_plan(rs, drop);
  st.rows.put(winner, next_row);
  contrastive_expand(rs, winner);
  rs.seqs = st.live();
}

void Engine::Impl::after_step(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                              const std::vector<float>& logits, const std::vector<float>& hidden,
                              int64_t step_start_ns) {
  const int64_t n_vocab = model->config().n_vocab, dim = model->config().dim;
  std::vector<SeqAdvance> advances;
  std::vector<size_t> first_row;  // per advance: its logits row for its first token
  std::vector<RequestState*> searching;  // search requests that got rows in this step
  size_t row = 0, hidden_row = 0;
  int64_t prefill_computed = 0, spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
  for (SeqId id : out.preempted) {  // a preempted search seq's held rows wait for its recompute
    auto it = seqs.find(id);
    if (it == seqs.end() || !it->second.req->search) continue;
    it->second.req->search->rows.drop(id);
    it->second.req->search->hidden.drop(id);
  }
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& s = out.seqs[i];
    if (s.n_tokens > 1 || !s.needs_logits) prefill_computed += s.n_tokens;
    auto it = seqs.find(s.seq);
    if (it != seqs.end() && it->second.cached_prompt_tokens < 0) it->second.cached_prompt_tokens = s.start_pos;
    if (it != seqs.end() && it->second.req->cached_prompt_tokens < 0)
      it->second.req->cached_prompt_tokens = s.start_pos;
    if (it != seqs.end() && it->second.req->search) {
      RequestState& rs = *it->second.req;
      search_chunk(rs, s, s.needs_logits ? logits.data() + row * (size_t)n_vocab : nullptr,
                   s.want_hidden ? hidden.data() + hidden_row * (size_t)dim : nullptr);
      if (std::find(searching.begin(), searching.end(), &rs) == searching.end()) searching.push_back(&rs);
    }
    if (s.want_hidden) hidden_row += (size_t)s.n_tokens;
    if (!s.needs_logits) continue;
    if (it != seqs.end() && it->second.req->search) {
      ++row;
      continue;
    }
    const std::span<const TokenId> d = drafts.empty() ? std::span<const TokenId>() : drafts[i];
    advances.push_back(verify(s, d, logits.data() + row * (size_t)n_vocab));
    first_row.push_back(row);
    row += 1 + d.size();
    if (!d.empty()) {
      ++spec_drafts;
      spec_draft_tokens += (int64_t)d.size();
      spec_accepted += (int64_t)advances.back().tokens.size() - 1;
    }
  }
  sched->update(out, advances);

  // n > 1: once the first sample's prompt is computed, fork the other samples
  // from it (they share its blocks) and let each draw its own first token
  // from the same logits.
  const size_t n_parents = advances.size();
  for (size_t k = 0; k < n_parents; ++k) {
    const SeqId sid = advances[k].seq;
    RequestState& rs = *seqs.at(sid).req;
    if (rs.req.n <= 1 || rs.children_forked) continue;
    rs.children_forked = true;
    std::span<const float> lg(logits.data() + first_row[k] * (size_t)n_vocab, (size_t)n_vocab);
    for (int32_t i = 1; i < rs.req.n; ++i) {
      const SeqId child = next_seq++;
      SamplingParams p = rs.req.params;
      if (p.seed) p.seed = *p.seed + (uint64_t)i;  // distinct but reproducible streams
      // A fresh grammar state: the child's first token is drawn here.
      SeqState cs = make_seq_state(&rs, i, p);
      std::vector<TokenId> history(rs.req.prompt);
      const TokenId ct = sample_seq(cs, lg, history);
      sched->fork(sid, child, ct);  // shares the parent's blocks; its own first token
      rs.seqs[(size_t)i] = child;
      seqs.emplace(child, std::move(cs));
      advances.push_back({child, {ct}, 0});
      first_row.push_back(first_row[k]);
    }
  }
  const int64_t step_end_ns = now_ns();
  record_step_timing(out, step_start_ns, step_end_ns);

  int64_t generated = 0, closed = 0;
  // Events are pushed only after the stats below are updated, so a caller that
  // has read a request's last event sees it counted.
  std::vector<std::pair<RequestStream*, OutputEvent>> events;
  for (size_t k = 0; k < advances.size(); ++k) {
    const SeqId sid = advances[k].seq;
    SeqState& ss = seqs.at(sid);
    RequestState& rs = *ss.req;
    OutputEvent ev = make_event(ss, advances[k].tokens, logits.data() + first_row[k] * (size_t)n_vocab, step_end_ns);
    generated += (int64_t)ev.tokens.size();
    if (ev.finish != FinishReason::none) {
      finish_seq(sid, ev.finish);
      if (rs.n_open == 0) ++closed;
    }
    events.emplace_back(rs.stream.get(), std::move(ev));
  }
  std::vector<uint64_t> search_closed;
  const size_t n_plain_events = events.size();
  for (RequestState* rs : searching) search_step(*rs, step_end_ns, &events, &search_closed);
  for (size_t k = n_plain_events; k < events.size(); ++k) generated += (int64_t)events[k].second.tokens.size();
  closed += (int64_t)search_closed.size();
  // KV waste: allocated-but-unfilled slots of the running sequences.
  int64_t alloc = 0, filled = 0;
  size_t seq_peak = 0, decode_peak = 0, decode_full = 0;
  for (const ScheduledSeq& s : out.seqs) {
    alloc += (int64_t)s.block_table.size() * cfg.block_size;
    filled += s.start_pos + s.n_tokens;
    // KV bytes this sequence holds in both pools.
    size_t swa_held = 0;
    for (BlockId b : s.swa_block_table) swa_held += b >= 0;
    const size_t bpb = stats.kv_bytes_per_block, bpb_swa = stats.kv_swa_bytes_per_block;
    const size_t held = s.block_table.size() * bpb + swa_held * bpb_swa;
    seq_peak = std::max(seq_peak, held);
    if (s.n_tokens == 1 && held > decode_peak) {
      decode_peak = held;
      decode_full = s.block_table.size() * (bpb + bpb_swa);
    }
  }
  if (alloc > 0) {
    waste_sum += (double)(alloc - filled) / (double)alloc;
    ++waste_steps;
  }
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.steps++;
    stats.kv_seq_bytes_peak = std::max(stats.kv_seq_bytes_peak, seq_peak);
    if (decode_peak > stats.kv_seq_bytes_decode_peak) {
      stats.kv_seq_bytes_decode_peak = decode_peak;
      stats.kv_seq_bytes_decode_full = decode_full;
    }
    stats.step_seconds += (double)(step_end_ns - step_start_ns) * 1e-9;
    stats.generated_tokens += generated;
    stats.prefill_tokens_computed += prefill_computed;
    stats.requests_finished += closed;
    stats.spec_drafts += spec_drafts;
    stats.spec_draft_tokens += spec_draft_tokens;
    stats.spec_accepted_tokens += spec_accepted;
    stats.spec_mean_accepted =
        stats.spec_drafts ? (double)stats.spec_accepted_tokens / (double)stats.spec_drafts : 0.0;
  }
  publish_stats();
  for (auto& [stream, ev] : events) stream->push(std::move(ev));
  for (uint64_t id : search_closed)
    if (auto it = requests.find(id); it != requests.end()) close_request_if_done(*it->second);
  for (const SeqAdvance& a : advances) {
    auto it = seqs.find(a.seq);
    if (it == seqs.end()) continue;
    RequestState& rs = *it->second.req;
    if (rs.n_open <= 0 && requests.count(rs.id)) close_request_if_done(rs);
  }
}

void Engine::Impl::publish_stats() {
  const auto ks = kv->stats();
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.preemptions = sched->n_preemptions();
  stats.prefix_query_tokens = ks.prefix_query_tokens;
  stats.prefix_hit_tokens = ks.prefix_hit_tokens;
  stats.kv_blocks_total = kv->n_blocks();
  stats.kv_blocks_used = ks.used_blocks;
  stats.kv_blocks_peak = ks.peak_used_blocks;
  stats.kv_swa_blocks_total = kv->n_swa_blocks();
  stats.kv_swa_blocks_used = ks.swa_used_blocks;
  stats.kv_swa_blocks_peak = ks.swa_peak_used_blocks;
  stats.kv_swa_blocks_released = ks.swa_released;
  if (!runner->expert_tokens().empty()) {
    stats.expert_tokens = runner->expert_tokens();
    stats.n_expert = (int32_t)model->config().n_expert;
  }
  stats.prefix_cached_blocks = ks.cached_blocks;
  stats.kv_waste_ratio = waste_steps ? waste_sum / (double)waste_steps : 0.0;
  stats.running = sched->n_running();
  stats.waiting = sched->n_waiting();
}

// Blocks until there is something to do (a request, a cancel, unfinished
// work) and stepping is allowed; parks while paused (stats published first,
// so that a paused engine's stats are current). False: the engine stops.
bool Engine::Impl::wait_for_work() {
  std::unique_lock<std::mutex> lk(inbox_mu);
  for (;;) {
    if (stopping) return false;
    if (pause_requested && steps_allowed == 0) {
      if (!parked) {
        lk.unlock();
        publish_stats();
        lk.lock();
        if (stopping || !pause_requested || steps_allowed > 0) continue;
        parked = true;
        parked_cv.notify_all();
      }
      inbox_cv.wait(lk);
      continue;
    }
    parked = false;
    if (!inbox.empty() || !cancels.empty() || sched->has_unfinished()) {
      if (pause_requested) --steps_allowed;
      return true;
    }
    if (pause_requested) {
      steps_allowed = 0;  // nothing to step: Engine::step returns early
      continue;
    }
    inbox_cv.wait(lk);
  }
}

void Engine::Impl::loop() {
  std::vector<float> logits, hidden;
  std::vector<std::vector<TokenId>> drafts;
  for (;;) {
    if (!wait_for_work()) break;
    drain_inbox();
    if (!sched->has_unfinished()) {
      publish_stats();
      continue;
    }
    SchedulerOutput out = sched->schedule();
    if (out.seqs.empty() && out.copies.empty() && out.swap_in.empty() && out.swap_out.empty()) {
      // Nothing could be scheduled this step (e.g. waiting for blocks that a
      // cancel will free); do not spin.
      requeue_stalled_search();
      publish_stats();
      std::unique_lock<std::mutex> lk(inbox_mu);
      inbox_cv.wait_for(lk, std::chrono::milliseconds(5));
      continue;
    }
    const int64_t step_start_ns = now_ns();
    runner->apply_block_moves(out);
    Status st = propose(out, &drafts);
    bool any_hidden = false;
    for (ScheduledSeq& s : out.seqs) {  // contrastive search reads the hidden states
      auto it = seqs.find(s.seq);
      s.want_hidden = it != seqs.end() && it->second.req->search && !it->second.req->search->beam;
      any_hidden = any_hidden || s.want_hidden;
    }
    if (st.ok()) st = runner->execute(out, drafts, &logits, any_hidden ? &hidden : nullptr);
    if (!st.ok()) {
      // A batch that the scheduler built should always run; fail its requests
      // rather than the engine.
      for (const ScheduledSeq& s : out.seqs) {
        auto it = seqs.find(s.seq);
        if (it == seqs.end()) continue;
        RequestState* rs = it->second.req;
        fail_request(*rs, st.with_context("forward pass"));
        requests.erase(rs->id);
      }
      continue;
    }
    after_step(out, drafts, logits, hidden, step_start_ns);
  }
  // Shutting down: every open request gets an error event.
  for (auto& [id, rs] : requests) {
    OutputEvent ev;
    ev.error = Status(StatusCode::resource_exhausted, "engine shutting down");
    rs->stream->push(std::move(ev));
  }
  std::lock_guard<std::mutex> lk(inbox_mu);
  for (auto& rs : inbox) {
    OutputEvent ev;
    ev.error = Status(StatusCode::resource_exhausted, "engine shutting down");
    rs->stream->push(std::move(ev));
  }
}

// ---------------------------------------------------------------------------
// Engine

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->stopping = true;
  }
  impl_->inbox_cv.notify_all();
  impl_->parked_cv.notify_all();
  if (impl_->loop_thread.joinable()) impl_->loop_thread.join();
}

void Engine::pause() {
  std::unique_lock<std::mutex> lk(impl_->inbox_mu);
  impl_->pause_requested = true;
  impl_->inbox_cv.notify_all();  // an idle loop wakes to park
  impl_->parked_cv.wait(lk, [&] { return impl_->parked || impl_->stopping; });
}

void Engine::resume() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->pause_requested = false;
    impl_->steps_allowed = 0;
    impl_->parked = false;
  }
  impl_->inbox_cv.notify_all();
}

void Engine::step(int n) {
  std::unique_lock<std::mutex> lk(impl_->inbox_mu);
  if (!impl_->pause_requested || n <= 0) return;
  impl_->steps_allowed = n;
  impl_->parked = false;
  impl_->inbox_cv.notify_all();
  impl_->parked_cv.wait(lk, [&] { return impl_->parked || impl_->stopping; });
}

bool Engine::paused() const {
  std::lock_guard<std::mutex> lk(impl_->inbox_mu);
  return impl_->pause_requested;
}

namespace {

// Speculation settings in range; a draft model with exactly the target's vocabulary.
Status check_spec_config(const SpecConfig& sp, const Model& target, const Tokenizer& tok) {
  if (sp.mode == SpecConfig::Mode::none) return {};
  const auto range = [](const char* name, int32_t v, int32_t lo, int32_t hi) -> Status {
    if (v >= lo && v <= hi) return {};
    return invalid_argument(std::string(name) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi) +
                            ", got " + std::to_string(v));
  };
  SERVAL_RETURN_IF_ERROR(range("--draft-max", sp.draft_max, 1, Scheduler::kMaxDraft));
  SERVAL_RETURN_IF_ERROR(range("--draft-min", sp.draft_min, 0, sp.draft_max));
  if (sp.mode == SpecConfig::Mode::ngram) {
    SERVAL_RETURN_IF_ERROR(range("--ngram-max", sp.ngram_max, 1, 64));
    return range("--ngram-min", sp.ngram_min, 1, sp.ngram_max);
  }
  if (!sp.draft_model) return invalid_argument("speculative decoding with a draft model: no draft model given");
  const ModelConfig& dc = sp.draft_model->config();
  if (dc.n_vocab != target.config().n_vocab)
    return invalid_argument("draft model: vocabulary of " + std::to_string(dc.n_vocab) +
                            " tokens, the target's has " + std::to_string(target.config().n_vocab));
  auto dt = Tokenizer::from_gguf(sp.draft_model->file());
  if (!dt.ok()) return dt.status().with_context("draft model tokenizer");
  if (dt->n_vocab() != tok.n_vocab())
    return invalid_argument("draft model: tokenizer has " + std::to_string(dt->n_vocab()) + " tokens, the target's " +
                            std::to_string(tok.n_vocab()));
  for (TokenId t = 0; t < tok.n_vocab(); ++t) {
    const std::string a = dt->token_to_piece(t, true), b = tok.token_to_piece(t, true);
    if (a != b)
      return invalid_argument("draft model: vocabulary differs from the target's at token " + std::to_string(t) +
                              " ('" + a + "' vs '" + b + "')");
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Model> model, const Tokenizer& tok,
                                                 EngineConfig cfg) {
  const ModelConfig& mc = model->config();
  if (cfg.block_size < 1 || cfg.block_size > 1024)
    return invalid_argument("block size: expected 1..1024, got " + std::to_string(cfg.block_size));
  if (cfg.max_batch_tokens < 1) return invalid_argument("max batch tokens must be >= 1");
  if (cfg.max_seqs < 1) return invalid_argument("max seqs must be >= 1");
  if (cfg.max_model_len <= 0) cfg.max_model_len = std::min<int64_t>(mc.n_ctx_train, 4096);
  if (tok.n_vocab() != mc.n_vocab)
    return invalid_argument("tokenizer has " + std::to_string(tok.n_vocab()) + " tokens, the model " +
                            std::to_string(mc.n_vocab));
  SERVAL_RETURN_IF_ERROR(check_spec_config(cfg.spec, *model, tok));
  auto impl = std::make_unique<Impl>(std::move(model), tok, cfg);
  const Model& m = *impl->model;
  const Model* draft = cfg.spec.mode == SpecConfig::Mode::draft_model ? cfg.spec.draft_model.get() : nullptr;
  if (std::string why = kv_type_check(cfg.kv_type, mc.head_dim); !why.empty()) return invalid_argument(why);
  if (draft)
    if (std::string why = kv_type_check(cfg.kv_type, draft->config().head_dim); !why.empty())
      return invalid_argument("draft model: " + why);
  KvGeometry g{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), cfg.block_size, cfg.kv_type};
  KvGeometry dg{draft ? (int32_t)draft->config().n_layers : 0, draft ? (int32_t)draft->config().kv_dim() : 0,
                cfg.block_size, cfg.kv_type};
  // Sliding-window layers get a pool of their own, unless the window covers
  // the whole context anyway (nothing to free) or swa_full asks otherwise.
  const int64_t window = mc.sliding_window;
  if (mc.has_swa() && !cfg.swa_full && window < cfg.max_model_len) g.swa_layers = mc.layer_swa;
  const bool swa = g.n_swa_layers() > 0;
  // The draft's pool mirrors the target's block ids: --kv-memory pays for both.
  const size_t bpb = g.bytes_per_main_block() + (draft ? dg.bytes_per_block() : 0);
  const size_t bpb_swa = g.bytes_per_swa_block();
  auto blocks_for = [&](int64_t n) { return (n + cfg.block_size - 1) / cfg.block_size; };
  int64_t n_swa_blocks = 0;
  if (swa) {
    // Each running sequence holds its window (plus the block being filled
    // and one boundary); a step's prefill chunks hold their tokens on top,
    // until the next step releases what they slid past. A quarter more keeps
    // recent windows for prefix-cache hits. At most half the memory, never
    // more blocks than the main pool, and at least one sequence's worst step.
    const int64_t per_seq = blocks_for(window - 1) + 2;
    const int64_t want = (cfg.max_seqs * per_seq + blocks_for(cfg.max_batch_tokens) + cfg.max_seqs) * 5 / 4;
    const int64_t least = blocks_for(cfg.max_batch_tokens + window) + 2;
    const int64_t half = (int64_t)(cfg.kv_memory_bytes / 2 / bpb_swa);
    n_swa_blocks = std::max(least, std::min(want, half));
    const int64_t rest = (int64_t)cfg.kv_memory_bytes - n_swa_blocks * (int64_t)bpb_swa;
    const int64_t n_main = rest > 0 ? rest / (int64_t)bpb : 0;
    if (n_main < n_swa_blocks) n_swa_blocks = std::max<int64_t>(1, (int64_t)(cfg.kv_memory_bytes / (bpb + bpb_swa)));
  }
  const int64_t n_blocks =
      (int64_t)((cfg.kv_memory_bytes - (size_t)n_swa_blocks * bpb_swa) / bpb);
  const int64_t n_host = swa ? 0 : (int64_t)(cfg.swap_memory_bytes / bpb);
  if (n_blocks < 1)
    return invalid_argument("--kv-memory " + std::to_string(cfg.kv_memory_bytes) +
                            " bytes holds no KV block (one block takes " + std::to_string(bpb + bpb_swa) + ")");
  if (n_blocks > (1 << 30) || n_host > (1 << 30) || n_swa_blocks > (1 << 30))
    return invalid_argument("KV memory is too large");
  auto storage = KvStorage::create(g, (int32_t)n_blocks, (int32_t)n_host, (int32_t)n_swa_blocks);
  if (!storage.ok()) return storage.status();
  impl->storage = std::make_unique<KvStorage>(std::move(storage.value()));
  if (draft) {
    auto ds = KvStorage::create(dg, (int32_t)n_blocks, (int32_t)n_host);
    if (!ds.ok()) return ds.status();
    impl->draft_storage = std::make_unique<KvStorage>(std::move(ds.value()));
  }
  impl->pool = std::make_unique<ThreadPool>(cfg.n_threads > 0 ? cfg.n_threads : ThreadPool::default_threads());
  KvCacheConfig kc;
  kc.n_blocks = (int32_t)n_blocks;
  kc.block_size = cfg.block_size;
  kc.enable_prefix_caching = cfg.enable_prefix_caching;
  kc.n_host_blocks = (int32_t)n_host;
  kc.n_swa_blocks = (int32_t)n_swa_blocks;
  kc.swa_window = swa ? (int32_t)window : 0;
  // A random hash key per process, so no tenant can aim for collisions (hits
  // are verified exactly anyway; this just keeps the map well spread).
  std::random_device rd;
  kc.hash_k0 = ((uint64_t)rd() << 32) ^ rd();
  kc.hash_k1 = ((uint64_t)rd() << 32) ^ rd();
  impl->kv = std::make_unique<KvCacheManager>(kc);
  SchedulerConfig sc;
  sc.max_batch_tokens = cfg.max_batch_tokens;
  sc.max_seqs = cfg.max_seqs;
  sc.max_model_len = cfg.max_model_len;
  sc.enable_chunked_prefill = cfg.enable_chunked_prefill;
  sc.preemption = n_host > 0 ? SchedulerConfig::Preemption::swap : SchedulerConfig::Preemption::recompute;
  sc.aging_per_step = cfg.aging_per_step;
  if (cfg.spec.mode != SpecConfig::Mode::none) {
    sc.draft_max = cfg.spec.draft_max;
    sc.draft_min = cfg.spec.draft_min;
    sc.track_draft_kv = cfg.spec.mode == SpecConfig::Mode::draft_model;
  }
  SERVAL_RETURN_IF_ERROR(Scheduler::validate(sc));
  impl->sched = std::make_unique<Scheduler>(sc, impl->kv.get());
  impl->runner = std::make_unique<Runner>(m, *impl->storage, impl->pool.get(), draft, impl->draft_storage.get());
  for (TokenId t = 0; t < impl->tok.n_vocab(); ++t)
    if (impl->tok.is_eog(t)) impl->eog.push_back(t);
  impl->stats.kv_blocks_total = (int32_t)n_blocks;
  impl->stats.kv_swa_blocks_total = (int32_t)n_swa_blocks;
  impl->stats.kv_bytes_per_block = bpb;
  impl->stats.kv_swa_bytes_per_block = bpb_swa;
  Impl* raw = impl.get();
  std::unique_ptr<Engine> e(new Engine(std::move(impl)));
  raw->loop_thread = std::thread([raw] { raw->loop(); });
  return e;
}

// Search decoding within the engine's bounds: the seqs of one request must
// be able to run at once (max_seqs, the KV pool).
Status Engine::check_search_request(const Request& req, int64_t max_total) const {
  const SamplingParams& p = req.params;
  const EngineConfig& cfg = impl_->cfg;
  if (!p.beam_search() && !p.contrastive_search()) return {};
  const int32_t limit = std::min(cfg.max_beam_width, cfg.max_seqs);
  const char* field = p.beam_search() ? "beam_width" : "top_k";
  const int32_t width = p.beam_search() ? p.beam_width : p.top_k;
  if (width > limit)
    return invalid_argument(std::string(field) + ": expected at most " + std::to_string(limit) +
                            " on this server, got " + std::to_string(width));
  if (p.beam_search() && req.n > p.beam_width)
    return invalid_argument("n: expected at most beam_width (" + std::to_string(p.beam_width) + "), got " +
                            std::to_string(req.n));
  if (p.contrastive_search() && req.n != 1)
    return invalid_argument("n: expected 1 with contrastive search, got " + std::to_string(req.n));
  if ((int64_t)req.prompt.size() >= max_total)
    return invalid_argument("prompt: " + std::to_string(req.prompt.size()) +
                            " tokens leave no room for contrastive search in the context of " +
                            std::to_string(cfg.max_model_len) + " tokens");
  const int64_t blocks = impl_->kv->blocks_for(max_total) * width;
  if (blocks > impl_->kv->n_blocks())
    return invalid_argument(std::string(field) + ": " + std::to_string(width) + " sequences of up to " +
                            std::to_string(max_total) + " tokens need " + std::to_string(blocks) +
                            " KV blocks, the pool has " + std::to_string(impl_->kv->n_blocks()));
  return {};
}

Expected<std::shared_ptr<RequestStream>> Engine::submit(Request req) {
  const ModelConfig& mc = impl_->model->config();
  const EngineConfig& cfg = impl_->cfg;
  if (req.prompt.empty()) return invalid_argument("prompt: must not be empty");
  if ((int64_t)req.prompt.size() >= cfg.max_model_len)
    return invalid_argument("prompt: " + std::to_string(req.prompt.size()) +
                            " tokens leave no room to generate in the context of " +
                            std::to_string(cfg.max_model_len) + " tokens");
  for (TokenId t : req.prompt)
    if (t < 0 || t >= mc.n_vocab)
      return invalid_argument("prompt: token id " + std::to_string(t) + " is out of range [0, " +
                              std::to_string(mc.n_vocab) + ")");
  if (req.n < 1 || req.n > cfg.max_n)
    return invalid_argument("n: expected a value in [1, " + std::to_string(cfg.max_n) + "], got " +
                            std::to_string(req.n));
  SERVAL_RETURN_IF_ERROR(req.params.validate((int32_t)mc.n_vocab));
  const int64_t max_new = req.params.max_tokens ? *req.params.max_tokens : cfg.max_model_len;
  // Contrastive search runs its candidates one position past the output.
  const int64_t context = cfg.max_model_len - (req.params.contrastive_search() ? 1 : 0);
  const int64_t max_total = std::min<int64_t>(context, (int64_t)req.prompt.size() + max_new);
  SERVAL_RETURN_IF_ERROR(check_search_request(req, max_total));
  auto rs = std::make_unique<Impl::RequestState>();
  rs->id = impl_->next_request_id++;
  rs->arrival_ns = now_ns();
  rs->max_total = max_total;
  rs->stream = std::make_shared<RequestStream>(rs->id, req.n);
  rs->req = std::move(req);
  auto stream = rs->stream;
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    if (impl_->stopping) return Status(StatusCode::resource_exhausted, "engine shutting down");
    impl_->inbox.push_back(std::move(rs));
  }
  impl_->inbox_cv.notify_all();
  return stream;
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->cancels.push_back(request_id);
  }
  impl_->inbox_cv.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->stats;
}

EngineInfo Engine::info() const {
  EngineInfo i;
  const auto& f = impl_->model->file();
  auto name = f.get_string("general.name");
  i.model_name = name.ok() && !name->empty() ? *name : std::string("model");
  i.architecture = impl_->model->config().arch;
  i.n_vocab = impl_->model->config().n_vocab;
  i.max_model_len = impl_->cfg.max_model_len;
  if (auto t = f.get_string("tokenizer.chat_template"); t.ok()) i.chat_template = *t;
  i.kv_bytes_per_token = impl_->storage->geometry().bytes_per_token() +
                         (impl_->draft_storage ? impl_->draft_storage->geometry().bytes_per_token() : 0);
  return i;
}

const Tokenizer& Engine::tokenizer() const { return impl_->tok; }
const Model& Engine::model() const { return *impl_->model; }
const EngineConfig& Engine::config() const { return impl_->cfg; }

}  // namespace serval
