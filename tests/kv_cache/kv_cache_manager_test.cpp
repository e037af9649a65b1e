// KvCacheManager: exact block ids, reference counts, copy-on-write, the prefix
// cache (hits, isolation, LRU eviction order, forced collisions) and swapping.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv_cache/kv_cache_manager.h"

namespace serval {
namespace {

using Ids = std::vector<BlockId>;
using Toks = std::vector<TokenId>;

KvCacheManager make(int32_t n_blocks, int32_t block_size, int32_t n_host = 0, PrefixHashFn fn = {},
                    bool prefix = true) {
  KvCacheConfig c;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.n_host_blocks = n_host;
  c.hash_fn = std::move(fn);
  c.enable_prefix_caching = prefix;
  return KvCacheManager(c);
}

Ids table(const KvCacheManager& kv, SeqId s) {
  auto t = kv.block_table(s);
  return {t.begin(), t.end()};
}

Toks range(TokenId from, int n) {
  Toks v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

Toks cat(std::initializer_list<Toks> parts) {
  Toks v;
  for (const Toks& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// Admits seq with its cached prefix, "computes" the whole prompt and caches its
// full blocks, like one scheduler step plus update(). Returns the prefix hit.
int64_t prefill(KvCacheManager& kv, SeqId s, const Toks& t, PrefixKey key = {}) {
  const int64_t hit = kv.acquire_cached_prefix(s, t, key);
  std::vector<BlockCopy> copies;
  EXPECT_TRUE(kv.allocate(s, static_cast<int64_t>(t.size()), hit, &copies));
  EXPECT_TRUE(copies.empty());
  kv.cache_full_blocks(s, t, static_cast<int64_t>(t.size()), key);
  return hit;
}

TEST(KvCacheManager, ValidateConfig) {
  KvCacheConfig c;
  c.n_blocks = 8;
  EXPECT_TRUE(KvCacheManager::validate(c).ok());
  c.block_size = 0;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);
  c.block_size = 16;
  c.n_blocks = 0;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);
  c.n_blocks = 8;
  c.n_host_blocks = -1;
  EXPECT_EQ(KvCacheManager::validate(c).code(), StatusCode::invalid_argument);
}

TEST(KvCacheManager, AllocatesExactIdsAndGrows) {
  auto kv = make(8, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 10, 0, &copies));
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  ASSERT_TRUE(kv.allocate(2, 3, 0, &copies));
  EXPECT_EQ(table(kv, 2), (Ids{3}));
  ASSERT_TRUE(kv.allocate(1, 12, 10, &copies));  // still fits in block 2
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  ASSERT_TRUE(kv.allocate(1, 13, 12, &copies));
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2, 4}));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.n_free_blocks(), 3);
  EXPECT_EQ(kv.stats().used_blocks, 5);

  kv.free(1);  // uncached blocks go to the free list's tail, last block first
  EXPECT_EQ(kv.free_list(), (Ids{5, 6, 7, 4, 2, 1, 0}));
  EXPECT_TRUE(kv.block_table(1).empty());
  ASSERT_TRUE(kv.allocate(3, 16, 0, &copies));
  EXPECT_EQ(table(kv, 3), (Ids{5, 6, 7, 4}));
  EXPECT_EQ(kv.stats().peak_used_blocks, 5);
}

