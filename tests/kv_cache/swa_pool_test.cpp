// KvCacheManager's sliding-window pool (window 32, blocks of 16): exact block
// ids released behind the window, allocation that counts the releases,
// copy-on-write after a fork, prefix hits that need the window's blocks, and
// the config checks.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv_cache/kv_cache_manager.h"

namespace serval {
namespace {

using Ids = std::vector<BlockId>;
using Toks = std::vector<TokenId>;

KvCacheManager make_swa(int32_t n_blocks, int32_t n_swa, int32_t window = 32) {
  KvCacheConfig c;
  c.n_blocks = n_blocks;
  c.block_size = 16;
  c.n_swa_blocks = n_swa;
  c.swa_window = window;
  return KvCacheManager(c);
}

Ids swa(const KvCacheManager& kv, SeqId s) {
  auto t = kv.swa_block_table(s);
  return {t.begin(), t.end()};
}

Toks range(TokenId from, int n) {
  Toks v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(SwaPool, ValidateConfig) {
  KvCacheConfig c;
  c.n_blocks = 8;
  c.n_swa_blocks = 4;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);  // no window
  c.swa_window = 32;
  EXPECT_TRUE(KvCacheManager::validate(c).ok());
  c.n_host_blocks = 2;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);  // no swapping with it
  c.n_host_blocks = 0;
  c.n_swa_blocks = -1;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);
}

// Decoding one token a step: a step writing position p reads from p - 31 on,
// so blocks wholly before (p - 31) / 16 are released; four sliding-window
// blocks suffice for any length.
TEST(SwaPool, DecodeReleasesBehindTheWindowAndNeedsOnlyFourBlocks) {
  auto kv = make_swa(64, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 20, 0, &copies));  // prompt of 20: positions 0..19
  EXPECT_EQ(swa(kv, 1), (Ids{0, 1}));
  for (int64_t p = 20; p < 700; ++p) {
    ASSERT_TRUE(kv.can_allocate(1, p + 1, p)) << p;
    ASSERT_TRUE(kv.allocate(1, p + 1, p, &copies)) << p;
    const Ids t = swa(kv, 1);
    const size_t first = (size_t)std::max<int64_t>(0, p - 31) / 16;
    ASSERT_EQ(t.size(), (size_t)(p + 16) / 16);
    for (size_t j = 0; j < t.size(); ++j) EXPECT_EQ(t[j] < 0, j < first) << "position " << p << " block " << j;
    EXPECT_LE(kv.swa_blocks_held(1), 3);
  }
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.block_table(1).size(), 44u);  // the main pool keeps every block
  EXPECT_EQ(kv.stats().swa_released, 44 - 3);
  // The last step wrote 699, reading from 668 (block 41): 40 and below are gone.
  EXPECT_EQ(swa(kv, 1)[40], -1);
  EXPECT_GE(swa(kv, 1)[41], 0);
  kv.free(1);
  EXPECT_EQ(kv.n_free_swa_blocks(), 4);
  EXPECT_EQ(kv.n_free_blocks(), 64);
}

// A prefill chunk holds its whole span until the next step releases it.
TEST(SwaPool, ChunkNeedsItsSpanAndTheReleasesCount) {
  auto kv = make_swa(64, 6);
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(kv.can_allocate(1, 112, 0));  // 7 blocks at once: more than the pool
  ASSERT_TRUE(kv.can_allocate(1, 96, 0));
  ASSERT_TRUE(kv.allocate(1, 96, 0, &copies));
  EXPECT_EQ(kv.swa_blocks_held(1), 6);
  EXPECT_EQ(kv.n_free_swa_blocks(), 0);
  // The next chunk (96..191) reads from 65 on (block 4): blocks 0-3 are
  // released first, so 6 more blocks fit although none is free now.
  ASSERT_TRUE(kv.can_allocate(1, 160, 96));
  ASSERT_TRUE(kv.allocate(1, 160, 96, &copies));
  EXPECT_EQ(swa(kv, 1), (Ids{-1, -1, -1, -1, 4, 5, 0, 1, 2, 3}));  // the released blocks, reused in release order
}

TEST(SwaPool, ForkSharesAndCopiesOnWrite) {
  auto kv = make_swa(64, 16);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 40, 0, &copies));
  kv.fork(1, 2);
  EXPECT_EQ(swa(kv, 2), swa(kv, 1));
  ASSERT_TRUE(kv.allocate(2, 41, 40, &copies));  // writes position 40 in shared block 2
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0], (BlockCopy{2, 3, false}));
  EXPECT_EQ(copies[1], (BlockCopy{2, 3, true}));
  EXPECT_EQ(swa(kv, 2), (Ids{0, 1, 3}));  // position 40 still reads from 9 on (block 0)
  ASSERT_TRUE(kv.allocate(2, 49, 48, &copies));  // 48 reads from 17 on: block 0 released for seq 2 only
  EXPECT_EQ(swa(kv, 2), (Ids{-1, 1, 3, 4}));
  EXPECT_EQ(swa(kv, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(kv.ref_count(0), 2);  // main pool: still shared
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.n_free_swa_blocks(), 16);
}

// A prefix hit resumes at a block boundary and needs the blocks of the window
// before it; blocks released behind a finished sequence's window stay cached
// (evictable) until taken.
TEST(SwaPool, PrefixHitNeedsTheWindowsBlocks) {
  auto kv = make_swa(64, 16);
  const Toks t = range(100, 100);
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.acquire_cached_prefix(1, t, {}), 0);
  ASSERT_TRUE(kv.allocate(1, 100, 0, &copies));
  kv.cache_full_blocks(1, t, 100, {});
  const Ids first_run = swa(kv, 1);
  kv.free(1);
  Toks t2 = t;
  t2.push_back(7);
  // 6 full blocks match; resuming at 96 reads from 65 (block 4): blocks 4, 5.
  EXPECT_EQ(kv.find_cached_prefix(t2, {}), 96);
  ASSERT_EQ(kv.acquire_cached_prefix(2, t2, {}), 96);
  EXPECT_EQ(swa(kv, 2), (Ids{-1, -1, -1, -1, first_run[4], first_run[5]}));
  ASSERT_TRUE(kv.allocate(2, 101, 96, &copies));
  EXPECT_TRUE(copies.empty());
  kv.free(2);
  // Take every free sliding-window block, so the cached ones are evicted
  // oldest first: blocks 0-3 went first; then 4 and 5 (the window of a hit
  // at 96) are gone too and no hit is possible.
  std::vector<BlockCopy> c3;
  ASSERT_TRUE(kv.allocate(3, 16 * 16, 0, &c3));
  EXPECT_EQ(kv.find_cached_prefix(t2, {}), 0);
}

}  // namespace
}  // namespace serval
