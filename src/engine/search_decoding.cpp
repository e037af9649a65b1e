#include "engine/search_decoding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "common/status.h"

namespace serval {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

void log_softmax(std::span<const float> x, std::vector<float>* out) {
  out->resize(x.size());
  double mx = -kInf;
  for (float v : x) mx = std::max(mx, (double)v);
  if (mx == -kInf) {
    std::fill(out->begin(), out->end(), -std::numeric_limits<float>::infinity());
    return;
  }
  double sum = 0;
  for (float v : x) sum += std::exp((double)v - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < x.size(); ++i) (*out)[i] = (float)((double)x[i] - lse);
}

// ---------------------------------------------------------------------------
// HeldRows

void HeldRows::put(SeqId seq, std::span<const float> row) { rows_[seq].assign(row.begin(), row.end()); }

bool HeldRows::has_all(std::span<const SeqId> seqs) const {
  for (SeqId s : seqs)
    if (!has(s)) return false;
  return true;
}

// ---------------------------------------------------------------------------
// BeamSearch

BeamSearch::BeamSearch(BeamSearchConfig cfg, SeqId root) : cfg_(cfg) {
  SERVAL_ASSERT(cfg_.width >= 1 && cfg_.groups >= 1 && cfg_.width % cfg_.groups == 0 && cfg_.max_new_tokens >= 1);
  group_width_ = cfg_.width / cfg_.groups;
  // Every group starts from the prompt alone (Hugging Face gives the other
  // beams of a group a score of -1e9 in the first step, which is the same).
  beams_.assign((size_t)cfg_.groups, std::vector<Beam>{Beam{root, {}, 0.0}});
  hyps_.resize((size_t)cfg_.groups);
  done_.assign((size_t)cfg_.groups, false);
}

std::vector<SeqId> BeamSearch::live_seqs() const {
  std::vector<SeqId> out;
  for (const auto& g : beams_)
    for (const Beam& b : g)
      if (std::find(out.begin(), out.end(), b.seq) == out.end()) out.push_back(b.seq);
  return out;
}

bool BeamSearch::done() const {
  return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; });
}

void BeamSearch::Hyps::add(BeamHypothesis h, int32_t capacity) {
  if ((int32_t)items.size() >= capacity && !(h.score > worst)) return;
  const double score = h.score;
  items.push_back(std::move(h));
  if ((int32_t)items.size() > capacity) {
    std::vector<std::pair<double, size_t>> order;
    for (size_t i = 0; i < items.size(); ++i) order.emplace_back(items[i].score, i);
    std::sort(order.begin(), order.end());
    items.erase(items.begin() + (ptrdiff_t)order[0].second);
    worst = order[1].first;
  } else {
    worst = std::min(score, worst);
  }
}

bool BeamSearch::group_done(const Hyps& h, double best_sum, int32_t cur_len) const {
  if ((int32_t)h.items.size() < group_width_) return false;
  const double lp = cfg_.length_penalty;
  switch (cfg_.early_stopping) {
    case EarlyStopping::yes: return true;
    case EarlyStopping::heuristic: return h.worst >= best_sum / std::pow((double)cur_len, lp);
    case EarlyStopping::never: {
      const int32_t len = lp > 0 ? cfg_.max_new_tokens : cur_len;
      return h.worst >= best_sum / std::pow((double)len, lp);
    }
  }
  return false;
}

