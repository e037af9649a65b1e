// Search decoding in the engine (beam, diverse beam, contrastive search)
// against slow references in this file: every prefix is recomputed from
// scratch with the reference forward pass (no KV cache sharing), and beam
// search is checked against an exhaustive enumeration.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "engine/engine_test_util.h"
#include "engine/search_decoding.h"
#include "kv_cache/kv_storage.h"
#include "model/reference_forward.h"

namespace serval {
namespace {

// Logits after `tokens` and the final-normed hidden state of every position,
// computed from scratch.
struct RefRun {
  std::vector<float> logits;
  std::vector<std::vector<float>> hidden;
};

RefRun ref_run(const std::vector<TokenId>& tokens) {
  const Model& m = *stories().model;
  const ModelConfig& c = m.config();
  ReferenceForward f(m, (int64_t)tokens.size() + 1);
  RefRun r;
  r.logits.resize((size_t)c.n_vocab);
  for (TokenId t : tokens) {
    r.hidden.emplace_back((size_t)c.dim);
    EXPECT_TRUE(f.eval(t, r.logits, r.hidden.back()).ok());
  }
  return r;
}

// log p(v) over the tokens in `allowed` (all tokens when empty).
std::vector<double> ref_logprobs(const std::vector<float>& logits, const std::vector<TokenId>& allowed) {
  std::vector<double> out(logits.size(), -INFINITY);
  std::vector<TokenId> ids = allowed;
  if (ids.empty())
    for (size_t t = 0; t < logits.size(); ++t) ids.push_back((TokenId)t);
  double mx = -INFINITY, sum = 0;
  for (TokenId t : ids) mx = std::max(mx, (double)logits[(size_t)t]);
  for (TokenId t : ids) sum += std::exp((double)logits[(size_t)t] - mx);
  for (TokenId t : ids) out[(size_t)t] = (double)logits[(size_t)t] - mx - std::log(sum);
  return out;
}

struct Result {
  std::vector<TokenId> tokens;
  double score = NAN;
  FinishReason finish = FinishReason::none;
};

// Collects a submitted request's n results (waits up to 30 s).
std::vector<Result> drain(const Expected<std::shared_ptr<RequestStream>>& s, const Request& r) {
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return {};
  std::vector<Result> out((size_t)r.n);
  OutputEvent ev;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(*s)->done() && std::chrono::steady_clock::now() < deadline) {
    if (!(*s)->next_for(&ev, 100)) continue;
    EXPECT_TRUE(ev.error.ok()) << ev.error.message();
    if (!ev.error.ok()) break;
    Result& o = out[(size_t)ev.index];
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.search_score) o.score = *ev.search_score;
    if (ev.finish != FinishReason::none) o.finish = ev.finish;
  }
  EXPECT_TRUE((*s)->done()) << "request did not finish";
  return out;
}

std::vector<Result> run(Engine& e, const Request& r) { return drain(e.submit(r), r); }

void expect_pool_empty(Engine& e) { EXPECT_EQ(settled_stats(e).kv_blocks_used, 0); }

EngineConfig small_config() {
  EngineConfig cfg;
  cfg.n_threads = 1;
  cfg.max_model_len = 64;
  cfg.block_size = 4;
  cfg.kv_type = KvType::f32;  // the slow references below compute in F32 throughout
  return cfg;
}

const std::vector<TokenId> kPrompt = {1, 403, 407};

std::vector<TokenId> long_prompt(int n) {
  std::vector<TokenId> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(300 + i);
  return p;
}

// An engine, and when crowded a pool of n_blocks KV blocks already holding a
// greedy request with a long prompt (so that sequences get preempted). The
// crowded engine is paused: the request under test, submitted next, joins the
// greedy one in the same step when submit_and_resume resumes it.
struct Crowd {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<RequestStream> other;
};

Crowd crowd(bool crowded, int n_blocks, int32_t max_batch_tokens, int prompt_len, int max_tokens) {
  EngineConfig cfg = small_config();
  const ModelConfig& mc = stories().model->config();
  const KvGeometry g{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), cfg.block_size};
  if (crowded) cfg.kv_memory_bytes = (size_t)n_blocks * g.bytes_per_block();
  cfg.max_batch_tokens = max_batch_tokens;
  Crowd c;
  c.engine = make_engine(cfg);
  if (crowded) {
    c.engine->pause();
    auto o = c.engine->submit(greedy_request(long_prompt(prompt_len), max_tokens, 0));
    EXPECT_TRUE(o.ok());
    if (o.ok()) c.other = *o;
  }
  return c;
}

