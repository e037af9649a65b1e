// KvCacheManager: the allocator of the paged KV cache. It hands out block ids
// of the device pool (whose float arrays the runner owns: kv_storage.h) to
// sequences, shares blocks between sequences with reference counts and
// copy-on-write, keeps a prefix cache of full blocks (hash chain, exact
// verification, LRU eviction) with optional lower tiers (host RAM, disk:
// kv_tier.h), and an optional host swap space.
//
// DESIGN.md principle 3: callers see can_allocate/allocate/free and an opaque
// block table per sequence; ref counts, the free list and the prefix map live in
// the private BlockPool. Thread safety: none; the engine loop thread owns the
// manager and is its only caller. Block tables returned as spans stay valid
// until the next non-const call.
//
// Sliding-window layers (n_swa_blocks > 0): their K/V live in a second pool
// with its own block ids, and each sequence has a second table
// (swa_block_table) parallel to the first. A layer that attends to the last
// swa_window positions never reads a block wholly before the window of the
// earliest position a step writes, so allocate() releases such blocks
// (entry -1) and the second table holds about swa_window / block_size + 1
// blocks however long the sequence grows. Prefix caching: a full block's
// sliding-window blocks are cached too, keyed by the main pool's cache entry
// of the same block (an entry names one exact prefix, so the key is exact); a
// prefix hit needs the main pool's blocks and the sliding-window blocks of
// the window before the resume point, and is shortened to what both have.
// Swapping is off with a sliding-window pool (preemption recomputes).
//
// Copy and swap lists: the manager only emits them; whoever applies them must
// respect that a block released (free, swap_out) may be handed out again right
// away. For one batch of calls, this order is always safe:
//   1. swap_out (device -> host)   2. copies, in list order   3. swap_in (host -> device)
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv_cache/block_pool.h"
#include "kv_cache/kv_types.h"
#include "kv_cache/prefix_hash.h"
#include "serval/types.h"

namespace serval {

struct KvCacheConfig {
  int32_t n_blocks = 0;                // device pool size, blocks
  int32_t block_size = 16;             // tokens per block
  bool enable_prefix_caching = true;
  int32_t n_host_blocks = 0;           // host swap space, blocks; 0 = swapping off
  PrefixHashFn hash_fn;                // empty = SipHash-2-4-128 keyed by (hash_k0, hash_k1)
  uint64_t hash_k0 = 0, hash_k1 = 0;   // pick at random at startup to keep collisions unaimable
  int32_t n_swa_blocks = 0;            // sliding-window pool size, blocks; 0 = none
  int32_t swa_window = 0;              // positions a sliding-window layer attends to (itself included)
};

class KvCacheManager {
 public:
  // Checks a config from user input (flags): counts in range.
  static Status validate(const KvCacheConfig& cfg);
  // cfg must be valid (asserted).
  explicit KvCacheManager(KvCacheConfig cfg);

  // --- prefix cache ---
  // For a sequence holding no blocks: takes references on the longest run of
  // cached full blocks matching tokens' prefix under `key`, which become the
  // seq's first blocks. Never covers the whole of `tokens`: at least one token
  // is left to compute, so the result is <= tokens.size() - 1 rounded down to
  // whole blocks. Returns the tokens covered. Counts one query, tokens.size()
  // query tokens and the hit tokens. 0 (and no counting) with caching disabled.
  int64_t acquire_cached_prefix(SeqId seq, std::span<const TokenId> tokens, const PrefixKey& key);
  // What acquire_cached_prefix would return now; no references, no counters.
  int64_t find_cached_prefix(std::span<const TokenId> tokens, const PrefixKey& key) const;
  // Could a new sequence acquire its cached prefix of `tokens` and then grow to
  // n_tokens positions? (Acquiring an evictable cached block uses up a free one.)
  bool can_admit(std::span<const TokenId> tokens, const PrefixKey& key, int64_t n_tokens) const;
  // tokens[0, n_computed) of seq now have their K/V written: every newly full
  // block enters the prefix cache (or is matched to an equal cached block).
  void cache_full_blocks(SeqId seq, std::span<const TokenId> tokens, int64_t n_computed, const PrefixKey& key);