TEST(KvCacheManager, FailedAllocationChangesNothing) {
  auto kv = make(4, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 12, 0, &copies));
  EXPECT_TRUE(kv.can_allocate(2, 4, 0));
  EXPECT_FALSE(kv.can_allocate(2, 8, 0));
  EXPECT_FALSE(kv.allocate(2, 8, 0, &copies));
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_FALSE(kv.allocate(1, 20, 12, &copies));
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesOnWriteExactlyOnce) {
  auto kv = make(8, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 6, 0, &copies));  // positions 0..5: block 1 is half full
  kv.fork(1, 2);
  EXPECT_EQ(table(kv, 2), (Ids{0, 1}));
  EXPECT_EQ(kv.ref_count(0), 2);
  EXPECT_EQ(kv.ref_count(1), 2);
  EXPECT_EQ(kv.n_free_blocks(), 6);

  ASSERT_TRUE(kv.allocate(1, 7, 6, &copies));  // parent writes position 6 into shared block 1
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(table(kv, 1), (Ids{0, 2}));
  EXPECT_EQ(kv.ref_count(1), 1);
  EXPECT_EQ(kv.ref_count(2), 1);

  ASSERT_TRUE(kv.allocate(2, 7, 6, &copies));  // the child now owns block 1 alone: no copy
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(table(kv, 2), (Ids{0, 1}));
  EXPECT_EQ(kv.ref_count(0), 2);  // the full first block stays shared

  kv.free(2);
  EXPECT_EQ(kv.ref_count(0), 1);
  EXPECT_EQ(kv.ref_count(1), 0);
  EXPECT_EQ(kv.free_list(), (Ids{3, 4, 5, 6, 7, 1}));
}

TEST(KvCacheManager, ForkAtBlockBoundaryNeedsNoCopy) {
  auto kv = make(8, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 8, 0, &copies));
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate(1, 9, 8, &copies));
  ASSERT_TRUE(kv.allocate(2, 9, 8, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(table(kv, 2), (Ids{0, 1, 3}));
}

TEST(KvCacheManager, CanAllocateCountsCopyOnWrite) {
  auto kv = make(2, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 6, 0, &copies));
  kv.fork(1, 2);
  EXPECT_EQ(kv.n_free_blocks(), 0);
  EXPECT_FALSE(kv.can_allocate(1, 7, 6));  // the write needs a private copy of block 1
  EXPECT_FALSE(kv.can_allocate(1, 7));     // default: one decode token at position 6
  EXPECT_TRUE(kv.can_allocate(1, 6, 6));   // nothing written
  EXPECT_FALSE(kv.allocate(1, 7, 6, &copies));
  kv.free(2);
  EXPECT_TRUE(kv.can_allocate(1, 7, 6));
  ASSERT_TRUE(kv.allocate(1, 7, 6, &copies));
  EXPECT_TRUE(copies.empty());
}

TEST(KvCacheManager, PrefixHitOnFirstTwoBlocksOnly) {
  auto kv = make(16, 4);
  const Toks a = range(1, 12);
  EXPECT_EQ(prefill(kv, 1, a), 0);
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  EXPECT_TRUE(kv.is_cached(0) && kv.is_cached(1) && kv.is_cached(2));

  const Toks b = cat({range(1, 8), range(100, 4), {5}});  // same first 2 blocks, different third
  EXPECT_EQ(kv.find_cached_prefix(b, {}), 8);
  EXPECT_EQ(prefill(kv, 2, b), 8);
  EXPECT_EQ(table(kv, 2), (Ids{0, 1, 3, 4}));
  EXPECT_EQ(kv.ref_count(0), 2);
  EXPECT_EQ(kv.ref_count(1), 2);
  EXPECT_EQ(kv.ref_count(2), 1);
  EXPECT_TRUE(kv.is_cached(3));
  EXPECT_FALSE(kv.is_cached(4));  // partial

  const auto st = kv.stats();
  EXPECT_EQ(st.prefix_queries, 2);
  EXPECT_EQ(st.prefix_query_tokens, 12 + 13);
  EXPECT_EQ(st.prefix_hit_tokens, 8);
}

TEST(KvCacheManager, HitNeverCoversTheWholePrompt) {
  auto kv = make(16, 4);
  prefill(kv, 1, range(1, 12));
  EXPECT_EQ(kv.find_cached_prefix(range(1, 12), {}), 8);   // one token must remain to compute
  EXPECT_EQ(kv.find_cached_prefix(range(1, 13), {}), 12);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 9), {}), 8);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 8), {}), 4);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 1), {}), 0);
  EXPECT_EQ(kv.find_cached_prefix(Toks{}, {}), 0);
  EXPECT_EQ(kv.find_cached_prefix(range(2, 12), {}), 0);
}

