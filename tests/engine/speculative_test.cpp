// Speculative decoding end to end: greedy output token-identical (and
// log-probabilities bit-identical) to decoding without speculation, for
// n-gram drafts, a quantized copy of the target, an unrelated synthetic draft
// and the target drafting for itself; mixed batches with preemption; KV and
// prefix cache consistent after rollbacks; sampled output distributed as the
// target's (chi-square against a reference forward pass); bad configurations
// refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "engine/engine_test_util.h"
#include "engine/ngram_draft.h"
#include "model/batch_forward.h"
#include "model/synthetic.h"
#include "sampler/sampler.h"

using namespace serval;

namespace {

// A "tiny" synthetic llama (seeded random weights) with the stories260K
// tokenizer: a draft unrelated to any target, sharing the vocabulary.
std::shared_ptr<const Model> synthetic_draft(const std::string& vocab_file = "models/stories260K.gguf") {
  static std::map<std::string, std::shared_ptr<const Model>> cache;
  if (auto it = cache.find(vocab_file); it != cache.end()) return it->second;
  auto vocab = gguf::GgufFile::open(kShared + "/" + vocab_file);
  EXPECT_TRUE(vocab.ok()) << vocab_file;
  SynthOptions opt;
  opt.shape = *find_synth_shape("tiny");
  opt.type = DType::q8_0;
  opt.seed = 7;
  // One file per process and model: ctest runs tests of this binary in parallel processes.
  const std::string path = testing::TempDir() + "/spec-draft-" + std::to_string(getpid()) + "-" +
                           std::to_string(cache.size()) + ".gguf";
  EXPECT_TRUE(write_synthetic_model(opt, *vocab, path).ok());
  auto m = Model::load(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  std::filesystem::remove(path);  // the mapping stays valid
  return cache.emplace(vocab_file, std::shared_ptr<const Model>(std::move(m.value()))).first->second;
}

struct Setup {
  std::string name;
  SpecConfig spec;
};

SpecConfig ngram(int32_t k = 4) {
  SpecConfig s;
  s.mode = SpecConfig::Mode::ngram;
  s.draft_max = k;
  s.ngram_min = 1;
  s.ngram_max = 3;
  return s;
}

SpecConfig draft(std::shared_ptr<const Model> m, int32_t k = 4) {
  SpecConfig s;
  s.mode = SpecConfig::Mode::draft_model;
  s.draft_model = std::move(m);
  s.draft_max = k;
  return s;
}

std::unique_ptr<Engine> engine_for(const Loaded& target, EngineConfig cfg) {
  auto e = Engine::create(target.model, *target.tok, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e.value()) : nullptr;
}

Sample run_one(Engine& e, Request r) {
  auto s = e.submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return {};
  return collect(**s, 1)[0];
}

void expect_same(const Sample& got, const Sample& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.text, want.text) << what;
  ASSERT_EQ(got.chosen_logprobs.size(), want.chosen_logprobs.size()) << what;
  EXPECT_EQ(std::memcmp(got.chosen_logprobs.data(), want.chosen_logprobs.data(), got.chosen_logprobs.size() * 4), 0)
      << what;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  EXPECT_EQ(std::memcmp(got.top_logprobs.data(), want.top_logprobs.data(), got.top_logprobs.size() * 4), 0) << what;
}

// Each prompt alone with and without speculation: identical tokens, text and
// log-probabilities; returns the speculating engine's stats.
EngineStats expect_greedy_identity(const Loaded& target, const SpecConfig& spec,
                                   const std::vector<std::vector<TokenId>>& prompts, int gen,
                                   const std::string& name) {
  EngineConfig base;
  base.n_threads = 2;
  EngineConfig sc = base;
  sc.spec = spec;
  auto plain = engine_for(target, base);
  auto specd = engine_for(target, sc);
  if (!plain || !specd) return {};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Sample want = run_one(*plain, greedy_request(prompts[i], gen));
    const Sample got = run_one(*specd, greedy_request(prompts[i], gen));
    expect_same(got, want, name + " prompt " + std::to_string(i));
  }
  const EngineStats st = settled_stats(*specd);
  EXPECT_GT(st.spec_drafts, 0) << name;
  EXPECT_GT(st.spec_draft_tokens, 0) << name;
  EXPECT_EQ(st.generated_tokens, (int64_t)prompts.size() * gen) << name;
  EXPECT_EQ(st.kv_blocks_used, 0) << name << ": rolled-back blocks must all be released";
  std::printf("%-28s drafts %lld, drafted %lld, accepted %lld (%.2f per draft), steps %lld\n", name.c_str(),
              (long long)st.spec_drafts, (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
              st.spec_mean_accepted, (long long)st.steps);
  return st;
}

std::vector<std::vector<TokenId>> golden_prompts(const std::string& file, const std::string& key = "") {
  std::ifstream in(kShared + "/golden/" + file);
  const auto j = nlohmann::json::parse(in);
  const auto& cases = key.empty() ? j["cases"] : j[key];
  std::vector<std::vector<TokenId>> out;
  for (const auto& c : cases) out.push_back(c["prompt_tokens"].get<std::vector<TokenId>>());
  return out;
}

}  // namespace

