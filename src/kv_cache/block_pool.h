// BlockPool: the device block ids of the paged KV cache, their reference
// counts, the free list, and the prefix cache (hash -> full cached blocks, with
// an LRU of the unreferenced cached blocks that are kept until evicted).
//
// Private to kv_cache/ (DESIGN.md principle 3): KvCacheManager owns one and is
// the only caller; the scheduler never sees ref counts, lists or hashes.
// Single-threaded: owned and called by the engine loop thread only.
//
// Every block is in exactly one of three states:
//   in use     ref_count > 0 (cached or not)
//   free       ref_count == 0, not cached: in the free list (FIFO)
//   evictable  ref_count == 0, cached: in the LRU list, least recently released first
// take() hands out a free block first (a fresh pool: 0, 1, 2, ...; after that in
// the order blocks were released) and only then evicts the least recently
// released cached block, so cached KV survives as long as possible.
//
// Prefix-cache entries. A cached block carries a cache entry: its chain hash,
// its token ids (kept here, n_blocks * block_size ids allocated up front), its
// PrefixKey and the entry id of its parent block's entry (0 for a first block).
// Entry ids are unique for the pool's lifetime (a counter, never reused), so an
// entry id names one exact, immutable token prefix: find() accepts a candidate
// only if its tokens, key and parent entry id all match exactly. By induction
// over the chain a hit therefore always holds the KV of exactly the queried
// prefix, whatever the hash function does (a colliding hash only costs time).
// When a block is evicted or uncached its entry dies; children whose parent
// entry died can no longer be reached (they age out of the LRU).
//
// Lower tiers (kv_tier.h): with set_tier(), take() hands a cached block it is
// about to evict to the tier first, with its chain hash, its parent's chain
// hash (given to cache()), key and token ids.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv_cache/kv_tier.h"
#include "kv_cache/kv_types.h"
#include "kv_cache/prefix_hash.h"

namespace serval {

class BlockPool {
 public:
  // hash_fn may be empty: SipHash-2-4-128 under (hash_k0, hash_k1).
  BlockPool(int32_t n_blocks, int32_t block_size, PrefixHashFn hash_fn = {}, uint64_t hash_k0 = 0,
            uint64_t hash_k1 = 0);

  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()) + n_evictable_; }  // incl. evictable
  int32_t n_evictable() const { return n_evictable_; }
  int32_t n_used() const { return n_blocks() - n_free(); }
  int64_t n_evictions() const { return n_evictions_; }
  int32_t n_cached() const { return n_cached_; }  // blocks with a prefix-cache entry (in use or evictable)

  // A block with ref_count 1: the free list's head, else the LRU head evicted
  // (its entry removed). Requires n_free() > 0.
  BlockId take();
  // ref_count++. A block with ref_count 0 must be cached (an evictable block
  // being reused by a prefix hit): it leaves the LRU.
  void ref(BlockId b);
  // ref_count--. At 0: a cached block becomes the most recently released
  // evictable block, any other block goes to the free list's tail.
  void unref(BlockId b);
  int32_t ref_count(BlockId b) const { return blocks_[check(b)].ref; }

  // --- prefix cache ---
  Hash128 hash(const Hash128& parent, std::span<const TokenId> tokens, const PrefixKey& key) const;
  // The cached block whose entry matches exactly (hash, token ids, key, parent
  // entry id), or -1. Candidates with the same hash are tried oldest first.
  BlockId find(const Hash128& h, std::span<const TokenId> tokens, const PrefixKey& key,
               uint64_t parent_entry) const;
  // Registers in-use, uncached block b as holding `tokens` (block_size ids)
  // after the prefix named by parent_entry (whose chain hash is parent_hash:
  // kept for the lower tiers). Returns its new entry id (> 0).
  uint64_t cache(BlockId b, const Hash128& h, std::span<const TokenId> tokens, const PrefixKey& key,
                 uint64_t parent_entry, const Hash128& parent_hash = {});
  // Removes b's entry (b must be in use): its KV is about to be overwritten.
  void uncache(BlockId b);
  uint64_t entry(BlockId b) const { return blocks_[check(b)].entry; }  // 0 = not cached
  bool is_cached(BlockId b) const { return entry(b) != 0; }
  // The name of cached block b for the lower tiers (valid until b changes).
  TierBlockMeta meta(BlockId b) const;
  // Evicted cached blocks go to `tier` first (nullptr: dropped). Not owned.
  void set_tier(KvTier* tier) { tier_ = tier; }
  std::vector<BlockId> cached_blocks() const;  // every block with an entry, in id order

  // --- introspection for tests ---
  std::vector<BlockId> free_list() const { return {free_.begin(), free_.end()}; }
  std::vector<BlockId> evictable_lru() const;  // next to be evicted first

 private:
  struct Block {
    int32_t ref = 0;
    uint64_t entry = 0;         // 0 = not cached
    uint64_t parent_entry = 0;  // valid if entry != 0
    Hash128 hash;               // valid if entry != 0
    Hash128 parent_hash;        // valid if entry != 0
    PrefixKey key;              // valid if entry != 0
    BlockId lru_prev = -1;      // valid while evictable
    BlockId lru_next = -1;
  };

  BlockId check(BlockId b) const;
  std::span<const TokenId> tokens_of(BlockId b) const {
    return {block_tokens_.data() + static_cast<size_t>(b) * block_size_, static_cast<size_t>(block_size_)};
  }
  void lru_push_back(BlockId b);
  void lru_remove(BlockId b);
  void drop_entry(BlockId b);

  int32_t block_size_;
  PrefixHashFn hash_fn_;
  uint64_t hash_k0_, hash_k1_;
  std::vector<Block> blocks_;
  std::vector<TokenId> block_tokens_;  // [n_blocks, block_size]: the ids of each cached block
  std::deque<BlockId> free_;
  BlockId lru_head_ = -1, lru_tail_ = -1;
  int32_t n_evictable_ = 0;
  int64_t n_evictions_ = 0;
  int32_t n_cached_ = 0;
  uint64_t next_entry_ = 1;
  KvTier* tier_ = nullptr;
  std::unordered_map<Hash128, std::vector<BlockId>, Hash128Hasher> by_hash_;  // insertion order
};

}  // namespace serval