  // --- allocation ---
  // Could seq (possibly holding no blocks yet) grow to hold n_tokens positions
  // while writing positions [first_write_pos, n_tokens)? Counts copy-on-write
  // copies and evictable cached blocks as available. first_write_pos < 0 means
  // n_tokens - 1 (one decode token). False for a swapped-out seq.
  bool can_allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos = -1) const;
  // Grows seq's table to hold n_tokens positions. Each block written by
  // positions [first_write_pos, n_tokens) that is shared (ref count > 1) is
  // copied: a fresh block replaces it in this seq's table and {src, dst} is
  // appended to *copies; a written block that only this seq holds but that is in
  // the prefix cache leaves the cache (its KV is about to change). False (and
  // nothing changed) if not enough blocks.
  bool allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos, std::vector<BlockCopy>* copies);
  // child (holding nothing) shares all of parent's blocks (ref++ each).
  void fork(SeqId parent, SeqId child);
  // Drops all of seq's blocks, deepest first: cached ones become evictable
  // (the seq's last block is evicted before its first), the rest go to the
  // free list. A swapped-out seq releases its host blocks. Unknown seq: no-op.
  void free(SeqId seq);
  // Drops the blocks past position n_tokens (speculative-decoding rollback).
  void truncate(SeqId seq, int64_t n_tokens);

  // --- lower tiers of the prefix cache (kv_tier.h) ---
  // Cached blocks the pool evicts go to `tier` first, and prefix lookups
  // continue into it past the pool's own chain: acquire_cached_prefix() loads
  // such blocks into fresh device blocks (each uses up one free block, as
  // computing it would; can_admit() counts them so). Not with a
  // sliding-window pool. Not owned; nullptr turns the tiers off.
  void set_tier(KvTier* tier);
  // Hands every cached device block to the tier (at shutdown, so that a
  // persistent tier keeps what the pool held).
  void flush_to_tier();
  // Saved prefixes (Engine::prefix_op): the full blocks of `tokens` (all of
  // them, the last one too) that the pool or the tier holds, in chain order.
  // pin_prefix pins (or unpins) them on the tier; returns the tokens covered,
  // or -1 when the tier could not pin one (budget full of pinned blocks).
  // restore_prefix loads the tier's into the pool, as a hit would, and leaves
  // all of them evictable at the recent end; returns the tokens now cached
  // in the pool. Neither counts as a prefix query.
  int64_t pin_prefix(std::span<const TokenId> tokens, const PrefixKey& key, bool pin);
  // A request with this prompt has arrived: the tier starts reading the
  // blocks a hit would load from it (KvTier::prefetch), so that its disk
  // reads overlap with the steps that run before it is admitted.
  void prefetch_prefix(std::span<const TokenId> tokens, const PrefixKey& key) const;
  // Are the tier blocks a hit on this prompt would load in memory (not
  // still being read from disk: KvTier::ready)? Starts the reads of those
  // not yet read. The scheduler admits a request only then, so a request
  // waits for its own blocks while the others run.
  bool prefix_ready(std::span<const TokenId> tokens, const PrefixKey& key) const;
  int64_t restore_prefix(std::span<const TokenId> tokens, const PrefixKey& key);

  // --- swap tier (host blocks 0 .. n_host_blocks-1) ---
  bool can_swap_out(SeqId seq) const;  // holds device blocks and enough host blocks are free
  // Moves all of seq's blocks to fresh host blocks ({device, host} appended in
  // table order) and releases the device blocks (cached ones stay evictable).
  void swap_out(SeqId seq, std::vector<BlockSwap>* out);
  // Could seq be swapped in and then grow to n_tokens positions (0: just swap in)?
  bool can_swap_in(SeqId seq, int64_t n_tokens = 0) const;
  // Moves a swapped seq's blocks into fresh device blocks ({device, host}
  // appended in table order); the host blocks are released.
  void swap_in(SeqId seq, std::vector<BlockSwap>* in);
  bool is_swapped(SeqId seq) const;

  // --- queries ---
  std::span<const BlockId> block_table(SeqId seq) const;  // empty for unknown or swapped seqs
  // The sliding-window pool's table, as long as block_table(seq); -1 for the
  // blocks released behind the window. Empty without a sliding-window pool.
  std::span<const BlockId> swa_block_table(SeqId seq) const;
  bool has_swa() const { return cfg_.n_swa_blocks > 0; }
  int32_t n_swa_blocks() const { return cfg_.n_swa_blocks; }
  int32_t n_free_swa_blocks() const { return swa_pool_.n_free(); }
  int32_t swa_blocks_held(SeqId seq) const;  // entries of its second table that are not released
  int32_t block_size() const { return cfg_.block_size; }
  int32_t n_blocks() const { return cfg_.n_blocks; }
  int32_t n_free_blocks() const { return pool_.n_free(); }  // free incl. evictable
  int32_t n_free_host_blocks() const { return static_cast<int32_t>(host_free_.size()); }
  int32_t n_host_blocks() const { return cfg_.n_host_blocks; }
  bool prefix_caching() const { return cfg_.enable_prefix_caching; }
  // Blocks needed to hold n_tokens positions.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + cfg_.block_size - 1) / cfg_.block_size; }

  struct Stats {
    int64_t prefix_queries = 0;
    int64_t prefix_query_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t evictions = 0;
    int32_t used_blocks = 0;       // device blocks with ref count > 0
    int32_t peak_used_blocks = 0;
    int32_t cached_blocks = 0;     // blocks with a prefix-cache entry
    int32_t swa_used_blocks = 0;   // sliding-window pool: blocks with ref count > 0
    int32_t swa_peak_used_blocks = 0;
    int64_t swa_released = 0;      // blocks released behind the window (each sequence's own count)
    int64_t tier_hit_tokens = 0;     // part of prefix_hit_tokens: loaded from a lower tier
    int64_t tier_load_failures = 0;  // tier blocks that failed their check on load (the hit stops there)
  };
  Stats stats() const;

  // --- introspection for tests and metrics (not for scheduling decisions) ---
  int32_t ref_count(BlockId b) const { return pool_.ref_count(b); }
  bool is_cached(BlockId b) const { return pool_.is_cached(b); }
  std::vector<BlockId> evictable_blocks() const { return pool_.evictable_lru(); }  // eviction order
  std::vector<BlockId> free_list() const { return pool_.free_list(); }
  std::span<const int32_t> host_table(SeqId seq) const;

 private:
  struct ChainLink {  // the prefix-cache entry that holds one full block of this seq's tokens
    Hash128 hash;
    uint64_t entry = 0;
    BlockId block = -1;  // where that entry lives (this seq's block or an equal one)
  };
  struct SeqBlocks {
    std::vector<BlockId> table;  // device blocks (empty while swapped)
    std::vector<int32_t> host;   // host blocks while swapped
    bool swapped = false;
    std::vector<ChainLink> chain;  // chain[i]: entry for full block i, a prefix of the table
    std::vector<BlockId> swa;      // sliding-window pool, parallel to table; -1 = released
    size_t swa_lo = 0;             // swa[0, swa_lo) are released
    size_t swa_cached = 0;         // swa[0, swa_cached) went through cache_full_blocks
  };
  // A prefix hit: the main pool's chain and, with a sliding-window pool, the
  // cached sliding-window blocks [swa_lo, links.size()) it needs.
  struct Match {
    std::vector<ChainLink> links;
    std::vector<Hash128> tier;   // chain hashes of the blocks after links that a lower tier holds
    bool tier_complete = false;  // links + tier reach the most a hit may cover
    std::vector<BlockId> swa;  // swa[i - swa_lo] for block i
    size_t swa_lo = 0;
  };

  const SeqBlocks* find_seq(SeqId seq) const;
  // whole: every full block may match (saved prefixes); else at least one
  // token is left to compute.
  Match match(std::span<const TokenId> tokens, const PrefixKey& key, bool whole = false) const;
  // f(TierBlockMeta) for each block past the pool's chain that a hit would load from the tier.
  template <typename F>
  void for_each_tier_block(std::span<const TokenId> tokens, const PrefixKey& key, F&& f) const;
  // acquire_cached_prefix without the counting.
  int64_t acquire(SeqId seq, std::span<const TokenId> tokens, const PrefixKey& key, bool whole);
  int64_t blocks_needed(const SeqBlocks* s, int64_t n_tokens, int64_t first_write_pos) const;
  // Sliding-window blocks to take (copies and new blocks) minus those this seq
  // alone holds behind the window (they are released first).
  int64_t swa_blocks_needed(const SeqBlocks* s, int64_t n_tokens, int64_t first_write_pos) const;
  // The first block a step writing from first_write_pos still reads in a sliding-window layer.
  size_t swa_first_block(int64_t first_write_pos) const;
  void note_peak();

  KvCacheConfig cfg_;
  BlockPool pool_;
  BlockPool swa_pool_;  // one block (unused) without a sliding-window pool
  std::unordered_map<SeqId, SeqBlocks> seqs_;  // never iterated: decisions stay deterministic
  std::deque<int32_t> host_free_;
  KvTier* tier_ = nullptr;
  Stats stats_;
};

}  // namespace serval