TEST(NgramDraft, LongestRecentMatchAndPeriodicContinuation) {
  // "1 2 3 9 1 2 3 7 5 1 2 3": suffix "1 2 3" last occurred ending before 7.
  const std::vector<TokenId> h = {1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3};
  EXPECT_EQ(ngram_draft(h, 1, 3, 3), (std::vector<TokenId>{7, 5, 1}));
  EXPECT_EQ(ngram_draft(h, 1, 3, 1), (std::vector<TokenId>{7}));
  // Only n-grams of at least n_min count: "4" never occurred before.
  EXPECT_TRUE(ngram_draft(std::vector<TokenId>{1, 2, 3, 4}, 1, 3, 4).empty());
  // A run continues with its period: "5 6 5 6 5" -> 6 5 6 5.
  EXPECT_EQ(ngram_draft(std::vector<TokenId>{5, 6, 5, 6, 5}, 2, 2, 4), (std::vector<TokenId>{6, 5, 6, 5}));
  EXPECT_EQ(ngram_draft(std::vector<TokenId>{8, 8}, 1, 4, 3), (std::vector<TokenId>{8, 8, 8}));
  // The longer match wins over a more recent shorter one: "1 2" last seen
  // before 4 ("1 2 4"), but "0 1 2" before 3.
  EXPECT_EQ(ngram_draft(std::vector<TokenId>{0, 1, 2, 3, 1, 2, 4, 0, 1, 2}, 1, 3, 1), (std::vector<TokenId>{3}));
  EXPECT_EQ(ngram_draft(std::vector<TokenId>{0, 1, 2, 3, 1, 2, 4, 0, 1, 2}, 1, 2, 1), (std::vector<TokenId>{4}));
  EXPECT_TRUE(ngram_draft(h, 1, 3, 0).empty());
}

TEST(SpecEngine, GreedyIdenticalOnStories260K) {
  const auto prompts = golden_prompts("stories260K-greedy.json");
  EngineStats st = expect_greedy_identity(stories(), ngram(), prompts, 120, "stories / ngram");
  EXPECT_GT(st.spec_accepted_tokens, 0);
  st = expect_greedy_identity(stories(), draft(synthetic_draft()), prompts, 60, "stories / synthetic draft");
  // The target drafting for itself: every draft is accepted.
  st = expect_greedy_identity(stories(), draft(stories().model), prompts, 60, "stories / self draft");
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  // And the golden (llama.cpp) continuation itself.
  std::ifstream in(kShared + "/golden/stories260K-greedy.json");
  const auto golden = nlohmann::json::parse(in);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.spec = ngram();
  auto e = engine_for(stories(), cfg);
  for (const auto& c : golden["cases"]) {
    const Sample got = run_one(*e, greedy_request(c["prompt_tokens"].get<std::vector<TokenId>>(), 200, 0));
    EXPECT_EQ(got.tokens, c["greedy_tokens"].get<std::vector<TokenId>>()) << c["prompt"];
  }
}

