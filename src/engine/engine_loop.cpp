// The request lifecycle (admit, events, finish, cancel) and the step loop
// (engine_impl.h).
#include "engine/engine_impl.h"

#include <algorithm>
#include <set>

#include "engine/token_trie_for.h"

namespace serval {

using engine_detail::now_ns;
using engine_detail::kMaxTimedChunks;
using engine_detail::kPromptLogitsBytes;

// Samples under the sequence's grammar (if any) and advances its state.
TokenId Engine::Impl::sample_seq(SeqState& ss, std::span<const float> logits, std::span<const TokenId> history) {
  if (!ss.grammar) return ss.sampler->sample(logits, history);
  // Tokens left for this sequence, this one included: near the end the mask
  // steers toward completing the grammar, so the output is not cut off.
  int64_t budget = -1;
  if (ss.req) budget = std::max<int64_t>(1, ss.req->max_total - (int64_t)ss.req->req.prompt.size() - ss.n_generated);
  ss.grammar->fill_mask(ss.grammar_mask, budget);
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
  sr.prefix_key = PrefixKey{rs->req.tenant_salt, rs->lora_id};
  const SamplingParams& rp = rs->req.params;
  // Drafts are not grammar-checked yet: constrained requests decode plainly.
  sr.speculate = rs->req.speculate && !rp.grammar && !rp.beam_search() && !rp.contrastive_search();
  sr.swappable = !rp.beam_search() && !rp.contrastive_search();
  if (rs->req.prompt_logprobs >= 0) {
    // Every prompt position's logits: no prefix-cache hit may skip one, and a
    // chunk's rows are bounded so the step's logits stay within kPromptLogitsBytes.
    sr.prefix_hits = false;
    sr.speculate = false;
    const auto n_vocab = (size_t)model->config().n_vocab;
    sr.max_chunk = (int32_t)std::clamp<size_t>(kPromptLogitsBytes / (n_vocab * sizeof(float)), 16, 1 << 20);
  }
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
  std::vector<EmbedJob> embeds;
  {
    std::lock_guard<std::mutex> lk(inbox_mu);
    in.swap(inbox);
    cancel_ids.swap(cancels);
    embeds.swap(embed_inbox);
  }
  for (auto& j : embeds) embed_queue.push_back(std::move(j));
  for (auto& rs : in) {
    // Disk-tier blocks of its prefix start loading now, while earlier work runs.
    if (tiers && tiers->has_disk()) kv->prefetch_prefix(rs->req.prompt, PrefixKey{rs->req.tenant_salt, rs->lora_id});
    admit(std::move(rs));
  }
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
    if (reason == FinishReason::stop) {
      if (ss.stop->stopped()) {
        ev.stop_string = ss.stop->matched_index();
      } else if (!ev.tokens.empty()) {
        const TokenId last = ev.tokens.back();
        const bool model_eog = !p.ignore_eos && std::find(eog.begin(), eog.end(), last) != eog.end();
        if (!model_eog && std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end())
          ev.stop_token = last;
      }
    }
    ev.prompt_tokens = (int64_t)rs.req.prompt.size();
    ev.completion_tokens = ss.n_generated;
    ev.cached_prompt_tokens = std::max<int64_t>(0, rs.cached_prompt_tokens);
  } else {
    ss.detokenize_ns += now_ns() - detok_start;
  }
  return ev;
}

// A preempted search seq's held rows wait for its recompute.
void Engine::Impl::drop_preempted_search_rows(const SchedulerOutput& out) {
  for (SeqId id : out.preempted) {
    auto it = seqs.find(id);
    if (it == seqs.end() || !it->second.req->search) continue;
    it->second.req->search->rows.drop(id);
    it->second.req->search->hidden.drop(id);
  }
}

