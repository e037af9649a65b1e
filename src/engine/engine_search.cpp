// Beam and contrastive search inside the step loop: the glue between the
// engine's seqs and search_decoding.h's plans (engine_impl.h).
#include "engine/engine_impl.h"

#include <algorithm>

namespace serval {

using engine_detail::now_ns;
using engine_detail::kMaxTimedChunks;

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

}  // namespace serval
