// LoRA adapters through the engine (Engine::load_lora, Request::lora): 32
// requests mixing 4 adapters and the base, batched together through chunked
// prefill, prefix hits and preemption, each get the tokens and log-probs they
// get alone, bit for bit; adapters never share prefix-cache blocks with each
// other or the base; unloading under load loses no request.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/engine_test_util.h"
#include "gguf/gguf_reader.h"
#include "model/synthetic.h"

using namespace serval;

namespace {

struct Adapters {
  std::vector<std::string> paths;
  Adapters(int n) {
    auto base = gguf::GgufFile::open(std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf");
    EXPECT_TRUE(base.ok());
    for (int i = 0; i < n; ++i) {
      SynthLoraOptions o;
      o.rank = 4 + 2 * i;
      o.seed = 900 + (uint64_t)i;
      o.std_b = 0.08f;
      if (i == 3) o.targets = {"attn_q", "ffn_down", "output"};
      paths.push_back((std::filesystem::temp_directory_path() /
                       ("serval-lora-engine-" + std::to_string(::getpid()) + "-" + std::to_string(i) + ".gguf"))
                          .string());
      Status st = write_synthetic_lora(o, *base, paths.back());
      EXPECT_TRUE(st.ok()) << st.message();
    }
  }
  ~Adapters() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
};

std::vector<std::vector<TokenId>> prompts32() {
  std::vector<std::vector<TokenId>> ps;
  uint32_t s = 777;
  auto next = [&] { s = s * 1664525u + 1013904223u; return (TokenId)(3 + (s >> 8) % 500); };
  std::vector<TokenId> shared = {1};
  while (shared.size() < 40) shared.push_back(next());
  for (int i = 0; i < 32; ++i) {
    // Every request shares a 40-token prefix: requests of one adapter hit
    // each other's blocks, never another adapter's.
    std::vector<TokenId> p = shared;
    for (int k = 0; k < 1 + (i * 7) % 30; ++k) p.push_back(next());
    ps.push_back(p);
  }
  return ps;
}

std::string adapter_of(int i) { return i % 5 == 4 ? "" : "a" + std::to_string(i % 5); }

}  // namespace

TEST(LoraEngine, MixedAdapterBatchGivesEveryRequestItsSoloOutput) {
  const Loaded& m = stories();
  Adapters ads(4);
  auto make = [&](EngineConfig cfg) {
    auto e = Engine::create(m.model, *m.tok, cfg);
    EXPECT_TRUE(e.ok()) << e.status().message();
    for (int i = 0; i < 4; ++i) {
      Status st = (*e)->load_lora("a" + std::to_string(i), ads.paths[(size_t)i]);
      EXPECT_TRUE(st.ok()) << st.message();
    }
    return std::move(e.value());
  };
  const auto prompts = prompts32();
  const int gen = 12;
  auto req = [&](size_t i) {
    Request r = greedy_request(prompts[i], gen);
    r.lora = adapter_of((int)i);
    return r;
  };
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.max_batch_tokens = 64;
  cfg.max_seqs = 32;
  const auto& mc = m.model->config();
  cfg.kv_memory_bytes = 24 * (size_t)mc.n_layers * 2 * 16 * (size_t)mc.kv_dim() * 2;  // 24 blocks: preemption
  auto e = make(cfg);
  ASSERT_EQ(e->loras().size(), 4u);
  std::vector<std::shared_ptr<RequestStream>> streams;
  e->pause();  // admitted together
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = e->submit(req(i));
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(*s);
  }
  e->resume();
  std::vector<Sample> alone, same_prompt;
  {
    EngineConfig solo;
    solo.n_threads = 2;
    solo.enable_prefix_caching = false;
    auto s = make(solo);
    for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(collect(**s->submit(req(i)), 1)[0]);
    for (int a = 0; a < 5; ++a) {  // prompt 0 under each adapter, then the base
      Request r = greedy_request(prompts[0], gen);
      r.lora = a < 4 ? "a" + std::to_string(a) : "";
      same_prompt.push_back(collect(**s->submit(r), 1)[0]);
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Sample got = collect(*streams[i], 1)[0];
    EXPECT_EQ(got.tokens, alone[i].tokens) << "request " << i << " (" << adapter_of((int)i) << ")";
    ASSERT_EQ(got.top_logprobs.size(), alone[i].top_logprobs.size());
    EXPECT_EQ(std::memcmp(got.top_logprobs.data(), alone[i].top_logprobs.data(), got.top_logprobs.size() * 4), 0)
        << "request " << i;
  }
  // The adapters change the output: the same prompt under each differs.
  for (size_t a = 0; a < 4; ++a)
    EXPECT_NE(same_prompt[a].top_logprobs, same_prompt[4].top_logprobs) << "adapter a" << a << " vs the base";
  EXPECT_EQ(same_prompt[0].top_logprobs, alone[0].top_logprobs);  // request 0 is prompt 0 under a0
  const EngineStats st = settled_stats(*e);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix_hit_tokens, 0);
}