std::vector<Result> submit_and_resume(Engine& e, const Request& r) {
  auto s = e.submit(r);
  e.resume();
  return drain(s, r);
}

// Calls `attempt(crowded)` alone, then crowded; `attempt` checks its results
// and returns the engine's preemptions, which the crowded run must have had.
template <class F>
void alone_then_crowded(F attempt) {
  attempt(false);
  EXPECT_GT(attempt(true), 0) << "the crowded run was meant to preempt";
}

// Beam search with a beam wider than every step's set of running candidates
// returns the exhaustive search's best sequences: 4 allowed tokens (one of
// them a stop token), at most 3 generated tokens: 40 sequences in all.
TEST(SearchDecoding, BeamSearchFindsTheExhaustiveBest) {
  const int32_t n_vocab = (int32_t)stories().model->config().n_vocab;
  // The 4 likeliest tokens after the prompt; the 4th stops.
  const RefRun first = ref_run(kPrompt);
  std::vector<TokenId> allowed((size_t)n_vocab);
  for (TokenId t = 0; t < n_vocab; ++t) allowed[(size_t)t] = t;
  std::partial_sort(allowed.begin(), allowed.begin() + 4, allowed.end(),
                    [&](TokenId a, TokenId b) { return first.logits[(size_t)a] > first.logits[(size_t)b]; });
  allowed.resize(4);
  const TokenId stop = allowed[3];
  const int max_new = 3;

  struct Seq {
    std::vector<TokenId> tokens;
    double sum = 0;
  };
  std::vector<Seq> all;
  std::function<void(const Seq&)> grow = [&](const Seq& s) {
    std::vector<TokenId> ctx = kPrompt;
    ctx.insert(ctx.end(), s.tokens.begin(), s.tokens.end());
    const auto lp = ref_logprobs(ref_run(ctx).logits, allowed);
    for (TokenId a : allowed) {
      Seq n = s;
      n.tokens.push_back(a);
      n.sum += lp[(size_t)a];
      if (a == stop || (int)n.tokens.size() == max_new) all.push_back(n);
      else grow(n);
    }
  };
  grow(Seq{});
  ASSERT_EQ(all.size(), 40u);

  auto e = make_engine(small_config());
  for (const float lp : {1.0f, 0.0f, 2.0f, -1.0f}) {
    for (const EarlyStopping es : {EarlyStopping::heuristic, EarlyStopping::never}) {
      std::vector<std::pair<double, size_t>> ranked;
      for (size_t i = 0; i < all.size(); ++i)
        ranked.emplace_back(all[i].sum / std::pow((double)all[i].tokens.size(), lp), i);
      std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
      const size_t n = 8;
      ASSERT_GT(ranked[n - 1].first - ranked[n].first, 1e-4) << "a near tie at the cut; pick other tokens";

      Request r;
      r.prompt = kPrompt;
      r.n = (int32_t)n;
      r.params.beam_width = 16;
      r.params.length_penalty = lp;
      r.params.early_stopping = es;
      r.params.max_tokens = max_new;
      r.params.stop_token_ids = {stop};
      for (TokenId t = 0; t < n_vocab; ++t)
        if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) r.params.logit_bias.push_back({t, -100.0f});
      const auto got = run(*e, r);
      ASSERT_EQ(got.size(), n);
      for (size_t i = 0; i < n; ++i) {
        const Seq& want = all[ranked[i].second];
        EXPECT_EQ(got[i].tokens, want.tokens) << "lp " << lp << " rank " << i;
        EXPECT_NEAR(got[i].score, ranked[i].first, 1e-4) << "lp " << lp << " rank " << i;
        EXPECT_EQ(got[i].finish, want.tokens.back() == stop ? FinishReason::stop : FinishReason::length);
      }
    }
  }
  expect_pool_empty(*e);
}

// Hugging Face's group beam search, written plainly: every beam's logits
// recomputed from scratch, all candidates of a group sorted.
struct RefHyp {
  std::vector<TokenId> tokens;
  double score;
};

