// Speculative decoding in the step loop: proposing drafts (n-gram or draft
// model) and verifying them against the target's rows (engine_impl.h).
#include "engine/engine_impl.h"

#include <algorithm>

#include "engine/ngram_draft.h"
#include "sampler/speculative.h"

namespace serval {

using engine_detail::now_ns;
using engine_detail::kMaxTimedChunks;

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

}  // namespace serval
