// KvTier: the lower tiers of the prefix cache (host RAM, disk) as the
// allocator sees them. A full cached block that the device pool evicts is
// handed to store() first; a prefix lookup that runs past the device pool's
// chain asks contains() for the next blocks, and acquire_cached_prefix()
// load()s them into fresh device blocks. The implementation (tiered_store.h)
// owns the bytes; KvCacheManager only passes block ids and names.
//
// A block outside the pool is named by its chain hash and checked exactly on
// every lookup: its token ids, its PrefixKey and its parent's chain hash must
// all equal the query's. The device pool's own check goes through parent entry
// ids (exact by construction); a tier cannot keep those across evictions and
// restarts, so a tier hit rests on the parent link's 128-bit keyed SipHash
// (the same trust vLLM and LMCache put in a prefix hash chain).
//
// Called by the engine loop thread only (through the manager).
#pragma once

#include <span>

#include "kv_cache/kv_types.h"
#include "kv_cache/prefix_hash.h"
#include "serval/types.h"

namespace serval {

struct TierBlockMeta {
  Hash128 hash;    // the block's chain hash: names its whole prefix
  Hash128 parent;  // the parent block's chain hash (zero for a sequence's first block)
  PrefixKey key;
  std::span<const TokenId> tokens;  // block_size ids
};

// Counters of the lower tiers (TieredKvStore::stats()); zero without tiers.
struct KvTierStats {
  size_t block_bytes = 0;  // KV payload of one block
  int64_t ram_capacity_blocks = 0, ram_blocks = 0;
  int64_t ram_hits = 0, ram_misses = 0, ram_stores = 0, ram_evictions = 0;
  int64_t disk_budget_bytes = 0, disk_bytes = 0, disk_files = 0;  // disk_bytes: files on disk or being written
  int64_t disk_hits = 0, disk_misses = 0, disk_writes = 0, disk_evictions = 0;
  int64_t disk_write_drops = 0;  // stores dropped: write queue full or a write failed
  int64_t disk_corrupt = 0;      // files of ours that failed a check (deleted, never used)
  int64_t disk_foreign = 0;      // files of another model / KV layout / format (ignored)
  int64_t disk_recovered = 0;    // files indexed at start (a restart's cache)
  int64_t disk_pinned = 0;       // files pinned by saved prefixes (sessions)
  int64_t disk_prefetches = 0;   // background reads queued for arriving requests
  int64_t disk_staged_reads = 0;  // of them, read and checked into memory off the engine thread
  int64_t disk_staged_loads = 0;  // promotions served from those copies
  int64_t disk_staged_drops = 0;  // staged copies dropped unused
  int64_t disk_staged_bytes = 0;  // bytes staged or being read now
  int64_t loads = 0;             // blocks promoted into the pool
  int64_t bytes_stored = 0, bytes_loaded = 0;
  double load_seconds = 0;       // time spent promoting them
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  // Device block `device` holds the KV of `m` and is about to be reused: keep
  // a copy if the budget allows (an entry already held is only touched).
  virtual void store(const TierBlockMeta& m, BlockId device) = 0;
  // Is `m` held (hash, tokens, key and parent all equal)? No counting.
  virtual bool contains(const TierBlockMeta& m) const = 0;
  // Makes m the most recently used where it is held. Blocks about to be
  // loaded are touched last block first: the stores their fresh device blocks
  // cause then push out older entries first, and of this prefix's own the
  // last blocks (loaded last) before the first.
  virtual void touch(const TierBlockMeta& m) = 0;
  // Copies m's KV into device block `dst`. False when it is gone or fails its
  // checksum (then it is dropped and counted); dst is then unspecified.
  virtual bool load(const TierBlockMeta& m, BlockId dst) = 0;
  // A prefix lookup stopped at `m`: no tier holds it (counted as a miss).
  virtual void note_miss() = 0;
  // A request that will look m up has arrived: start reading it into memory
  // in the background (disk: a reader thread), so that load() later copies
  // from memory. No-op where m is in memory already.
  virtual void prefetch(const TierBlockMeta& m) = 0;
  // Would load(m) copy from memory (true), or wait on a read still running
  // (false)? A block neither in memory nor being read starts its read here.
  // The scheduler admits a request only when all its tier blocks are ready.
  virtual bool ready(const TierBlockMeta& m) = 0;
  // Saved prefixes: pins m on the persistent tier (copying it there from
  // device block `device`, or from RAM when device is -1), or drops one pin.
  // False when it cannot be pinned (no persistent tier, budget full of pins).
  virtual bool pin(const TierBlockMeta& m, BlockId device, bool pin) = 0;
};

}  // namespace serval