struct RefBeamOptions {
  int W = 4, G = 1;
  double lambda = 0, lp = 1.0;
  int max_new = 5;
  EarlyStopping es = EarlyStopping::heuristic;
  // Log-probabilities of the next token after the generated `tokens`; whether a token stops.
  std::function<std::vector<double>(const std::vector<TokenId>& tokens)> logprobs;
  std::function<bool(TokenId)> is_stop;
};

// On stories260K after kPrompt, recomputed from scratch.
RefBeamOptions on_stories(int W, int G, double lambda, double lp, int max_new) {
  RefBeamOptions o;
  o.W = W, o.G = G, o.lambda = lambda, o.lp = lp, o.max_new = max_new;
  o.logprobs = [](const std::vector<TokenId>& tokens) {
    std::vector<TokenId> ctx = kPrompt;
    ctx.insert(ctx.end(), tokens.begin(), tokens.end());
    return ref_logprobs(ref_run(ctx).logits, {});
  };
  o.is_stop = [](TokenId t) { return stories().tok->is_eog(t); };
  return o;
}

std::vector<RefHyp> ref_group_beam_search(const RefBeamOptions& o) {
  const int W = o.W, G = o.G, max_new = o.max_new;
  const double lambda = o.lambda, lp = o.lp;
  const int gw = W / G;
  struct Beam {
    std::vector<TokenId> tokens;
    double sum;
  };
  std::vector<std::vector<Beam>> groups((size_t)G, {Beam{{}, 0.0}});
  std::vector<std::vector<RefHyp>> hyps((size_t)G);
  std::vector<bool> done((size_t)G, false);
  auto add = [&](std::vector<RefHyp>& h, RefHyp x) {
    double worst = INFINITY;
    for (const RefHyp& y : h) worst = std::min(worst, y.score);
    if ((int)h.size() >= gw && !(x.score > worst)) return;
    h.push_back(std::move(x));
    if ((int)h.size() > gw) {
      size_t lo = 0;
      for (size_t i = 1; i < h.size(); ++i)
        if (h[i].score < h[lo].score) lo = i;
      h.erase(h.begin() + (ptrdiff_t)lo);
    }
  };
  for (int step = 1; step <= max_new; ++step) {
    std::map<TokenId, int> chosen;
    for (int g = 0; g < G; ++g) {
      if (done[(size_t)g]) continue;
      struct Cand {
        double score;
        size_t beam;
        TokenId token;
      };
      std::vector<Cand> cands;
      for (size_t b = 0; b < groups[(size_t)g].size(); ++b) {
        const auto lps = o.logprobs(groups[(size_t)g][b].tokens);
        for (size_t v = 0; v < lps.size(); ++v)
          if (lps[v] > -INFINITY) cands.push_back({groups[(size_t)g][b].sum + lps[v] - lambda * chosen[(TokenId)v], b, (TokenId)v});
      }
      std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.score > b.score; });
      cands.resize(std::min(cands.size(), (size_t)(2 * gw)));
      std::vector<Beam> next;
      for (size_t rank = 0; rank < cands.size() && (int)next.size() < gw; ++rank) {
        Beam nb = groups[(size_t)g][cands[rank].beam];
        nb.tokens.push_back(cands[rank].token);
        nb.sum = cands[rank].score;
        if (o.is_stop(cands[rank].token)) {
          if ((int)rank < gw) add(hyps[(size_t)g], {nb.tokens, nb.sum / std::pow((double)step, lp)});
        } else {
          next.push_back(nb);
        }
      }
      for (const Beam& b : next) ++chosen[b.tokens.back()];
      double worst = INFINITY;
      for (const RefHyp& y : hyps[(size_t)g]) worst = std::min(worst, y.score);
      const bool full = (int)hyps[(size_t)g].size() >= gw;
      const double len = o.es == EarlyStopping::never && lp > 0 ? max_new : step;
      done[(size_t)g] = next.empty() || (full && (o.es == EarlyStopping::yes ||
                                                  worst >= cands[0].score / std::pow(len, lp)));
      if (!done[(size_t)g] && step == max_new) {
        for (const Beam& b : next) add(hyps[(size_t)g], {b.tokens, b.sum / std::pow((double)step, lp)});
        done[(size_t)g] = true;
      }
      groups[(size_t)g] = done[(size_t)g] ? std::vector<Beam>{} : next;
    }
  }
  std::vector<RefHyp> all;
  for (const auto& h : hyps) all.insert(all.end(), h.begin(), h.end());
  std::stable_sort(all.begin(), all.end(), [](const RefHyp& a, const RefHyp& b) { return a.score > b.score; });
  return all;
}

