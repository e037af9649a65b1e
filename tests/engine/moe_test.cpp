// Mixture-of-experts models through the engine (the qwen3moe and gpt-oss
// files of ../shared/models/arch): 32 mixed requests batched together,
// through chunked prefill, prefix hits, preemption, F16 KV and n-gram
// speculative decoding, each get the tokens
// and log-probs they get alone, bit for bit (the grouped expert matmul keeps
// batch invariance); the router's per-expert token counts are reported.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine_test_util.h"

using namespace serval;

namespace {

std::vector<std::vector<TokenId>> mixed_prompts() {
  std::vector<std::vector<TokenId>> ps;
  uint32_t s = 4242;
  auto next = [&] { s = s * 1664525u + 1013904223u; return (TokenId)(3 + (s >> 8) % 500); };
  std::vector<TokenId> shared = {1};
  while (shared.size() < 40) shared.push_back(next());
  for (int i = 0; i < 32; ++i) {
    std::vector<TokenId> p = i % 2 == 0 ? shared : std::vector<TokenId>{1};
    for (int k = 0; k < 1 + (i * 7) % 50; ++k) p.push_back(next());
    ps.push_back(p);
  }
  return ps;
}

void check_batch_invariance(const std::string& file, bool spec) {
  const Loaded& m = shared_model("arch/" + file);
  ASSERT_TRUE(m.model->config().block.moe);
  const auto prompts = mixed_prompts();
  const int gen = 16;
  auto engine = [&](EngineConfig cfg) {
    auto e = Engine::create(m.model, *m.tok, cfg);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return std::move(e.value());
  };
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 32;
  cfg.kv_type = KvType::f16;  // quantized KV too
  if (spec) cfg.spec.mode = SpecConfig::Mode::ngram;  // verify runs several tokens per sequence
  const auto& mc = m.model->config();
  cfg.kv_memory_bytes = 50 * (size_t)mc.n_layers * 2 * 16 * (size_t)mc.kv_dim() * 2;  // 50 blocks: preemption
  auto e = engine(cfg);
  std::vector<std::shared_ptr<RequestStream>> streams;
  e->pause();  // admitted together: they must crowd the pool
  for (const auto& p : prompts) streams.push_back(*e->submit(greedy_request(p, gen)));
  e->resume();
  // Each request alone (same KV type, no prefix cache).
  std::vector<Sample> alone_f16;
  {
    EngineConfig solo;
    solo.n_threads = 2;
    solo.enable_prefix_caching = false;
    solo.kv_type = KvType::f16;
    auto s = engine(solo);
    for (const auto& p : prompts) alone_f16.push_back(collect(**s->submit(greedy_request(p, gen)), 1)[0]);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Sample got = collect(*streams[i], 1)[0];
    EXPECT_EQ(got.tokens, alone_f16[i].tokens) << file << " request " << i;
    ASSERT_EQ(got.top_logprobs.size(), alone_f16[i].top_logprobs.size());
    EXPECT_EQ(std::memcmp(got.top_logprobs.data(), alone_f16[i].top_logprobs.data(), got.top_logprobs.size() * 4), 0)
        << file << " request " << i;
  }
  const EngineStats st = settled_stats(*e);
  if (spec) {
    EXPECT_GT(st.spec_draft_tokens, 0) << file;
  } else {
    EXPECT_GT(st.preemptions, 0) << file;
  }
  EXPECT_GT(st.prefix_hit_tokens, 0) << file;
  ASSERT_EQ(st.n_expert, 8);
  ASSERT_EQ(st.expert_tokens.size(), (size_t)mc.n_layers * 8);
  // Every token run went to n_expert_used experts in every layer: the layers'
  // totals are equal and a multiple of n_expert_used.
  std::vector<int64_t> per_layer((size_t)mc.n_layers, 0);
  for (size_t i = 0; i < st.expert_tokens.size(); ++i) per_layer[i / 8] += st.expert_tokens[i];
  EXPECT_GT(per_layer[0], (int64_t)prompts.size() * gen) << file;
  for (int64_t v : per_layer) {
    EXPECT_EQ(v, per_layer[0]) << file;
    EXPECT_EQ(v % mc.n_expert_used, 0) << file;
  }
}

}  // namespace

TEST(MoeEngine, Qwen3MoeBatchInvariance) { check_batch_invariance("mini-qwen3moe-F16.gguf", false); }
TEST(MoeEngine, GptOssBatchInvariance) { check_batch_invariance("mini-gpt-oss-F16.gguf", false); }
TEST(MoeEngine, Qwen3MoeBatchInvarianceSpeculative) { check_batch_invariance("mini-qwen3moe-F16.gguf", true); }

// EngineStats' decode-only-step expert reads (what `bench throughput` prints
// as experts read per layer): one sequence reads exactly its n_expert_used
// experts in every MoE layer of every decode step; eight sequences at once
// read more than that (different tokens route differently) but fewer than
// eight times as many: 8 tokens x 2 slots over 8 experts must share one
// (pigeonhole), and each expert is read once for all its tokens.
TEST(MoeEngine, DecodeStepsCountTheExpertsTheyRead) {
  const Loaded& m = shared_model("arch/mini-qwen3moe-F16.gguf");
  const auto& mc = m.model->config();
  ASSERT_EQ(mc.n_expert, 8);
  ASSERT_EQ(mc.n_expert_used, 2);
  const int gen = 12;
  const auto prompts = mixed_prompts();
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.enable_prefix_caching = false;
  {
    auto e = std::move(Engine::create(m.model, *m.tok, cfg).value());
    collect(**e->submit(greedy_request(prompts[1], gen)), 1);
    const EngineStats st = settled_stats(*e);
    ASSERT_EQ(st.decode_steps, gen - 1);
    EXPECT_EQ(st.decode_step_moe_passes, st.decode_steps * mc.n_layers);
    EXPECT_EQ(st.decode_step_expert_reads, st.decode_step_moe_passes * mc.n_expert_used);
  }
  auto e = std::move(Engine::create(m.model, *m.tok, cfg).value());
  std::vector<std::shared_ptr<RequestStream>> streams;
  e->pause();
  for (int i = 0; i < 8; ++i) streams.push_back(*e->submit(greedy_request(prompts[(size_t)i], gen)));
  e->resume();
  for (auto& s : streams) collect(*s, 1);
  const EngineStats st = settled_stats(*e);
  ASSERT_GT(st.decode_steps, 0);
  EXPECT_EQ(st.decode_step_moe_passes, st.decode_steps * mc.n_layers);
  EXPECT_GT(st.decode_step_tokens, st.decode_steps);  // steps of several sequences
  EXPECT_GT(st.decode_step_expert_reads, st.decode_step_moe_passes * mc.n_expert_used);
  EXPECT_LE(st.decode_step_expert_reads, st.decode_step_moe_passes * mc.n_expert);
  EXPECT_LT(st.decode_step_expert_reads, st.decode_step_tokens * mc.n_layers * mc.n_expert_used);
}