TEST(KvCacheManager, SaltAndAdapterIsolatePrefixes) {
  auto kv = make(16, 4);
  prefill(kv, 1, range(1, 12), PrefixKey{1, 0});
  EXPECT_EQ(kv.find_cached_prefix(range(1, 13), PrefixKey{1, 0}), 12);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 13), PrefixKey{2, 0}), 0);  // other tenant
  EXPECT_EQ(kv.find_cached_prefix(range(1, 13), PrefixKey{1, 5}), 0);  // other adapter
  EXPECT_EQ(kv.find_cached_prefix(range(1, 13), PrefixKey{}), 0);
}

TEST(KvCacheManager, EvictionIsLeastRecentlyReleasedFirstDeepestBlockFirst) {
  auto kv = make(5, 2);
  prefill(kv, 1, range(1, 6));  // blocks 0, 1, 2, all full and cached
  kv.free(1);
  EXPECT_EQ(kv.evictable_blocks(), (Ids{2, 1, 0}));
  EXPECT_EQ(kv.n_free_blocks(), 5);
  prefill(kv, 2, range(50, 4));  // the two free blocks first: 3, 4
  EXPECT_EQ(table(kv, 2), (Ids{3, 4}));
  kv.free(2);
  EXPECT_EQ(kv.evictable_blocks(), (Ids{2, 1, 0, 4, 3}));

  // Evicting seq 1's deepest block keeps its first two blocks reachable.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(3, 2, 0, &copies));
  EXPECT_EQ(table(kv, 3), (Ids{2}));
  EXPECT_EQ(kv.stats().evictions, 1);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 7), {}), 4);

  ASSERT_TRUE(kv.allocate(4, 8, 0, &copies));
  EXPECT_EQ(table(kv, 4), (Ids{1, 0, 4, 3}));  // exactly oldest first
  EXPECT_EQ(kv.stats().evictions, 5);
  EXPECT_EQ(kv.find_cached_prefix(range(1, 7), {}), 0);
  EXPECT_EQ(kv.n_free_blocks(), 0);
}

TEST(KvCacheManager, HitRevivesEvictableBlocks) {
  auto kv = make(6, 2);
  prefill(kv, 1, range(1, 6));
  kv.free(1);
  EXPECT_EQ(kv.evictable_blocks(), (Ids{2, 1, 0}));
  EXPECT_EQ(kv.acquire_cached_prefix(2, range(1, 5), {}), 4);
  EXPECT_EQ(table(kv, 2), (Ids{0, 1}));
  EXPECT_EQ(kv.ref_count(0), 1);
  EXPECT_EQ(kv.evictable_blocks(), (Ids{2}));
  EXPECT_EQ(kv.n_free_blocks(), 4);
}

TEST(KvCacheManager, CanAdmitCountsEvictableHitsAsUsed) {
  auto kv = make(3, 2);
  const Toks t = range(1, 5);
  prefill(kv, 1, t);  // blocks 0, 1 cached, block 2 partial
  kv.free(1);
  EXPECT_EQ(kv.free_list(), (Ids{2}));
  EXPECT_EQ(kv.evictable_blocks(), (Ids{1, 0}));
  EXPECT_TRUE(kv.can_admit(t, {}, 5));  // 2 revived + 1 new = 3
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(9, 1, 0, &copies));  // takes block 2
  EXPECT_EQ(kv.n_free_blocks(), 2);
  EXPECT_FALSE(kv.can_admit(t, {}, 5));  // would need 3
  EXPECT_TRUE(kv.can_admit(t, {}, 4));   // 2 revived, no new block
}