// BeamSearch itself against the reference on a made-up model whose
// log-probabilities are a hash of the prefix and whose stop token is common:
// every early_stopping mode, length penalties of both signs, groups.
TEST(SearchDecoding, BeamSearchStepsMatchTheReferenceOnAHashModel) {
  constexpr int kVocab = 8;
  auto logits_of = [](const std::vector<TokenId>& tokens) {
    uint64_t h = 1469598103934665603ull;
    for (TokenId t : tokens) h = (h ^ (uint64_t)(t + 1)) * 1099511628211ull;
    std::vector<float> l(kVocab);
    for (int v = 0; v < kVocab; ++v) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      l[(size_t)v] = (float)((h >> 40) % 1000) / 250.0f;  // [0, 4)
    }
    l[0] += 1.0f;  // token 0 stops, often
    return l;
  };
  int early_stops = 0;
  for (const EarlyStopping es : {EarlyStopping::heuristic, EarlyStopping::yes, EarlyStopping::never})
    for (const double lp : {1.0, -0.5, 2.0})
      for (const auto& [W, G, lambda] : {std::tuple{4, 1, 0.0}, std::tuple{4, 2, 0.7}, std::tuple{6, 3, 1.5}}) {
        const int max_new = 7;
        // Both sides see the same float log-probabilities.
        std::map<std::vector<TokenId>, std::vector<float>> memo;
        auto lps = [&](const std::vector<TokenId>& tokens) -> const std::vector<float>& {
          auto it = memo.find(tokens);
          if (it == memo.end()) {
            std::vector<float> lp_f;
            log_softmax(logits_of(tokens), &lp_f);
            it = memo.emplace(tokens, lp_f).first;
          }
          return it->second;
        };
        RefBeamOptions o;
        o.W = W, o.G = G, o.lambda = lambda, o.lp = lp, o.max_new = max_new, o.es = es;
        o.logprobs = [&](const std::vector<TokenId>& t) {
          const auto& f = lps(t);
          return std::vector<double>(f.begin(), f.end());
        };
        o.is_stop = [](TokenId t) { return t == 0; };
        const auto want = ref_group_beam_search(o);

        BeamSearchConfig cfg{W, G, lp, es, lambda, max_new};
        BeamSearch bs(cfg, 1);
        std::map<SeqId, std::vector<TokenId>> seq_tokens{{1, {}}};
        SeqId next_id = 2;
        int steps = 0;
        while (!bs.done()) {
          const SearchPlan plan = bs.step([&](SeqId s) { return std::span<const float>(lps(seq_tokens.at(s))); },
                                          [](TokenId t, int32_t) { return t == 0 ? FinishReason::stop : FinishReason::none; },
                                          [&] { return next_id++; });
          for (const auto& f : plan.fork) {  // before the parents advance: a fork copies the parent's old tokens
            seq_tokens[f.child] = seq_tokens.at(f.parent);
            seq_tokens[f.child].push_back(f.token);
          }
          for (const auto& [seq, token] : plan.advance) seq_tokens.at(seq).push_back(token);
          for (SeqId id : plan.finish) seq_tokens.erase(id);
          for (const auto& g : bs.groups())
            for (const auto& b : g) EXPECT_EQ(seq_tokens.at(b.seq), b.tokens);  // the plan keeps seqs = beams
          ASSERT_LE(++steps, max_new);
        }
        if (steps < max_new) ++early_stops;
        EXPECT_TRUE(seq_tokens.empty()) << "every seq ends";
        const auto got = bs.best(W);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].tokens, want[i].tokens) << "es " << (int)es << " lp " << lp << " W " << W << " G " << G;
          EXPECT_NEAR(got[i].score, want[i].score, 1e-9);
        }
      }
  EXPECT_GT(early_stops, 0) << "no configuration stopped early: the early_stopping modes went untested";
}

Request diverse_request() {
  Request r;
  r.prompt = kPrompt;
  r.n = 4;
  r.params.beam_width = 4;
  r.params.num_beam_groups = 2;
  r.params.diversity_penalty = 2.0f;
  r.params.max_tokens = 5;
  return r;
}

