#include "engine/runner.h"

#include <algorithm>

namespace serval {

Runner::Runner(const Model& model, KvStorage& kv, ThreadPool* pool, const Model* draft, KvStorage* draft_kv)
    : kv_(kv), draft_kv_(draft_kv), forward_(model, kv, pool) {
  SERVAL_ASSERT((draft == nullptr) == (draft_kv == nullptr));
  if (draft) {
    SERVAL_ASSERT(draft_kv->n_blocks() == kv.n_blocks() && draft_kv->n_host_blocks() == kv.n_host_blocks() &&
                  draft_kv->geometry().block_size == kv.geometry().block_size);
    draft_forward_ = std::make_unique<BatchForward>(*draft, *draft_kv, pool);
  }
}

void Runner::apply_block_moves(const SchedulerOutput& out) {
  if (link_ && !out.copies.empty() && link_error_.ok()) link_error_ = link_->send_copies(out.copies);
  // Order matters: swap out before the blocks are reused by copies or swap-ins.
  for (KvStorage* kv : {&kv_, draft_kv_}) {
    if (!kv) continue;
    for (const BlockSwap& s : out.swap_out) kv->swap_out(s);
    for (const BlockSwap& s : out.swap_in) kv->swap_in(s);
    for (const BlockCopy& c : out.copies)
      if (!c.swa || kv->has_swa_pool()) kv->copy_block(c);  // a draft pool has no sliding-window pool
  }
}

Status Runner::draft(const SchedulerOutput& out, const DraftPick& pick, std::vector<std::vector<TokenId>>* drafts) {
  SERVAL_ASSERT(draft_forward_ != nullptr);
  drafts->assign(out.seqs.size(), {});
  int32_t rounds = 0;
  for (const ScheduledSeq& s : out.seqs) rounds = std::max(rounds, s.n_draft);
  // Round j feeds each drafting seq's newest token (its chunk's last token,
  // then its drafts) at position start_pos + n_tokens - 1 + j.
  for (int32_t j = 0; j < rounds; ++j) {
    batch_.tokens.clear();
    batch_.seqs.clear();
    std::vector<size_t> who;
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSeq& s = out.seqs[i];
      if (s.n_draft <= j) continue;
      SERVAL_ASSERT(s.needs_logits);
      // Round 0 catches the draft's K/V up and feeds the chunk (normally the
      // one decode token).
      if (j == 0) {
        batch_.tokens.insert(batch_.tokens.end(), s.draft_catch_up.begin(), s.draft_catch_up.end());
        batch_.tokens.insert(batch_.tokens.end(), s.tokens.begin(), s.tokens.end());
        SERVAL_ASSERT(s.draft_start_pos + (int64_t)s.draft_catch_up.size() == s.start_pos);
        batch_.seqs.push_back({s.draft_start_pos, s.n_tokens + (int32_t)s.draft_catch_up.size(), s.block_table, true, 1});
      } else {
        batch_.tokens.push_back((*drafts)[i].back());
        batch_.seqs.push_back({s.start_pos + s.n_tokens - 1 + j, 1, s.block_table, true, 1});
      }
      who.push_back(i);
    }
    SERVAL_RETURN_IF_ERROR(draft_forward_->forward(batch_, &draft_logits_));
    const size_t n_vocab = draft_logits_.size() / who.size();
    for (size_t r = 0; r < who.size(); ++r) {
      std::span<const float> row(draft_logits_.data() + r * n_vocab, n_vocab);
      (*drafts)[who[r]].push_back(pick(who[r], j, row));
    }
  }
  return {};
}

Status Runner::execute(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                       std::vector<float>* logits, std::vector<float>* hidden,
                       std::span<const LoraAdapter* const> loras) {
  SERVAL_ASSERT(loras.empty() || loras.size() == out.seqs.size());
  SERVAL_ASSERT(drafts.empty() || drafts.size() == out.seqs.size());
  auto drafts_of = [&](size_t i) -> std::span<const TokenId> {
    if (drafts.empty()) return {};
    SERVAL_ASSERT((int64_t)drafts[i].size() <= out.seqs[i].n_draft);
    return drafts[i];
  };
  batch_.tokens.clear();
  batch_.seqs.clear();
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& s = out.seqs[i];
    const auto d = drafts_of(i);
    batch_.tokens.insert(batch_.tokens.end(), s.tokens.begin(), s.tokens.end());
    batch_.tokens.insert(batch_.tokens.end(), d.begin(), d.end());
    const auto n = static_cast<int32_t>(s.n_tokens + d.size());
    SERVAL_ASSERT(!s.all_logits || d.empty());
    batch_.seqs.push_back({s.start_pos, n, s.block_table, s.needs_logits || s.all_logits,
                           s.all_logits ? n : 1 + static_cast<int32_t>(d.size()), s.want_hidden, s.swa_block_table});
    if (!loras.empty()) batch_.seqs.back().lora = loras[i];
  }
  if (link_) {
    SERVAL_RETURN_IF_ERROR(link_error_);
    SERVAL_RETURN_IF_ERROR(link_->send_batch(batch_));
  }
  return forward_.forward(batch_, logits, hidden);
}

}  // namespace serval