// Each scheduled seq's rows: prefix-cache hits noted; a search seq's rows go
// to its search (step.searching lists those requests); every other seq that
// wanted logits advances by its verified tokens (step.advances, with the row
// of each advance's first token).
void Engine::Impl::read_rows(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                             const std::vector<float>& logits, const std::vector<float>& hidden, StepResult* step) {
  const int64_t n_vocab = model->config().n_vocab, dim = model->config().dim;
  size_t row = 0, hidden_row = 0;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& s = out.seqs[i];
    if (s.n_tokens > 1 || !s.needs_logits) step->prefill_computed += s.n_tokens;
    auto it = seqs.find(s.seq);
    if (it != seqs.end() && it->second.cached_prompt_tokens < 0) it->second.cached_prompt_tokens = s.start_pos;
    if (it != seqs.end() && it->second.req->cached_prompt_tokens < 0)
      it->second.req->cached_prompt_tokens = s.start_pos;
    if (it != seqs.end() && it->second.req->search) {
      RequestState& rs = *it->second.req;
      search_chunk(rs, s, s.needs_logits ? logits.data() + row * (size_t)n_vocab : nullptr,
                   s.want_hidden ? hidden.data() + hidden_row * (size_t)dim : nullptr);
      if (std::find(step->searching.begin(), step->searching.end(), &rs) == step->searching.end())
        step->searching.push_back(&rs);
    }
    if (s.want_hidden) hidden_row += (size_t)s.n_tokens;
    if (s.all_logits) {
      // Every token's row: the prompt positions they predict are scored; the
      // chunk's last row (with needs_logits) is the one sampled from.
      if (it != seqs.end()) score_prompt_rows(*it->second.req, s, logits.data() + row * (size_t)n_vocab);
      row += (size_t)s.n_tokens - 1;
      if (!s.needs_logits) {
        ++row;
        continue;
      }
    }
    if (!s.needs_logits) continue;
    if (it != seqs.end() && it->second.req->search) {
      ++row;
      continue;
    }
    if (it != seqs.end() && it->second.req->score_only()) {
      step->scored.push_back(s.seq);  // nothing to sample: the request ends with its prompt
      ++row;
      continue;
    }
    const std::span<const TokenId> d = drafts.empty() ? std::span<const TokenId>() : drafts[i];
    step->advances.push_back(verify(s, d, logits.data() + row * (size_t)n_vocab));
    step->first_row.push_back(row);
    row += 1 + d.size();
    if (!d.empty()) {
      ++step->spec_drafts;
      step->spec_draft_tokens += (int64_t)d.size();
      step->spec_accepted += (int64_t)step->advances.back().tokens.size() - 1;
    }
  }
}

// n > 1: once the first sample's prompt is computed, fork the other samples
// from it (they share its blocks) and let each draw its own first token from
// the same logits. The children's advances join step->advances.
void Engine::Impl::fork_samples(const std::vector<float>& logits, StepResult* step) {
  const int64_t n_vocab = model->config().n_vocab;
  const size_t n_parents = step->advances.size();
  for (size_t k = 0; k < n_parents; ++k) {
    const SeqId sid = step->advances[k].seq;
    RequestState& rs = *seqs.at(sid).req;
    if (rs.req.n <= 1 || rs.children_forked) continue;
    rs.children_forked = true;
    std::span<const float> lg(logits.data() + step->first_row[k] * (size_t)n_vocab, (size_t)n_vocab);
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
      step->advances.push_back({child, {ct}, 0});
      step->first_row.push_back(step->first_row[k]);
    }
  }
}

// The events of the step: one per advance (finishing its seq on a stop), then
// each search request's (search_step). Counts generated and closed.
void Engine::Impl::make_step_events(const std::vector<float>& logits, int64_t time_ns, StepResult* step) {
  const int64_t n_vocab = model->config().n_vocab;
  for (size_t k = 0; k < step->advances.size(); ++k) {
    const SeqId sid = step->advances[k].seq;
    SeqState& ss = seqs.at(sid);
    RequestState& rs = *ss.req;
    OutputEvent ev =
        make_event(ss, step->advances[k].tokens, logits.data() + step->first_row[k] * (size_t)n_vocab, time_ns);
    if (ss.index == 0) attach_prompt_logprobs(rs, ev);
    step->generated += (int64_t)ev.tokens.size();
    if (ev.finish != FinishReason::none) {
      finish_seq(sid, ev.finish);
      if (rs.n_open == 0) ++step->closed;
    }
    step->events.emplace_back(rs.stream.get(), std::move(ev));
  }
  for (SeqId sid : step->scored) {
    SeqState& ss = seqs.at(sid);
    RequestState& rs = *ss.req;
    OutputEvent ev = make_event(ss, {}, nullptr, time_ns, FinishReason::length);
    attach_prompt_logprobs(rs, ev);
    finish_seq(sid, ev.finish);
    if (rs.n_open == 0) ++step->closed;
    step->events.emplace_back(rs.stream.get(), std::move(ev));
  }
  const size_t n_plain_events = step->events.size();
  for (RequestState* rs : step->searching) search_step(*rs, time_ns, &step->events, &step->search_closed);
  for (size_t k = n_plain_events; k < step->events.size(); ++k)
    step->generated += (int64_t)step->events[k].second.tokens.size();
  step->closed += (int64_t)step->search_closed.size();
}