TEST(SpecEngine, GreedyIdenticalOnMiniWithQuantizedDraft) {
  const Loaded& target = shared_model("mini/mini-llama-Q8_0.gguf");
  const auto prompts = golden_prompts("mini-formats.json", "mini-llama-Q8_0.gguf");
  const EngineStats st = expect_greedy_identity(target, draft(shared_model("mini/mini-llama-Q4_0.gguf").model),
                                                prompts, 32, "mini Q8_0 / Q4_0 draft");
  EXPECT_GT(st.spec_accepted_tokens, 0) << "a quantized copy should agree with its source most of the time";
  expect_greedy_identity(target, draft(synthetic_draft()), prompts, 32, "mini Q8_0 / synthetic draft");
  expect_greedy_identity(target, ngram(), prompts, 32, "mini Q8_0 / ngram");
}

// Many requests at once, half of them without speculation, through chunked
// prefill, a pool small enough to force preemption (recompute, and swap with
// a host area) and per-seq draft lengths: every request gets the tokens and
// log-probabilities it gets alone without speculation, and every block comes
// back.
TEST(SpecEngine, MixedBatchWithPreemptionMatchesAlone) {
  std::vector<std::vector<TokenId>> prompts;
  const auto golden = golden_prompts("stories260K-greedy.json");
  for (int i = 0; i < 16; ++i) {
    std::vector<TokenId> p = golden[(size_t)i % golden.size()];
    for (int k = 0; k < i; ++k) p.push_back((TokenId)(300 + (i * 31 + k * 17) % 150));
    prompts.push_back(p);
  }
  const int gen = 40;
  std::vector<Sample> alone;
  {
    EngineConfig cfg;
    cfg.n_threads = 2;
    auto e = make_engine(cfg);
    for (const auto& p : prompts) alone.push_back(run_one(*e, greedy_request(p, gen)));
  }
  const auto& mc = stories().model->config();
  for (const auto& [name, spec] : {std::pair{std::string("ngram"), ngram(5)},
                                   std::pair{std::string("synthetic draft"), draft(synthetic_draft(), 3)}}) {
    for (bool swap : {false, true}) {
      EngineConfig cfg;
      cfg.n_threads = 2;
      cfg.block_size = 8;
      cfg.max_batch_tokens = 40;
      cfg.max_seqs = 16;
      cfg.spec = spec;
      const size_t per_block =
          KvGeometry{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), 8, cfg.kv_type}.bytes_per_block() +
          (spec.draft_model ? KvGeometry{(int32_t)spec.draft_model->config().n_layers,
                                         (int32_t)spec.draft_model->config().kv_dim(), 8, cfg.kv_type}
                                  .bytes_per_block()
                            : 0);
      cfg.kv_memory_bytes = 40 * per_block;
      cfg.swap_memory_bytes = swap ? 200 * per_block : 0;
      auto e = engine_for(stories(), cfg);
      ASSERT_TRUE(e);
      std::vector<std::shared_ptr<RequestStream>> streams;
      e->pause();  // admitted together: they must crowd the pool
      for (size_t i = 0; i < prompts.size(); ++i) {
        Request r = greedy_request(prompts[i], gen);
        r.speculate = i % 2 == 0;
        auto s = e->submit(std::move(r));
        ASSERT_TRUE(s.ok());
        streams.push_back(*s);
      }
      e->resume();
      for (size_t i = 0; i < prompts.size(); ++i)
        expect_same(collect(*streams[i], 1)[0], alone[i], name + (swap ? " swap" : "") + " request " + std::to_string(i));
      const EngineStats st = settled_stats(*e);
      EXPECT_GT(st.preemptions, 0) << name << ": the pool was meant to force preemptions";
      EXPECT_GT(st.spec_drafts, 0) << name;
      EXPECT_EQ(st.kv_blocks_used, 0) << name;
    }
  }
}