TEST(KvCacheManager, ForcedHashCollisionsNeverReturnAnotherPromptsKv) {
  // Every block hashes to the same value: only exact verification separates them.
  auto kv = make(32, 4, 0, [](const Hash128&, std::span<const TokenId>, const PrefixKey&) { return Hash128{}; });
  const Toks x = range(1, 4), y = range(20, 4), z = range(40, 4), w = range(60, 4);
  prefill(kv, 1, cat({x, z, {0}}));
  prefill(kv, 2, cat({y, w, {0}}));
  EXPECT_EQ(kv.find_cached_prefix(cat({x, z, {9}}), {}), 8);
  EXPECT_EQ(kv.find_cached_prefix(cat({y, w, {9}}), {}), 8);
  EXPECT_EQ(kv.find_cached_prefix(cat({range(80, 4), {9}}), {}), 0);  // unseen block
  EXPECT_EQ(kv.find_cached_prefix(cat({y, z, {9}}), {}), 4);  // z is cached, but only after x
  EXPECT_EQ(kv.find_cached_prefix(cat({x, w, {9}}), {}), 4);  // w is cached, but only after y
  EXPECT_EQ(kv.find_cached_prefix(cat({z, {9}}), {}), 0);     // z as a first block
  EXPECT_EQ(kv.find_cached_prefix(cat({x, z, {9}}), PrefixKey{1, 0}), 0);
  const int64_t hit = kv.acquire_cached_prefix(3, cat({y, z, {9}}), {});
  EXPECT_EQ(hit, 4);
  EXPECT_EQ(table(kv, 3), (Ids{table(kv, 2)[0]}));  // y's block, never x's
}

TEST(KvCacheManager, DuplicatePrefillsShareOneEntryAndRelinkAfterEviction) {
  auto kv = make(10, 2);
  const Toks t = range(1, 5);
  std::vector<BlockCopy> copies;
  // Two requests with the same prompt computed in the same step (no hit yet).
  EXPECT_EQ(kv.acquire_cached_prefix(1, t, {}), 0);
  EXPECT_EQ(kv.acquire_cached_prefix(2, t, {}), 0);
  ASSERT_TRUE(kv.allocate(1, 5, 0, &copies));
  ASSERT_TRUE(kv.allocate(2, 5, 0, &copies));
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  EXPECT_EQ(table(kv, 2), (Ids{3, 4, 5}));
  kv.cache_full_blocks(1, t, 5, {});
  kv.cache_full_blocks(2, t, 5, {});
  EXPECT_TRUE(kv.is_cached(0) && kv.is_cached(1));
  EXPECT_FALSE(kv.is_cached(3) || kv.is_cached(4));  // equal to blocks 0, 1: not registered twice

  kv.free(1);
  EXPECT_EQ(kv.evictable_blocks(), (Ids{1, 0}));
  ASSERT_TRUE(kv.allocate(3, 14, 0, &copies));  // 7 blocks: 6, 7, 8, 9, 2, then evicts 1, 0
  EXPECT_EQ(table(kv, 3), (Ids{6, 7, 8, 9, 2, 1, 0}));
  EXPECT_EQ(kv.find_cached_prefix(range(1, 7), {}), 0);

  // Seq 2 computes one more token: its chain is re-linked onto its own blocks.
  Toks t2 = range(1, 6);
  ASSERT_TRUE(kv.allocate(2, 6, 5, &copies));
  kv.cache_full_blocks(2, t2, 6, {});
  EXPECT_TRUE(kv.is_cached(3) && kv.is_cached(4) && kv.is_cached(5));
  EXPECT_EQ(kv.acquire_cached_prefix(4, range(1, 7), {}), 6);
  EXPECT_EQ(table(kv, 4), (Ids{3, 4, 5}));
}

TEST(KvCacheManager, TruncateDropsBlocksAndRewritesLeaveTheCache) {
  auto kv = make(8, 2);
  prefill(kv, 1, range(1, 6));
  EXPECT_EQ(table(kv, 1), (Ids{0, 1, 2}));
  kv.truncate(1, 3);  // keep positions 0..2
  EXPECT_EQ(table(kv, 1), (Ids{0, 1}));
  EXPECT_EQ(kv.evictable_blocks(), (Ids{2}));
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 4, 3, &copies));  // rewrite position 3 in cached block 1
  EXPECT_TRUE(copies.empty());
  EXPECT_FALSE(kv.is_cached(1));
  EXPECT_TRUE(kv.is_cached(0));
  EXPECT_EQ(kv.find_cached_prefix(range(1, 7), {}), 2);  // block 2 hangs off the dead entry

  // A shared block is copied instead.
  kv.fork(1, 2);
  kv.truncate(2, 1);
  EXPECT_EQ(table(kv, 2), (Ids{0}));
  ASSERT_TRUE(kv.allocate(2, 2, 1, &copies));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{0, 3}}));
  EXPECT_EQ(table(kv, 2), (Ids{3}));
  EXPECT_TRUE(kv.is_cached(0));
}