// The step's counters: KV waste (allocated-but-unfilled slots of the running
// seqs), KV bytes per seq, tokens, speculation.
void Engine::Impl::account_step(const SchedulerOutput& out, const StepResult& step, int64_t step_start_ns,
                                int64_t step_end_ns) {
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
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.steps++;
  stats.kv_seq_bytes_peak = std::max(stats.kv_seq_bytes_peak, seq_peak);
  if (decode_peak > stats.kv_seq_bytes_decode_peak) {
    stats.kv_seq_bytes_decode_peak = decode_peak;
    stats.kv_seq_bytes_decode_full = decode_full;
  }
  const double step_s = (double)(step_end_ns - step_start_ns) * 1e-9;
  stats.step_seconds += step_s;
  const int64_t moe_passes = runner->moe_layer_passes(), expert_reads = runner->expert_reads();
  if (step.prefill_computed == 0 && step.generated > 0) {
    stats.decode_steps++;
    stats.decode_step_tokens += step.generated;
    stats.decode_step_seconds += step_s;
    stats.decode_step_moe_passes += moe_passes - moe_passes_seen;
    stats.decode_step_expert_reads += expert_reads - expert_reads_seen;
  }
  moe_passes_seen = moe_passes;
  expert_reads_seen = expert_reads;
  stats.generated_tokens += step.generated;
  stats.prefill_tokens_computed += step.prefill_computed;
  stats.requests_finished += step.closed;
  stats.spec_drafts += step.spec_drafts;
  stats.spec_draft_tokens += step.spec_draft_tokens;
  stats.spec_accepted_tokens += step.spec_accepted;
  stats.spec_mean_accepted = stats.spec_drafts ? (double)stats.spec_accepted_tokens / (double)stats.spec_drafts : 0.0;
}

// Pushes the step's events and closes the requests it finished. Events go out
// only after the stats are updated, so a caller that has read a request's
// last event sees it counted.
void Engine::Impl::deliver(StepResult& step) {
  for (auto& [stream, ev] : step.events) stream->push(std::move(ev));
  for (uint64_t id : step.search_closed)
    if (auto it = requests.find(id); it != requests.end()) close_request_if_done(*it->second);
  std::vector<SeqId> ended;
  ended.reserve(step.advances.size() + step.scored.size());
  for (const SeqAdvance& a : step.advances) ended.push_back(a.seq);
  ended.insert(ended.end(), step.scored.begin(), step.scored.end());
  for (SeqId sid : ended) {
    auto it = seqs.find(sid);
    if (it == seqs.end()) continue;
    RequestState& rs = *it->second.req;
    if (rs.n_open <= 0 && requests.count(rs.id)) close_request_if_done(rs);
  }
}

// After the forward pass: the rows become tokens, forks, events and counters.
void Engine::Impl::after_step(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                              const std::vector<float>& logits, const std::vector<float>& hidden,
                              int64_t step_start_ns) {
  StepResult step;
  drop_preempted_search_rows(out);
  read_rows(out, drafts, logits, hidden, &step);
  sched->update(out, step.advances);
  fork_samples(logits, &step);
  const int64_t step_end_ns = now_ns();
  record_step_timing(out, step_start_ns, step_end_ns);
  make_step_events(logits, step_end_ns, &step);
  account_step(out, step, step_start_ns, step_end_ns);
  publish_stats();
  deliver(step);
}

void Engine::Impl::publish_stats() {
  const auto ks = kv->stats();
  size_t n_loras = 0;
  {
    std::lock_guard<std::mutex> lk(lora_mu);
    n_loras = loras.size();
  }
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
  stats.tier_hit_tokens = ks.tier_hit_tokens;
  stats.tier_load_failures = ks.tier_load_failures;
  if (tiers) stats.kv_tiers = tiers->stats();
  stats.kv_waste_ratio = waste_steps ? waste_sum / (double)waste_steps : 0.0;
  stats.running = sched->n_running();
  stats.waiting = sched->n_waiting();
  // The adapters in use (the router signal vllm:lora_requests_info).
  std::set<std::string> run_names, wait_names;
  for (const auto& [id, rs] : requests)
    if (rs->lora) (rs->scheduled_ns ? run_names : wait_names).insert(rs->req.lora);
  stats.lora_running.assign(run_names.begin(), run_names.end());
  stats.lora_waiting.clear();
  for (const std::string& n : wait_names)
    if (!run_names.count(n)) stats.lora_waiting.push_back(n);
  stats.max_loras = cfg.max_loras > 0 ? cfg.max_loras : n_loras ? Engine::kMaxLoras : 0;
}