// Rollback never lets rejected drafts into the prefix cache: a later request
// whose prompt is an earlier request's prompt plus output hits the cache and
// still gets exactly the output it gets on a fresh engine without speculation.
TEST(SpecEngine, PrefixCacheConsistentAfterRollback) {
  for (const SpecConfig& spec : {ngram(6), draft(synthetic_draft(), 4)}) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.block_size = 4;
    cfg.spec = spec;
    auto e = engine_for(stories(), cfg);
    EngineConfig plain_cfg;
    plain_cfg.n_threads = 2;
    plain_cfg.enable_prefix_caching = false;
    auto plain = make_engine(plain_cfg);
    const std::vector<TokenId> p = golden_prompts("stories260K-greedy.json")[1];
    const Sample a = run_one(*e, greedy_request(p, 48));
    const EngineStats after_a = settled_stats(*e);
    EXPECT_GT(after_a.spec_draft_tokens, after_a.spec_accepted_tokens) << "the test wants some rejected drafts";
    EXPECT_EQ(after_a.kv_blocks_used, 0);
    std::vector<TokenId> p2 = p;
    p2.insert(p2.end(), a.tokens.begin(), a.tokens.begin() + 37);
    auto s = e->submit(greedy_request(p2, 24));
    ASSERT_TRUE(s.ok());
    OutputEvent ev;
    Sample got;
    int64_t cached = 0;
    while ((*s)->next(&ev)) {
      ASSERT_TRUE(ev.error.ok());
      got.tokens.insert(got.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finish != FinishReason::none) cached = ev.cached_prompt_tokens;
    }
    EXPECT_GE(cached, 36) << "prompt + output blocks of the first request should be cached";
    EXPECT_EQ(got.tokens, run_one(*plain, greedy_request(p2, 24, 0)).tokens);
    EXPECT_EQ(settled_stats(*e).kv_blocks_used, 0);
  }
}