// --max-loras 1: a request for an adapter dropped from memory reads it again
// and gets the same output.
TEST(LoraEngine, MaxLorasKeepsTheRecentOnesResident) {
  const Loaded& m = stories();
  Adapters ads(2);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.max_loras = 1;
  auto e = Engine::create(m.model, *m.tok, cfg);
  ASSERT_TRUE(e.ok());
  Engine& en = **e;
  ASSERT_TRUE(en.load_lora("x", ads.paths[0]).ok());
  ASSERT_TRUE(en.load_lora("y", ads.paths[1]).ok());
  auto state = [&](const std::string& n) {
    for (const LoraInfo& l : en.loras())
      if (l.name == n) return l;
    ADD_FAILURE() << n;
    return LoraInfo{};
  };
  EXPECT_FALSE(state("x").resident);  // y came last
  EXPECT_TRUE(state("y").resident);
  std::vector<TokenId> p = {1, 50, 60, 70, 80};
  Request r = greedy_request(p, 6);
  r.lora = "x";
  const Sample first = collect(**en.submit(r), 1)[0];
  EXPECT_TRUE(state("x").resident);
  EXPECT_EQ(state("x").reloads, 1);
  settled_stats(en);  // x's request is gone from the engine: x is idle
  Request ry = r;
  ry.lora = "y";
  collect(**en.submit(ry), 1);
  EXPECT_FALSE(state("x").resident);
  const Sample again = collect(**en.submit(r), 1)[0];
  EXPECT_EQ(state("x").reloads, 2);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.top_logprobs, first.top_logprobs);
}

TEST(LoraEngine, AdaptersNeverShareCachedBlocksAndUnloadLosesNoRequest) {
  const Loaded& m = stories();
  Adapters ads(2);
  EngineConfig cfg;
  cfg.n_threads = 2;
  auto e = Engine::create(m.model, *m.tok, cfg);
  ASSERT_TRUE(e.ok());
  Engine& en = **e;
  ASSERT_TRUE(en.load_lora("x", ads.paths[0]).ok());
  EXPECT_FALSE(en.load_lora("x", ads.paths[1]).ok());  // the name is taken
  Status bad = en.load_lora("y", std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("general.type"), std::string::npos) << bad.message();
  std::vector<TokenId> p(48);
  for (size_t i = 0; i < p.size(); ++i) p[i] = (TokenId)(10 + i);
  // The base computes the prompt; the adapter then gets no hit on it.
  collect(**en.submit(greedy_request(p, 2)), 1);
  const int64_t hits0 = settled_stats(en).prefix_hit_tokens;
  Request r = greedy_request(p, 2);
  r.lora = "x";
  collect(**en.submit(r), 1);
  EXPECT_EQ(settled_stats(en).prefix_hit_tokens, hits0) << "an adapter must not reuse the base's KV";
  collect(**en.submit(r), 1);
  EXPECT_GT(settled_stats(en).prefix_hit_tokens, hits0) << "but it reuses its own";

  // Unload while requests run with it: they finish with it; new ones are refused.
  en.pause();
  std::vector<std::shared_ptr<RequestStream>> running;
  for (int i = 0; i < 4; ++i) {
    Request q = greedy_request(p, 8);
    q.lora = "x";
    running.push_back(*en.submit(q));
  }
  ASSERT_TRUE(en.unload_lora("x").ok());
  en.resume();
  for (auto& s : running) {
    const Sample got = collect(*s, 1)[0];
    EXPECT_EQ(got.tokens.size(), 8u);
  }
  auto refused = en.submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("LoRA adapter 'x' is not loaded"), std::string::npos);
  EXPECT_FALSE(en.unload_lora("x").ok());
  EXPECT_TRUE(en.loras().empty());
}