// Blocks until there is something to do (a request, a cancel, unfinished
// work) and stepping is allowed; parks while paused (stats published first,
// so that a paused engine's stats are current). False: the engine stops.
bool Engine::Impl::wait_for_work() {
  std::unique_lock<std::mutex> lk(inbox_mu);
  for (;;) {
    if (!ops.empty()) {  // between steps, paused or not
      std::vector<std::function<void()>> run;
      run.swap(ops);
      lk.unlock();
      for (auto& op : run) op();
      publish_stats();
      lk.lock();
      continue;
    }
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
    if (!inbox.empty() || !cancels.empty() || !embed_inbox.empty() || !embed_queue.empty() ||
        sched->has_unfinished()) {
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

// rows: [s.n_tokens, n_vocab]; row j predicts position start_pos + j + 1.
// Positions already scored (a chunk recomputed after preemption) are skipped.
void Engine::Impl::score_prompt_rows(RequestState& rs, const ScheduledSeq& s, const float* rows) {
  const auto n_vocab = (size_t)model->config().n_vocab;
  const std::vector<TokenId>& prompt = rs.req.prompt;
  for (int32_t j = 0; j < s.n_tokens; ++j) {
    const int64_t pos = s.start_pos + j + 1;
    if (pos != rs.prompt_lp_next || pos >= (int64_t)prompt.size()) continue;
    rs.prompt_lp.push_back(
        compute_logprobs({rows + (size_t)j * n_vocab, n_vocab}, prompt[(size_t)pos], rs.req.prompt_logprobs));
    ++rs.prompt_lp_next;
  }
}

void Engine::Impl::attach_prompt_logprobs(RequestState& rs, OutputEvent& ev) {
  if (rs.req.prompt_logprobs < 0 || rs.prompt_lp_sent) return;
  SERVAL_ASSERT(rs.prompt_lp_next == (int64_t)rs.req.prompt.size());
  ev.prompt_logprobs = std::move(rs.prompt_lp);
  rs.prompt_lp = {};
  rs.prompt_lp_sent = true;
}

// What each scheduled seq wants besides its sampling row, in one pass:
// contrastive search reads the hidden states of its tokens; a request that
// wants prompt log-probs gets every logits row of a chunk while it still
// covers unscored prompt positions. True when any seq wants hidden states.
bool Engine::Impl::mark_wanted_rows(SchedulerOutput& out, std::vector<const LoraAdapter*>* loras) {
  bool any_hidden = false;
  loras->clear();
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    ScheduledSeq& s = out.seqs[i];
    auto it = seqs.find(s.seq);
    if (it == seqs.end()) continue;
    const RequestState& rs = *it->second.req;
    if (rs.lora) {
      loras->resize(out.seqs.size(), nullptr);
      (*loras)[i] = rs.lora.get();
    }
    s.want_hidden = rs.search && !rs.search->beam;
    any_hidden = any_hidden || s.want_hidden;
    s.all_logits = it->second.index == 0 && rs.req.prompt_logprobs >= 0 &&
                   rs.prompt_lp_next < (int64_t)rs.req.prompt.size() && s.start_pos + s.n_tokens >= rs.prompt_lp_next;
    SERVAL_ASSERT(!s.all_logits || s.n_draft == 0);
  }
  return any_hidden;
}

// A batch that the scheduler built should always run; if its forward pass
// fails anyway, its requests fail rather than the engine.
void Engine::Impl::fail_batch(const SchedulerOutput& out, const Status& st) {
  for (const ScheduledSeq& s : out.seqs) {
    auto it = seqs.find(s.seq);
    if (it == seqs.end()) continue;
    RequestState* rs = it->second.req;
    fail_request(*rs, st.with_context("forward pass"));
    requests.erase(rs->id);
  }
}

// Nothing could be scheduled this step (e.g. waiting for blocks that a cancel
// will free): stalled searches give their seqs back; do not spin.
void Engine::Impl::wait_when_blocked() {
  requeue_stalled_search();
  publish_stats();
  std::unique_lock<std::mutex> lk(inbox_mu);
  inbox_cv.wait_for(lk, std::chrono::milliseconds(5));
}

// One step: swaps and copies, drafts, the forward pass, then after_step.
void Engine::Impl::run_step(SchedulerOutput& out, StepBuffers& buf) {
  const int64_t step_start_ns = now_ns();
  runner->apply_block_moves(out);
  Status st = propose(out, &buf.drafts);
  const bool any_hidden = mark_wanted_rows(out, &buf.loras);
  if (st.ok()) st = runner->execute(out, buf.drafts, &buf.logits, any_hidden ? &buf.hidden : nullptr, buf.loras);
  if (!st.ok()) return fail_batch(out, st);
  after_step(out, buf.drafts, buf.logits, buf.hidden, step_start_ns);
}

// Shutting down: every open request, admitted or still in the inbox, gets an
// error event.
void Engine::Impl::fail_open_requests() {
  const Status st(StatusCode::resource_exhausted, "engine shutting down");
  for (auto& [id, rs] : requests) {
    OutputEvent ev;
    ev.error = st;
    rs->stream->push(std::move(ev));
  }
  for (auto& j : embed_queue) {
    j.handle->error = st;
    j.handle->finish();
  }
  // Taken out under the lock, failed after it: a notify callback may call
  // back into the engine.
  std::vector<std::unique_ptr<RequestState>> in;
  std::vector<EmbedJob> embeds;
  {
    std::lock_guard<std::mutex> lk(inbox_mu);
    in.swap(inbox);
    embeds.swap(embed_inbox);
  }
  for (auto& rs : in) {
    OutputEvent ev;
    ev.error = st;
    rs->stream->push(std::move(ev));
  }
  for (auto& j : embeds) {
    j.handle->error = st;
    j.handle->finish();
  }
}

void Engine::Impl::run_embed_step() {
  // Cancelled calls leave first.
  for (auto it = embed_queue.begin(); it != embed_queue.end();) {
    if (!it->handle->cancelled()) {
      ++it;
      continue;
    }
    it->handle->error = Status(StatusCode::invalid_argument, "embedding request cancelled");
    it->handle->finish();
    it = embed_queue.erase(it);
  }
  if (embed_queue.empty()) return;
  // Whole inputs in arrival order while they fit the step's token budget
  // (one input always runs, however long).
  std::vector<std::vector<TokenId>> batch;
  struct Span {
    EmbedJob* job;
    size_t first, count;
  };
  std::vector<Span> spans;
  int64_t tokens = 0;
  for (EmbedJob& j : embed_queue) {
    Span sp{&j, j.next, 0};
    while (j.next + sp.count < j.inputs.size()) {
      const auto& in = j.inputs[j.next + sp.count];
      if (!batch.empty() && (tokens + (int64_t)in.size() > cfg.max_batch_tokens || (int64_t)batch.size() >= cfg.max_seqs))
        break;
      tokens += (int64_t)in.size();
      batch.push_back(in);
      ++sp.count;
    }
    if (sp.count > 0) spans.push_back(sp);
    if (j.next + sp.count < j.inputs.size()) break;  // the budget is spent
  }
  const int64_t t0 = now_ns();
  std::vector<float> out;
  const Status st = embedder->embed(batch, &out);
  const int64_t t1 = now_ns();
  const size_t dim = (size_t)embedder->out_dim();
  size_t row = 0;
  for (const Span& sp : spans) {
    EmbedHandle& h = *sp.job->handle;
    if (!st.ok()) {
      h.error = st;
      sp.job->next = sp.job->inputs.size();
      continue;
    }
    h.data.insert(h.data.end(), out.begin() + (ptrdiff_t)(row * dim), out.begin() + (ptrdiff_t)((row + sp.count) * dim));
    row += sp.count;
    sp.job->next += sp.count;
  }
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.embed_inputs += (int64_t)batch.size();
    stats.embed_tokens += tokens;
    stats.embed_steps += 1;
    stats.embed_seconds += (double)(t1 - t0) * 1e-9;
  }
  while (!embed_queue.empty() && embed_queue.front().next >= embed_queue.front().inputs.size()) {
    embed_queue.front().handle->finish();
    embed_queue.pop_front();
  }
}

void Engine::Impl::loop() {
  StepBuffers buf;
  while (wait_for_work()) {
    drain_inbox();
    if (!embed_queue.empty()) run_embed_step();
    if (!sched->has_unfinished()) {
      publish_stats();
      continue;
    }
    SchedulerOutput out = sched->schedule();
    if (out.seqs.empty() && out.copies.empty() && out.swap_in.empty() && out.swap_out.empty()) {
      wait_when_blocked();
      continue;
    }
    run_step(out, buf);
  }
  fail_open_requests();
}

}  // namespace serval