TEST(SearchDecoding, DiverseBeamSearchMatchesTheSlowReference) {
  const auto want = ref_group_beam_search(on_stories(4, 2, 2.0, 1.0, 5));
  ASSERT_EQ(want.size(), 4u);
  // The penalty matters: plain beam search of the same width finds others.
  const auto plain = ref_group_beam_search(on_stories(4, 1, 0.0, 1.0, 5));
  bool differs = false;
  for (size_t i = 0; i < 4; ++i) differs = differs || plain[i].tokens != want[i].tokens;
  EXPECT_TRUE(differs);
  // Alone, then beside a greedy request in a pool so small that sequences are
  // preempted and recomputed.
  alone_then_crowded([&](bool crowded) -> int64_t {
    Crowd c = crowd(crowded, 12, 512, 36, 8);
    auto& e = c.engine;
    auto& other = c.other;
    const auto got = submit_and_resume(*e, diverse_request());
    EXPECT_EQ(got.size(), 4u);
    for (size_t i = 0; i < std::min<size_t>(4, got.size()); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "crowded " << crowded << " rank " << i;
      EXPECT_NEAR(got[i].score, want[i].score, 1e-4) << i;
    }
    if (other) collect(*other, 1);
    expect_pool_empty(*e);
    return settled_stats(*e).preemptions;
  });
}

// Contrastive search, written plainly: the context and each candidate rerun
// from scratch for every step.
std::vector<TokenId> ref_contrastive(double alpha, int k, int max_new) {
  std::vector<TokenId> ctx = kPrompt, out;
  auto cosine = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      d += (double)a[i] * b[i];
      na += (double)a[i] * a[i];
      nb += (double)b[i] * b[i];
    }
    return d / std::sqrt(na * nb);
  };
  for (int step = 0; step < max_new; ++step) {
    const RefRun r = ref_run(ctx);
    const auto lps = ref_logprobs(r.logits, {});
    std::vector<TokenId> ids(lps.size());
    for (size_t t = 0; t < ids.size(); ++t) ids[t] = (TokenId)t;
    std::stable_sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) { return lps[(size_t)a] > lps[(size_t)b]; });
    TokenId best = -1;
    double best_score = -INFINITY;
    for (int i = 0; i < k; ++i) {
      std::vector<TokenId> c = ctx;
      c.push_back(ids[(size_t)i]);
      const std::vector<float> h = ref_run(c).hidden.back();
      double max_cos = -INFINITY;
      for (const auto& hj : r.hidden) max_cos = std::max(max_cos, cosine(h, hj));
      const double score = (1 - alpha) * std::exp(lps[(size_t)ids[(size_t)i]]) - alpha * max_cos;
      if (score > best_score) {
        best_score = score;
        best = ids[(size_t)i];
      }
    }
    ctx.push_back(best);
    out.push_back(best);
    if (stories().tok->is_eog(best)) break;
  }
  return out;
}

TEST(SearchDecoding, ContrastiveSearchMatchesTheSlowReference) {
  const auto want = ref_contrastive(0.6, 4, 10);
  {  // The degeneration penalty matters: greedy decoding differs.
    auto e = make_engine(small_config());
    const auto greedy = collect(**e->submit(greedy_request(kPrompt, 10, 0)), 1)[0].tokens;
    EXPECT_NE(std::vector<TokenId>(greedy.begin(), greedy.begin() + (ptrdiff_t)std::min(greedy.size(), want.size())),
              want);
  }
  alone_then_crowded([&](bool crowded) -> int64_t {
    // Crowded: chunked prefill of the prompt, too.
    Crowd c = crowd(crowded, 20, crowded ? 5 : 512, 50, 10);
    auto& e = c.engine;
    auto& other = c.other;
    Request r;
    r.prompt = kPrompt;
    r.params.penalty_alpha = 0.6f;
    r.params.top_k = 4;
    r.params.max_tokens = 10;
    const auto got = submit_and_resume(*e, r);
    EXPECT_EQ(got.size(), 1u);
    if (!got.empty()) {
      EXPECT_EQ(got[0].tokens, want) << "crowded " << crowded;
    }
    if (other) collect(*other, 1);
    expect_pool_empty(*e);
    return settled_stats(*e).preemptions;
  });
}

