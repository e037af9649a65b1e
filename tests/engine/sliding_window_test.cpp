// Sliding-window layers in the paged KV cache (kv_cache_manager.h), end to
// end on the gemma3 mini model of ../shared/models/arch (layers 0-4 attend to
// the last 32 positions, layer 5 to all): the window's blocks are all a
// sequence holds in the sliding-window pool however long it grows (asserted
// from the allocator's counters), and every output is bit-identical (tokens
// and log-probs) to the engine that keeps the whole context for those layers
// (swa_full), through chunked prefill, prefix-cache hits, preemption, forks
// (n = 2) and speculative decoding with rollback.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine_test_util.h"
#include "kv_cache/kv_storage.h"

using namespace serval;

namespace {

const Loaded& gemma3() { return shared_model("arch/mini-gemma3-F16.gguf"); }

std::unique_ptr<Engine> gemma3_engine(EngineConfig cfg) {
  auto e = Engine::create(gemma3().model, *gemma3().tok, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e.value()) : nullptr;
}

Request long_request(std::vector<TokenId> prompt, int max_tokens, int n = 1) {
  Request r = greedy_request(std::move(prompt), max_tokens);
  r.params.ignore_eos = true;
  r.n = n;
  return r;
}

void expect_same(const Sample& got, const Sample& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.chosen_logprobs.size(), want.chosen_logprobs.size()) << what;
  EXPECT_EQ(std::memcmp(got.chosen_logprobs.data(), want.chosen_logprobs.data(), got.chosen_logprobs.size() * 4), 0)
      << what;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  EXPECT_EQ(std::memcmp(got.top_logprobs.data(), want.top_logprobs.data(), got.top_logprobs.size() * 4), 0) << what;
}

// Prompts of 5..120 tokens, half of them sharing a 70-token prefix (longer
// than the window, so a prefix hit needs the window's blocks).
std::vector<std::vector<TokenId>> prompts() {
  std::vector<std::vector<TokenId>> ps;
  uint32_t s = 777;
  auto next = [&] { s = s * 1664525u + 1013904223u; return (TokenId)(3 + (s >> 8) % 500); };
  std::vector<TokenId> shared = {1};
  while (shared.size() < 70) shared.push_back(next());
  for (int i = 0; i < 8; ++i) {
    std::vector<TokenId> p = i % 2 == 0 ? shared : std::vector<TokenId>{1};
    for (int k = 0; k < 4 + (i * 13) % 50; ++k) p.push_back(next());
    ps.push_back(p);
  }
  return ps;
}

}  // namespace

TEST(SlidingWindowKv, LongGenerationHoldsOnlyTheWindowAndMatchesFullKv) {
  ASSERT_EQ(gemma3().model->config().sliding_window, 32);
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  const int gen = 400;
  EngineConfig full;
  full.n_threads = 1;
  full.swa_full = true;
  full.max_model_len = 1024;
  Sample want;
  {
    auto e = gemma3_engine(full);
    ASSERT_TRUE(e);
    want = collect(**e->submit(long_request(prompt, gen)), 1)[0];
    EXPECT_EQ(e->stats().kv_swa_blocks_total, 0);
  }
  EngineConfig bounded = full;
  bounded.swa_full = false;
  auto e = gemma3_engine(bounded);
  ASSERT_TRUE(e);
  const Sample got = collect(**e->submit(long_request(prompt, gen)), 1)[0];
  ASSERT_EQ((int)got.tokens.size(), gen);
  expect_same(got, want, "bounded vs full sliding-window KV");
  const EngineStats st = settled_stats(*e);
  const int64_t bs = bounded.block_size, n_pos = (int64_t)prompt.size() + gen;
  // The window (31 earlier positions) spans at most 3 blocks, plus the one
  // being filled: 4, while the global layer's pool holds the whole sequence.
  EXPECT_GT(st.kv_swa_blocks_total, 0);
  EXPECT_LE(st.kv_swa_blocks_peak, (31 + bs - 1) / bs + 2) << "sliding-window blocks held at once";
  EXPECT_GE(st.kv_blocks_peak, (n_pos - 1 + bs - 1) / bs) << "the global layer keeps every position";
  EXPECT_GE(st.kv_swa_blocks_released, (n_pos - 1) / bs - 4);
  // Bytes: 1 global + 5 local layers; the bound keeps ~ (1 + 5 * 4 / 26) / 6 of full attention's.
  const double bytes = (double)st.kv_blocks_peak * (double)st.kv_bytes_per_block +
                       (double)st.kv_swa_blocks_peak * (double)st.kv_swa_bytes_per_block;
  const double full_bytes = (double)st.kv_blocks_peak * (double)(st.kv_bytes_per_block + st.kv_swa_bytes_per_block);
  std::printf("KV bytes of a %lld-token sequence: %.0f, full attention %.0f (%.1f%%)\n", (long long)n_pos, bytes,
              full_bytes, 100.0 * bytes / full_bytes);
  EXPECT_LT(bytes, 0.35 * full_bytes);
}

TEST(SlidingWindowKv, PrefixHitsPreemptionForksAndSpeculationMatchFullKv) {
  const auto ps = prompts();
  const int gen = 60;
  // Reference: each request alone, whole context for every layer.
  std::vector<std::vector<Sample>> want;
  {
    EngineConfig full;
    full.n_threads = 1;
    full.swa_full = true;
    full.enable_prefix_caching = false;
    auto e = gemma3_engine(full);
    ASSERT_TRUE(e);
    for (const auto& p : ps) want.push_back(collect(**e->submit(long_request(p, gen, 2)), 2));
  }
  for (bool spec : {false, true}) {
    EngineConfig cfg;
    cfg.n_threads = 1;
    cfg.max_batch_tokens = 48;  // chunked prefill
    cfg.max_seqs = 16;
    if (spec) {
      cfg.spec.mode = SpecConfig::Mode::ngram;
      cfg.spec.draft_max = 4;
    }
    // A small pool: 16 sequences need ~64 sliding-window blocks; force preemption.
    const auto& mc = gemma3().model->config();
    KvGeometry g{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), cfg.block_size, cfg.kv_type, mc.layer_swa};
    cfg.kv_memory_bytes = 24 * g.bytes_per_swa_block();
    auto e = gemma3_engine(cfg);
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    e->pause();  // admitted together: they must crowd the pool
    for (const auto& p : ps) {
      auto s = e->submit(long_request(p, gen, 2));
      ASSERT_TRUE(s.ok()) << s.status().message();
      streams.push_back(*s);
    }
    e->resume();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto got = collect(*streams[i], 2);
      for (int k = 0; k < 2; ++k)
        expect_same(got[(size_t)k], want[i][(size_t)k],
                    "request " + std::to_string(i) + " sample " + std::to_string(k) + (spec ? " (speculative)" : ""));
    }
    const EngineStats st = settled_stats(*e);
    std::printf("%s: preemptions %lld, prefix hit tokens %lld, sliding-window blocks %d (peak %d), released %lld\n",
                spec ? "speculative" : "plain", (long long)st.preemptions, (long long)st.prefix_hit_tokens,
                st.kv_swa_blocks_total, st.kv_swa_blocks_peak, (long long)st.kv_swa_blocks_released);
    EXPECT_GT(st.kv_swa_blocks_total, 0);
    EXPECT_GT(st.preemptions, 0) << "the pool was meant to force preemption";
    EXPECT_GT(st.prefix_hit_tokens, 0) << "the shared 70-token prefix was meant to hit";
    EXPECT_GT(st.kv_swa_blocks_released, 0);
  }
}