TEST(KvCacheManager, SwapOutAndIn) {
  auto kv = make(4, 2, 4);
  std::vector<BlockCopy> copies;
  std::vector<BlockSwap> out, in;
  prefill(kv, 1, range(1, 5));  // blocks 0, 1 cached, 2 partial
  EXPECT_FALSE(kv.can_swap_in(1));
  ASSERT_TRUE(kv.can_swap_out(1));
  kv.swap_out(1, &out);
  EXPECT_EQ(out, (std::vector<BlockSwap>{{0, 0}, {1, 1}, {2, 2}}));
  EXPECT_TRUE(kv.is_swapped(1));
  EXPECT_TRUE(kv.block_table(1).empty());
  EXPECT_EQ(std::vector<int32_t>(kv.host_table(1).begin(), kv.host_table(1).end()), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kv.n_free_host_blocks(), 1);
  EXPECT_EQ(kv.free_list(), (Ids{3, 2}));
  EXPECT_EQ(kv.evictable_blocks(), (Ids{1, 0}));  // the cached KV stays reusable
  EXPECT_FALSE(kv.can_allocate(1, 6, 5));

  ASSERT_TRUE(kv.allocate(2, 4, 0, &copies));
  EXPECT_EQ(table(kv, 2), (Ids{3, 2}));
  EXPECT_FALSE(kv.can_swap_in(1));  // 3 blocks needed, 2 evictable
  kv.free(2);
  EXPECT_TRUE(kv.can_swap_in(1, 6));
  EXPECT_FALSE(kv.can_swap_in(1, 9));
  kv.swap_in(1, &in);
  EXPECT_EQ(in, (std::vector<BlockSwap>{{2, 0}, {3, 1}, {1, 2}}));
  EXPECT_EQ(table(kv, 1), (Ids{2, 3, 1}));
  EXPECT_FALSE(kv.is_swapped(1));
  EXPECT_EQ(kv.n_free_host_blocks(), 4);
  ASSERT_TRUE(kv.allocate(1, 6, 5, &copies));
  EXPECT_TRUE(copies.empty());
}

TEST(KvCacheManager, SwapNeedsHostSpace) {
  auto kv = make(8, 2, 2);
  std::vector<BlockCopy> copies;
  std::vector<BlockSwap> out;
  ASSERT_TRUE(kv.allocate(1, 5, 0, &copies));  // 3 blocks > 2 host blocks
  EXPECT_FALSE(kv.can_swap_out(1));
  ASSERT_TRUE(kv.allocate(2, 4, 0, &copies));
  ASSERT_TRUE(kv.can_swap_out(2));
  kv.swap_out(2, &out);
  EXPECT_EQ(kv.n_free_host_blocks(), 0);
  kv.free(2);  // a swapped seq releases its host blocks
  EXPECT_EQ(kv.n_free_host_blocks(), 2);
  EXPECT_FALSE(kv.can_swap_out(3));  // unknown
  auto none = make(8, 2, 0);
  ASSERT_TRUE(none.allocate(1, 2, 0, &copies));
  EXPECT_FALSE(none.can_swap_out(1));
}

TEST(KvCacheManager, PrefixCachingOff) {
  auto kv = make(8, 2, 0, {}, /*prefix=*/false);
  EXPECT_EQ(prefill(kv, 1, range(1, 6)), 0);
  EXPECT_FALSE(kv.is_cached(0));
  kv.free(1);
  EXPECT_TRUE(kv.evictable_blocks().empty());
  EXPECT_EQ(prefill(kv, 2, range(1, 6)), 0);
  EXPECT_EQ(kv.stats().prefix_queries, 0);
}

}  // namespace
}  // namespace serval