SearchPlan BeamSearch::step(const LogprobsFn& logprobs, const StopFn& stop, const std::function<SeqId()>& new_seq) {
  const int32_t cur_len = ++n_steps_;  // generated tokens after this step
  const size_t keep = 2 * (size_t)group_width_;
  const double lp_pow = cfg_.length_penalty;
  std::unordered_map<TokenId, int32_t> chosen;  // tokens picked by earlier groups in this step
  std::vector<SeqId> old = live_seqs();
  std::vector<std::vector<Beam>> next(beams_.size());
  struct Cand {
    double score;
    int32_t beam;
    TokenId token;
  };
  auto better = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.beam != b.beam) return a.beam < b.beam;
    return a.token < b.token;
  };
  std::vector<Cand> cands, row;
  for (size_t g = 0; g < beams_.size(); ++g) {
    if (done_[g]) continue;
    cands.clear();
    for (size_t b = 0; b < beams_[g].size(); ++b) {
      const Beam& beam = beams_[g][b];
      const std::span<const float> lp = logprobs(beam.seq);
      row.clear();
      for (size_t t = 0; t < lp.size(); ++t) {
        if (lp[t] == -std::numeric_limits<float>::infinity()) continue;
        double s = beam.sum_logprob + (double)lp[t];
        if (cfg_.diversity_penalty > 0) {
          auto it = chosen.find((TokenId)t);
          if (it != chosen.end()) s -= cfg_.diversity_penalty * it->second;
        }
        row.push_back({s, (int32_t)b, (TokenId)t});
      }
      const size_t k = std::min(keep, row.size());
      std::partial_sort(row.begin(), row.begin() + (ptrdiff_t)k, row.end(), better);
      cands.insert(cands.end(), row.begin(), row.begin() + (ptrdiff_t)k);
    }
    std::sort(cands.begin(), cands.end(), better);
    if (cands.size() > keep) cands.resize(keep);
    for (size_t rank = 0; rank < cands.size(); ++rank) {
      const Cand& c = cands[rank];
      const Beam& parent = beams_[g][(size_t)c.beam];
      std::vector<TokenId> tokens = parent.tokens;
      tokens.push_back(c.token);
      if (stop(c.token, cur_len) == FinishReason::stop) {
        if (rank >= (size_t)group_width_) continue;
        hyps_[g].add({std::move(tokens), c.score, c.score / std::pow((double)cur_len, lp_pow), FinishReason::stop},
                     group_width_);
      } else {
        next[g].push_back({parent.seq, std::move(tokens), c.score});
      }
      if ((int32_t)next[g].size() == group_width_) break;
    }
    for (const Beam& b : next[g]) ++chosen[b.tokens.back()];
    if (next[g].empty()) done_[g] = true;
    else done_[g] = group_done(hyps_[g], cands.front().score, cur_len);
    if (!done_[g] && cur_len >= cfg_.max_new_tokens) {
      for (Beam& b : next[g])
        hyps_[g].add({std::move(b.tokens), b.sum_logprob, b.sum_logprob / std::pow((double)cur_len, lp_pow),
                      FinishReason::length},
                     group_width_);
      done_[g] = true;
    }
    if (done_[g]) next[g].clear();
  }
  // Map the new beams onto seqs: a parent's first child continues it, the
  // others fork from it; parents without children end.
  SearchPlan plan;
  for (SeqId parent : old) {
    bool first = true;
    for (auto& g : next)
      for (Beam& b : g) {
        if (b.seq != parent) continue;
        if (first) {
          plan.advance.emplace_back(parent, b.tokens.back());
          first = false;
        } else {
          b.seq = new_seq();
          plan.fork.push_back({parent, b.seq, b.tokens.back()});
        }
      }
    if (first) plan.finish.push_back(parent);
  }
  beams_ = std::move(next);
  return plan;
}

std::vector<BeamHypothesis> BeamSearch::best(int32_t n) const {
  std::vector<BeamHypothesis> all;
  for (const Hyps& h : hyps_) all.insert(all.end(), h.items.begin(), h.items.end());
  std::stable_sort(all.begin(), all.end(),
                   [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
  if ((int32_t)all.size() > n) all.resize((size_t)n);
  return all;
}

// ---------------------------------------------------------------------------
// Contrastive search

std::vector<ContrastiveCandidate> contrastive_candidates(std::span<const float> logits, int32_t k) {
  std::vector<float> lp;
  log_softmax(logits, &lp);
  std::vector<TokenId> ids;
  for (size_t t = 0; t < lp.size(); ++t)
    if (std::exp((double)lp[t]) > 0) ids.push_back((TokenId)t);
  const size_t n = std::min(ids.size(), (size_t)std::max(k, 0));
  std::partial_sort(ids.begin(), ids.begin() + (ptrdiff_t)n, ids.end(), [&](TokenId a, TokenId b) {
    if (lp[(size_t)a] != lp[(size_t)b]) return lp[(size_t)a] > lp[(size_t)b];
    return a < b;
  });
  std::vector<ContrastiveCandidate> out;
  for (size_t i = 0; i < n; ++i) out.push_back({ids[i], (float)std::exp((double)lp[(size_t)ids[i]])});
  return out;
}

size_t contrastive_pick(std::span<const ContrastiveCandidate> cands, std::span<const float> cand_hidden,
                        std::span<const float> ctx_hidden, int64_t dim, float alpha) {
  SERVAL_ASSERT(!cands.empty() && cand_hidden.size() >= cands.size() * (size_t)dim);
  auto norm = [dim](const float* v) {
    double s = 0;
    for (int64_t i = 0; i < dim; ++i) s += (double)v[i] * v[i];
    return std::sqrt(s);
  };
  const size_t n_ctx = ctx_hidden.size() / (size_t)dim;
  std::vector<double> ctx_norm(n_ctx);
  for (size_t j = 0; j < n_ctx; ++j) ctx_norm[j] = norm(ctx_hidden.data() + j * (size_t)dim);
  size_t best = 0;
  double best_score = -kInf;
  for (size_t i = 0; i < cands.size(); ++i) {
    const float* h = cand_hidden.data() + i * (size_t)dim;
    const double hn = norm(h);
    double max_cos = -kInf;
    for (size_t j = 0; j < n_ctx; ++j) {
      const float* c = ctx_hidden.data() + j * (size_t)dim;
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += (double)h[d] * c[d];
      const double den = hn * ctx_norm[j];
      max_cos = std::max(max_cos, den > 0 ? dot / den : 0.0);
    }
    if (n_ctx == 0) max_cos = 0;
    const double score = (1.0 - alpha) * (double)cands[i].prob - alpha * max_cos;
    if (score > best_score) {
      best_score = score;
      best = i;
    }
  }
  return best;
}

}  // namespace serval
