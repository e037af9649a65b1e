// BlockPool: exact block ids, ref counts, free list vs. LRU, entry verification.
#include <gtest/gtest.h>

#include <vector>

#include "kv_cache/block_pool.h"

namespace serval {
namespace {

using Ids = std::vector<BlockId>;

std::vector<TokenId> seq(TokenId from, int n) {
  std::vector<TokenId> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

TEST(BlockPool, FreshPoolHandsOutIdsInOrder) {
  BlockPool p(4, 2);
  EXPECT_EQ(p.n_free(), 4);
  EXPECT_EQ(p.take(), 0);
  EXPECT_EQ(p.take(), 1);
  EXPECT_EQ(p.take(), 2);
  EXPECT_EQ(p.n_free(), 1);
  EXPECT_EQ(p.n_used(), 3);
  EXPECT_EQ(p.ref_count(0), 1);
  EXPECT_EQ(p.ref_count(3), 0);
}

TEST(BlockPool, ReleasedBlocksReturnFifo) {
  BlockPool p(4, 2);
  for (int i = 0; i < 4; ++i) p.take();
  p.unref(2);
  p.unref(0);
  EXPECT_EQ(p.free_list(), (Ids{2, 0}));
  EXPECT_EQ(p.take(), 2);
  EXPECT_EQ(p.take(), 0);
}

TEST(BlockPool, RefCountsKeepBlocksInUse) {
  BlockPool p(2, 2);
  const BlockId b = p.take();
  p.ref(b);
  EXPECT_EQ(p.ref_count(b), 2);
  p.unref(b);
  EXPECT_EQ(p.ref_count(b), 1);
  EXPECT_EQ(p.n_free(), 1);
  p.unref(b);
  EXPECT_EQ(p.n_free(), 2);
}

TEST(BlockPool, FreeBlocksBeforeEvictionThenLruOldestFirst) {
  BlockPool p(4, 2);
  for (int i = 0; i < 4; ++i) p.take();
  // Cache 0, 1, 2 (parent chain irrelevant here), release 1, 0, 2 in that order.
  for (BlockId b : {0, 1, 2}) p.cache(b, p.hash({}, seq(10 * b, 2), {}), seq(10 * b, 2), {}, 0);
  p.unref(1);
  p.unref(0);
  p.unref(2);
  p.unref(3);  // not cached: free list
  EXPECT_EQ(p.n_free(), 4);
  EXPECT_EQ(p.n_evictable(), 3);
  EXPECT_EQ(p.evictable_lru(), (Ids{1, 0, 2}));
  EXPECT_EQ(p.free_list(), (Ids{3}));

  EXPECT_EQ(p.take(), 3);  // the uncached free block first
  EXPECT_EQ(p.n_evictions(), 0);
  EXPECT_EQ(p.take(), 1);  // then least recently released
  EXPECT_FALSE(p.is_cached(1));
  EXPECT_EQ(p.find(p.hash({}, seq(10, 2), {}), seq(10, 2), {}, 0), -1);  // its entry is gone
  EXPECT_EQ(p.take(), 0);
  EXPECT_EQ(p.take(), 2);
  EXPECT_EQ(p.n_evictions(), 3);
  EXPECT_EQ(p.n_free(), 0);
}

TEST(BlockPool, HitOnEvictableBlockRevivesIt) {
  BlockPool p(3, 2);
  const BlockId a = p.take(), b = p.take();
  p.cache(a, p.hash({}, seq(1, 2), {}), seq(1, 2), {}, 0);
  p.cache(b, p.hash({}, seq(5, 2), {}), seq(5, 2), {}, 0);
  p.unref(a);
  p.unref(b);
  EXPECT_EQ(p.evictable_lru(), (Ids{a, b}));
  const BlockId hit = p.find(p.hash({}, seq(1, 2), {}), seq(1, 2), {}, 0);
  ASSERT_EQ(hit, a);
  p.ref(hit);
  EXPECT_EQ(p.ref_count(a), 1);
  EXPECT_EQ(p.evictable_lru(), (Ids{b}));
  EXPECT_EQ(p.n_free(), 2);
  p.unref(a);  // released again: now the most recent
  EXPECT_EQ(p.evictable_lru(), (Ids{b, a}));
}

TEST(BlockPool, FindVerifiesTokensKeyAndParentExactly) {
  BlockPool p(4, 2);
  const BlockId a = p.take();
  const PrefixKey k{1, 0};
  const Hash128 h = p.hash({}, seq(1, 2), k);
  const uint64_t e = p.cache(a, h, seq(1, 2), k, 0);
  EXPECT_GT(e, 0u);
  EXPECT_EQ(p.find(h, seq(1, 2), k, 0), a);
  EXPECT_EQ(p.find(h, std::vector<TokenId>{1, 3}, k, 0), -1);  // same hash, other tokens
  EXPECT_EQ(p.find(h, seq(1, 2), PrefixKey{2, 0}, 0), -1);     // same hash, other salt
  EXPECT_EQ(p.find(h, seq(1, 2), PrefixKey{1, 1}, 0), -1);     // same hash, other adapter
  EXPECT_EQ(p.find(h, seq(1, 2), k, e), -1);                   // same hash, other parent
  EXPECT_EQ(p.find(h, seq(1, 1), k, 0), -1);                   // not a full block
}

TEST(BlockPool, ForcedCollisionsNeverConfuseEntries) {
  BlockPool p(4, 2, [](const Hash128&, std::span<const TokenId>, const PrefixKey&) { return Hash128{42, 42}; });
  const BlockId a = p.take(), b = p.take(), c = p.take();
  const Hash128 h{42, 42};
  const uint64_t ea = p.cache(a, h, seq(1, 2), {}, 0);
  const uint64_t eb = p.cache(b, h, seq(3, 2), {}, 0);
  p.cache(c, h, seq(3, 2), {}, ea);  // block "3 4" after block "1 2"
  EXPECT_EQ(p.find(h, seq(1, 2), {}, 0), a);
  EXPECT_EQ(p.find(h, seq(3, 2), {}, 0), b);
  EXPECT_EQ(p.find(h, seq(3, 2), {}, ea), c);
  EXPECT_EQ(p.find(h, seq(3, 2), {}, eb), -1);
  EXPECT_EQ(p.find(h, seq(5, 2), {}, 0), -1);
  p.uncache(b);
  EXPECT_EQ(p.find(h, seq(3, 2), {}, 0), -1);
  EXPECT_EQ(p.find(h, seq(3, 2), {}, ea), c);
}

TEST(BlockPool, EntryIdsAreNeverReused) {
  BlockPool p(1, 1);
  const BlockId a = p.take();
  const uint64_t e1 = p.cache(a, {1, 1}, std::vector<TokenId>{7}, {}, 0);
  p.unref(a);
  EXPECT_EQ(p.take(), a);  // evicts it
  const uint64_t e2 = p.cache(a, {1, 1}, std::vector<TokenId>{7}, {}, 0);
  EXPECT_NE(e1, e2);
  EXPECT_EQ(p.entry(a), e2);
}

}  // namespace
}  // namespace serval
