// TieredKvStore: the prefix cache's lower tiers (kv_tier.h) over the engine's
// KV storages — a host-RAM tier (ram_tier.h) and a disk tier (disk_tier.h),
// either or both. A block the device pool evicts goes to RAM; the RAM tier's
// least recently used block goes to disk (or, without a RAM tier, the evicted
// block goes straight to disk). Both tiers keep their copy when a block is
// loaded back (inclusive), so a block that bounces between the pool and a
// tier is copied once.
//
// Payload of one block: for each storage in order (the target's, then the
// draft model's, which mirrors its block ids), for each layer, the block's K
// bytes then its V bytes. Only storages without a sliding-window pool.
//
// Identity: disk files carry an identity (the model file, KV type and
// layout: tier_identity()), so a restarted server with another model, KV type
// or block size never reads them.
//
// Engine loop thread only (the disk tier has its own writer thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kv_cache/disk_tier.h"
#include "kv_cache/kv_storage.h"
#include "kv_cache/kv_tier.h"
#include "kv_cache/ram_tier.h"

namespace serval {

struct KvTierConfig {
  size_t ram_bytes = 0;   // host-RAM tier budget; 0: no RAM tier
  std::string disk_dir;   // disk tier directory; empty: no disk tier
  size_t disk_bytes = 0;  // disk tier budget (required with disk_dir)
  Hash128 identity;       // of the model and KV layout (tier_identity())
};


// The identity disk files are checked against: the model's identity (e.g.
// from its file: model_identity_of_file in engine/) mixed with the KV layout.
Hash128 tier_identity(const Hash128& model_identity, const std::vector<const KvStorage*>& storages);

class TieredKvStore final : public KvTier {
 public:
  // Errors: invalid_argument (budget holds no block, a storage with a
  // sliding-window pool, a disk directory that cannot be used).
  static Expected<std::unique_ptr<TieredKvStore>> create(const KvTierConfig& cfg, std::vector<KvStorage*> storages);

  bool has_disk() const { return disk_ != nullptr; }
  DiskTier* disk() { return disk_.get(); }
  size_t payload_bytes() const { return payload_bytes_; }

  void store(const TierBlockMeta& m, BlockId device) override;
  bool contains(const TierBlockMeta& m) const override;
  void touch(const TierBlockMeta& m) override;
  bool load(const TierBlockMeta& m, BlockId dst) override;
  void note_miss() override;
  bool pin(const TierBlockMeta& m, BlockId device, bool pin) override;
  void prefetch(const TierBlockMeta& m) override;
  bool ready(const TierBlockMeta& m) override;

  // At shutdown: from now on stores to disk wait for room in the write queue
  // instead of dropping; then the pool's cached blocks are store()d
  // (KvCacheManager::flush_to_tier), then persist() copies every RAM block
  // the disk tier lacks to disk and waits for the writes.
  void begin_persist() { blocking_ = true; }
  void persist();
  KvTierStats stats() const;

 private:
  TieredKvStore(std::vector<KvStorage*> storages, size_t payload_bytes)
      : storages_(std::move(storages)), payload_bytes_(payload_bytes) {}
  void gather(BlockId b, uint8_t* out) const;
  void scatter(const uint8_t* in, BlockId b);

  std::vector<KvStorage*> storages_;
  size_t payload_bytes_;
  std::unique_ptr<RamTier> ram_;
  std::unique_ptr<DiskTier> disk_;
  bool blocking_ = false;
  std::vector<uint8_t> scratch_;  // one payload (disk-only stores and loads)
  KvTierStats st_;  // the RAM tier's and the store's counters
};

}  // namespace serval
