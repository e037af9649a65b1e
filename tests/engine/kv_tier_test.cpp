// KV cache tiers through the engine (stories260K): a prefix the pool evicted
// is served from the RAM tier, and after a pool + RAM eviction from disk, with
// tokens and log-probabilities bit-identical to a cold run; an engine started
// on the same --kv-cache-dir hits the disk tier on its first request; another
// KV type in that directory never reads those files.
#include <filesystem>
#include <random>

#include "engine/engine_test_util.h"

using namespace serval;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("serval-engine-tier-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Four 200-token prompts (12 full blocks of 16 each), no shared prefix.
std::vector<std::vector<TokenId>> prompts() {
  std::vector<std::vector<TokenId>> ps;
  uint32_t s = 777;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p = {1};
    while (p.size() < 200) {
      s = s * 1664525u + 1013904223u;
      p.push_back((TokenId)(3 + (s >> 8) % 500));
    }
    ps.push_back(p);
  }
  return ps;
}

EngineConfig small_pool() {
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.block_size = 16;
  cfg.kv_type = KvType::f32;
  // Room for one prompt and its generation (plus a little): each next prompt
  // evicts the previous one's cached blocks.
  const auto& mc = stories().model->config();
  const size_t per_block = (size_t)mc.n_layers * 2 * 16 * (size_t)mc.kv_dim() * sizeof(float);
  cfg.kv_memory_bytes = 16 * per_block;
  return cfg;
}

Sample run(Engine& e, const std::vector<TokenId>& p) {
  auto s = e.submit(greedy_request(p, 12));
  EXPECT_TRUE(s.ok()) << s.status().message();
  return collect(**s, 1)[0];
}

void expect_same(const Sample& a, const Sample& b, const char* what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.chosen_logprobs, b.chosen_logprobs) << what;  // bit for bit
  EXPECT_EQ(a.top_logprobs, b.top_logprobs) << what;
}

std::vector<Sample> cold(const std::vector<std::vector<TokenId>>& ps) {
  EngineConfig cfg = small_pool();
  cfg.enable_prefix_caching = false;
  auto e = make_engine(cfg);
  std::vector<Sample> out;
  for (const auto& p : ps) out.push_back(run(*e, p));
  return out;
}

}  // namespace

TEST(KvTiers, EvictedPrefixIsServedFromRamThenDiskBitIdentical) {
  const auto ps = prompts();
  const auto ref = cold(ps);
  TempDir d;
  EngineConfig cfg = small_pool();
  const size_t bpb = (size_t)stories().model->config().n_layers * 2 * 16 *
                     (size_t)stories().model->config().kv_dim() * sizeof(float);
  cfg.kv_cache_ram_bytes = 14 * bpb;  // one prompt's blocks, not two
  cfg.kv_cache_dir = d.path.string();
  cfg.kv_cache_disk_bytes = 64 << 20;
  auto e = make_engine(cfg);
  expect_same(run(*e, ps[0]), ref[0], "cold 0");
  expect_same(run(*e, ps[1]), ref[1], "cold 1");  // evicts prompt 0 from the pool into RAM
  EngineStats st = settled_stats(*e);
  EXPECT_EQ(st.tier_hit_tokens, 0);
  int64_t hits = st.prefix_hit_tokens;
  expect_same(run(*e, ps[0]), ref[0], "0 from RAM");
  st = settled_stats(*e);
  // 12 full blocks hit: all but the prompt's last partial block. The pool
  // still holds the first few (evicted last); the rest come from RAM.
  EXPECT_EQ(st.prefix_hit_tokens - hits, 192);
  EXPECT_GE(st.tier_hit_tokens, 8 * 16);
  // Promoting evicts prompt 1's blocks into the full RAM tier, which pushes
  // this prefix's last blocks on to disk before they are loaded.
  EXPECT_EQ((st.kv_tiers.ram_hits + st.kv_tiers.disk_hits) * 16, st.tier_hit_tokens);
  EXPECT_GE(st.kv_tiers.ram_hits, 4);
  const int64_t ram_hits = st.kv_tiers.ram_hits;
  // Two more prompts push prompt 1 out of the pool and then out of RAM.
  expect_same(run(*e, ps[2]), ref[2], "cold 2");
  expect_same(run(*e, ps[3]), ref[3], "cold 3");
  hits = st.prefix_hit_tokens;
  const int64_t tier_hits = st.tier_hit_tokens;
  expect_same(run(*e, ps[1]), ref[1], "1 from disk");
  st = settled_stats(*e);
  EXPECT_EQ(st.prefix_hit_tokens - hits, 192);
  EXPECT_EQ(st.tier_hit_tokens - tier_hits, 192);  // nothing of prompt 1 is left in the pool
  EXPECT_GE(st.kv_tiers.disk_hits, 1);
  EXPECT_GE(st.kv_tiers.ram_hits, ram_hits);
  EXPECT_EQ(st.tier_load_failures, 0);
  EXPECT_LE(st.kv_tiers.ram_blocks, st.kv_tiers.ram_capacity_blocks);
  EXPECT_LE(st.kv_tiers.disk_bytes, st.kv_tiers.disk_budget_bytes);
  EXPECT_EQ(st.kv_tiers.disk_corrupt, 0);
}

TEST(KvTiers, RestartedEngineHitsTheDiskTierOnItsFirstRequest) {
  const auto ps = prompts();
  const auto ref = cold(ps);
  TempDir d;
  EngineConfig cfg = small_pool();
  cfg.kv_cache_dir = d.path.string();
  cfg.kv_cache_disk_bytes = 64 << 20;
  {
    auto e = make_engine(cfg);
    expect_same(run(*e, ps[0]), ref[0], "cold 0");
  }  // shutdown: the pool's cached blocks are written to disk
  {
    auto e = make_engine(cfg);
    EngineStats st = settled_stats(*e);
    EXPECT_GE(st.kv_tiers.disk_recovered, 12);
    expect_same(run(*e, ps[0]), ref[0], "0 after a restart");
    st = settled_stats(*e);
    EXPECT_EQ(st.tier_hit_tokens, 192);
    EXPECT_EQ(st.kv_tiers.disk_hits, 12);
  }
  // Another KV type: the files are foreign, never read.
  EngineConfig other = cfg;
  other.kv_type = KvType::f16;
  auto e = make_engine(other);
  EngineStats st = settled_stats(*e);
  EXPECT_GE(st.kv_tiers.disk_foreign, 12);
  EXPECT_EQ(st.kv_tiers.disk_files, 0);
  run(*e, ps[0]);
  EXPECT_EQ(settled_stats(*e).tier_hit_tokens, 0);
}

TEST(KvTiers, BadConfigurationsAreRefused) {
  EngineConfig cfg = small_pool();
  cfg.kv_cache_ram_bytes = 10;  // holds no block
  EXPECT_FALSE(Engine::create(stories().model, *stories().tok, cfg).ok());
  cfg.kv_cache_ram_bytes = 1 << 20;
  cfg.enable_prefix_caching = false;
  auto e = Engine::create(stories().model, *stories().tok, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("prefix caching"), std::string::npos) << e.status().message();
  cfg.enable_prefix_caching = true;
  cfg.kv_cache_ram_bytes = 0;
  cfg.kv_cache_dir = "/proc/version/not-a-dir";
  cfg.kv_cache_disk_bytes = 1 << 20;
  EXPECT_FALSE(Engine::create(stories().model, *stories().tok, cfg).ok());
}