TEST(SearchDecoding, CancelFreesEveryBeamAndBadValuesAreRefused) {
  auto e = make_engine(small_config());
  for (const bool contrastive : {false, true}) {
    Request r;
    r.prompt = kPrompt;
    r.params.max_tokens = 50;
    r.params.ignore_eos = true;
    if (contrastive) {
      r.params.penalty_alpha = 0.5f;
      r.params.top_k = 6;
    } else {
      r.params.beam_width = 8;
    }
    e->pause();
    auto s = e->submit(r);
    ASSERT_TRUE(s.ok());
    e->step(6);
    EXPECT_GT(e->stats().kv_blocks_used, 0);
    e->resume();
    e->cancel((*s)->id());
    OutputEvent ev;
    while ((*s)->next(&ev)) {
    }
    expect_pool_empty(*e);
  }
  auto refused = [&](auto edit) {
    Request r;
    r.prompt = kPrompt;
    r.params.max_tokens = 4;
    r.params.beam_width = 4;
    edit(r);
    return !e->submit(r).ok();
  };
  EXPECT_TRUE(refused([](Request& r) { r.params.beam_width = 17; }));
  EXPECT_TRUE(refused([](Request& r) { r.n = 5; }));
  EXPECT_TRUE(refused([](Request& r) { r.params.num_beam_groups = 3; }));
  EXPECT_TRUE(refused([](Request& r) { r.params.diversity_penalty = 1.0f; }));
  EXPECT_TRUE(refused([](Request& r) { r.params.length_penalty = NAN; }));
  EXPECT_TRUE(refused([](Request& r) { r.params.stop = {"x"}; }));
  EXPECT_TRUE(refused([](Request& r) { r.params.logprobs = 2; }));
  EXPECT_TRUE(refused([](Request& r) {
    r.params.beam_width = 0;
    r.params.penalty_alpha = 0.5f;
    r.params.top_k = 65;
  }));
  EXPECT_TRUE(refused([](Request& r) {
    r.params.beam_width = 0;
    r.params.penalty_alpha = 1.5f;
    r.params.top_k = 4;
  }));
  EXPECT_TRUE(refused([](Request& r) {
    r.params.beam_width = 0;
    r.params.penalty_alpha = 0.5f;
    r.params.top_k = 4;
    r.n = 2;
  }));
  EXPECT_FALSE(refused([](Request&) {}));
}

}  // namespace
}  // namespace serval

namespace serval {
namespace {

// Several searches in a pool and a seq cap too small for all their beams at
// once: held beams must not keep a sibling (theirs or another search's) out
// forever. Every request finishes, with what it gets alone.
TEST(SearchDecoding, SearchesCrowdingEachOtherAllFinish) {
  EngineConfig cfg = small_config();
  const ModelConfig& mc = stories().model->config();
  cfg.kv_memory_bytes = 32 * KvGeometry{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), cfg.block_size}.bytes_per_block();
  cfg.max_seqs = 8;
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.prompt = long_prompt(9 + i);
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    if (i % 3 == 2) {
      r.params.penalty_alpha = 0.5f;
      r.params.top_k = 4;
    } else {
      r.params.beam_width = 4;
      r.params.num_beam_groups = i % 3 == 1 ? 2 : 1;
      r.params.diversity_penalty = i % 3 == 1 ? 1.0f : 0.0f;
      r.n = 2;
    }
    reqs.push_back(r);
  }
  std::vector<std::vector<Result>> alone;
  {
    auto e = make_engine(small_config());
    for (const Request& r : reqs) alone.push_back(run(*e, r));
  }
  auto e = make_engine(cfg);
  // All six are admitted in one step, so their beams must crowd.
  std::vector<Expected<std::shared_ptr<RequestStream>>> streams;
  e->pause();
  for (const Request& r : reqs) streams.push_back(e->submit(r));
  e->resume();
  std::vector<std::vector<Result>> together(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) together[i] = drain(streams[i], reqs[i]);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(together[i].size(), alone[i].size()) << i;
    for (size_t k = 0; k < alone[i].size(); ++k) EXPECT_EQ(together[i][k].tokens, alone[i][k].tokens) << i << " " << k;
  }
  EXPECT_GT(settled_stats(*e).preemptions, 0);
  expect_pool_empty(*e);
}

}  // namespace
}  // namespace serval