// Sampling: the joint distribution of the first two sampled tokens (the second
// one goes through draft verification) matches the target's, computed from a
// reference forward pass with the same processors (temperature, top-k,
// min-p, repetition penalty). Chi-square over 4000 seeded requests. Target
// mini Q8_0; drafts: its Q4_0 copy (close to p: mostly accepted, some
// rejections) and n-grams (point masses; the prompt repeats its tokens); and,
// as a control of the test itself, no speculation. (With 30000 requests,
// seeds from 777000, the three gave chi2 46.0, 26.1, 39.3 for 35 degrees of
// freedom.)
TEST(SpecEngine, SampledDistributionMatchesTarget) {
  const Loaded& target = shared_model("mini/mini-llama-Q8_0.gguf");
  // 17 tokens: all requests share the first block in the prefix cache.
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 59, 75, 94, 420, 420, 284, 440, 346, 420, 420, 420, 108};
  SamplingParams sp;
  sp.temperature = 1.4f;
  sp.top_k = 6;
  sp.min_p = 0.02f;
  sp.repetition_penalty = 1.3f;
  sp.max_tokens = 3;
  sp.ignore_eos = true;
  const int64_t n_vocab = target.model->config().n_vocab;

  // Reference: p(t1) * p(t2 | t1), from the target's logits as the engine's
  // forward pass computes them (quantized activations and all; batch
  // invariance makes them the logits every engine step sees).
  std::map<std::pair<TokenId, TokenId>, double> expect;
  {
    const auto& mc = target.model->config();
    // The engine's default KV type, so these are the logits the engine sees.
    auto kv = KvStorage::create({(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), 16, EngineConfig{}.kv_type}, 4);
    ASSERT_TRUE(kv.ok());
    BatchForward fwd(*target.model, *kv, nullptr);
    const std::vector<BlockId> table = {0, 1};
    Batch b;
    b.tokens = prompt;
    b.seqs.push_back({0, (int32_t)prompt.size(), table, true, 1});
    std::vector<float> lg;
    ASSERT_TRUE(fwd.forward(b, &lg).ok());
    Sampler s1(sp, (int32_t)n_vocab), s2(sp, (int32_t)n_vocab);
    const auto d1 = s1.distribution(lg, prompt);
    for (const Candidate& c1 : std::vector<Candidate>(d1.begin(), d1.end())) {
      b.tokens = {c1.token};
      b.seqs = {{(int64_t)prompt.size(), 1, table, true, 1}};
      ASSERT_TRUE(fwd.forward(b, &lg).ok());
      std::vector<TokenId> h = prompt;
      h.push_back(c1.token);
      for (const Candidate& c2 : s2.distribution(lg, h)) expect[{c1.token, c2.token}] = (double)c1.prob * c2.prob;
    }
  }
  const int n = 4000;
  for (const SpecConfig& spec : {SpecConfig{}, draft(shared_model("mini/mini-llama-Q4_0.gguf").model, 2), ngram(2)}) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.max_seqs = 64;
    cfg.spec = spec;
    auto e = engine_for(target, cfg);
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::map<std::pair<TokenId, TokenId>, int64_t> seen;
    for (int i = 0; i < n; ++i) {
      Request r;
      r.prompt = prompt;
      r.params = sp;
      r.params.seed = 1000 + (uint64_t)i;
      auto s = e->submit(std::move(r));
      ASSERT_TRUE(s.ok());
      streams.push_back(*s);
      if (streams.size() == 256 || i + 1 == n) {
        for (auto& st : streams) {
          const Sample got = collect(*st, 1)[0];
          ASSERT_GE(got.tokens.size(), 2u);
          ++seen[{got.tokens[0], got.tokens[1]}];
        }
        streams.clear();
      }
    }
    const EngineStats st = settled_stats(*e);
    const bool speculating = spec.mode != SpecConfig::Mode::none;  // none: the control
    if (speculating) {
      EXPECT_GT(st.spec_drafts, n / 20);
      EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << "rejections must be exercised";
      EXPECT_GT(st.spec_accepted_tokens, 0);
    }
    // Chi-square over cells expecting >= 5 samples, the rest pooled.
    double chi2 = 0, rest_e = 0, rest_o = 0;
    int cells = 0;
    for (const auto& [k, p] : expect) {
      const double ex = p * n;
      const double ob = seen.count(k) ? (double)seen[k] : 0.0;
      if (ex < 5) {
        rest_e += ex;
        rest_o += ob;
        continue;
      }
      chi2 += (ob - ex) * (ob - ex) / ex;
      ++cells;
    }
    for (const auto& [k, c] : seen)
      if (!expect.count(k)) ADD_FAILURE() << "sampled a pair the target gives probability 0: " << k.first << "," << k.second;
    if (rest_e > 0) {
      chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
      ++cells;
    }
    const double dof = cells - 1;
    // 99.9% quantile (Wilson-Hilferty).
    const double z = 3.09, a = 2.0 / (9.0 * dof);
    const double limit = dof * std::pow(1 - a + z * std::sqrt(a), 3);
    EXPECT_LT(chi2, limit) << "dof " << dof;
    std::printf("%s: chi2 %.1f (dof %.0f, 99.9%% limit %.1f); drafts %lld, drafted %lld, accepted %lld\n",
                !speculating ? "no speculation" : spec.mode == SpecConfig::Mode::ngram ? "ngram" : "draft model", chi2, dof, limit,
                (long long)st.spec_drafts, (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens);
  }
}

TEST(SpecEngine, RefusesBadConfigurations) {
  auto create_err = [](SpecConfig spec) {
    EngineConfig cfg;
    cfg.n_threads = 1;
    cfg.spec = std::move(spec);
    auto e = Engine::create(stories().model, *stories().tok, cfg);
    return e.ok() ? std::string() : e.status().message();
  };
  // A draft with another tokenizer (GPT-2's 50257 tokens).
  EXPECT_NE(create_err(draft(synthetic_draft("tokenizer-vectors/ggml-vocab-gpt-2.gguf"))).find("vocabulary"),
            std::string::npos);
  EXPECT_NE(create_err(draft(nullptr)).find("no draft model"), std::string::npos);
  SpecConfig s = ngram(0);
  EXPECT_NE(create_err(s).find("--draft-max"), std::string::npos);
  s = ngram(4);
  s.draft_min = 5;
  EXPECT_NE(create_err(s).find("--draft-min"), std::string::npos);
  s = ngram(4);
  s.ngram_min = 4;
  s.ngram_max = 2;
  EXPECT_NE(create_err(s).find("--ngram-min"), std::string::npos);
  EXPECT_EQ(create_err(ngram(4)), "");
}
