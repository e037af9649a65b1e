#include "kv_cache/tiered_store.h"

#include <cstring>

namespace serval {

namespace {

size_t payload_of(const KvStorage& s) {
  const KvGeometry& g = s.geometry();
  return (size_t)g.n_layers * 2 * (size_t)g.block_size * g.row_bytes();
}

}  // namespace

Hash128 tier_identity(const Hash128& model_identity, const std::vector<const KvStorage*>& storages) {
  std::vector<uint64_t> words = {model_identity.lo, model_identity.hi};
  for (const KvStorage* s : storages) {
    const KvGeometry& g = s->geometry();
    words.insert(words.end(), {(uint64_t)g.n_layers, (uint64_t)g.kv_dim, (uint64_t)g.block_size,
                               (uint64_t)g.type, (uint64_t)g.row_bytes()});
  }
  return siphash128(words.data(), words.size() * sizeof(uint64_t), 0x73657276616c6b76ull, 0x7469657273000001ull);
}

Expected<std::unique_ptr<TieredKvStore>> TieredKvStore::create(const KvTierConfig& cfg,
                                                               std::vector<KvStorage*> storages) {
  size_t payload = 0;
  int32_t block_size = 0;
  for (const KvStorage* s : storages) {
    if (s->has_swa_pool())
      return invalid_argument("KV cache tiers: not with a sliding-window KV pool (run with --swa-full)");
    payload += payload_of(*s);
    block_size = s->geometry().block_size;
  }
  if (storages.empty() || payload == 0) return invalid_argument("KV cache tiers: no KV storage");
  std::unique_ptr<TieredKvStore> t(new TieredKvStore(std::move(storages), payload));
  t->st_.block_bytes = payload;
  if (cfg.ram_bytes > 0) {
    const size_t n = cfg.ram_bytes / payload;
    if (n < 1)
      return invalid_argument("--kv-cache-ram " + std::to_string(cfg.ram_bytes) + " bytes holds no KV block (one takes " +
                              std::to_string(payload) + ")");
    if (n > (1u << 30)) return invalid_argument("--kv-cache-ram: too large");
    t->ram_ = std::make_unique<RamTier>((int32_t)n, payload);
    t->st_.ram_capacity_blocks = (int64_t)n;
  }
  if (!cfg.disk_dir.empty()) {
    DiskTierConfig dc;
    dc.dir = cfg.disk_dir;
    dc.budget_bytes = cfg.disk_bytes;
    dc.identity = cfg.identity;
    dc.block_size = block_size;
    dc.payload_bytes = payload;
    auto d = DiskTier::open(dc);
    if (!d.ok()) return d.status();
    t->disk_ = std::move(d.value());
    if (cfg.disk_bytes < t->disk_->file_bytes())
      return invalid_argument("--kv-cache-disk " + std::to_string(cfg.disk_bytes) +
                              " bytes holds no KV block (one file takes " + std::to_string(t->disk_->file_bytes()) +
                              ")");
    t->st_.disk_budget_bytes = (int64_t)cfg.disk_bytes;
    t->scratch_.resize(payload);
  }
  if (!t->ram_ && !t->disk_) return invalid_argument("KV cache tiers: neither a RAM nor a disk tier");
  return t;
}

void TieredKvStore::gather(BlockId b, uint8_t* out) const {
  for (const KvStorage* s : storages_) {
    const KvGeometry& g = s->geometry();
    const size_t n = (size_t)g.block_size * g.row_bytes();
    for (int32_t l = 0; l < g.n_layers; ++l) {
      std::memcpy(out, s->k(l, b), n);
      std::memcpy(out + n, s->v(l, b), n);
      out += 2 * n;
    }
  }
}

void TieredKvStore::scatter(const uint8_t* in, BlockId b) {
  for (KvStorage* s : storages_) {
    const KvGeometry& g = s->geometry();
    const size_t n = (size_t)g.block_size * g.row_bytes();
    for (int32_t l = 0; l < g.n_layers; ++l) {
      std::memcpy(s->k(l, b), in, n);
      std::memcpy(s->v(l, b), in + n, n);
      in += 2 * n;
    }
  }
}

void TieredKvStore::store(const TierBlockMeta& m, BlockId device) {
  if (ram_) {
    if (const int32_t s = ram_->find(m); s >= 0) {
      ram_->touch(s);
      return;
    }
    if (ram_->full()) {  // the least recently used RAM block moves down to disk
      const int32_t victim = ram_->lru();
      if (disk_) disk_->store(ram_->meta(victim).view(), ram_->bytes(victim), blocking_);
      ram_->erase(victim);
      ++st_.ram_evictions;
    }
    const int32_t s = ram_->insert(m);
    gather(device, ram_->bytes(s));
    ++st_.ram_stores;
    st_.bytes_stored += (int64_t)payload_bytes_;
    return;
  }
  if (disk_->contains(m)) {
    disk_->touch(m);
    return;
  }
  gather(device, scratch_.data());
  disk_->store(m, scratch_.data(), blocking_);
  st_.bytes_stored += (int64_t)payload_bytes_;
}

bool TieredKvStore::contains(const TierBlockMeta& m) const {
  return (ram_ && ram_->find(m) >= 0) || (disk_ && disk_->contains(m));
}

void TieredKvStore::touch(const TierBlockMeta& m) {
  if (ram_)
    if (const int32_t s = ram_->find(m); s >= 0) ram_->touch(s);
  if (disk_) disk_->touch(m);
}

bool TieredKvStore::load(const TierBlockMeta& m, BlockId dst) {
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = false;
  if (ram_) {
    if (const int32_t s = ram_->find(m); s >= 0) {
      scatter(ram_->bytes(s), dst);
      ram_->touch(s);
      ++st_.ram_hits;
      ok = true;
    } else {
      ++st_.ram_misses;
    }
  }
  if (!ok && disk_) {
    if (disk_->load(m, scratch_.data())) {
      scatter(scratch_.data(), dst);
      ++st_.disk_hits;
      ok = true;
    } else {
      ++st_.disk_misses;
    }
  }
  if (ok) {
    ++st_.loads;
    st_.bytes_loaded += (int64_t)payload_bytes_;
    st_.load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return ok;
}

void TieredKvStore::note_miss() {
  if (ram_) ++st_.ram_misses;
  if (disk_) ++st_.disk_misses;
}

bool TieredKvStore::pin(const TierBlockMeta& m, BlockId device, bool pin) {
  if (!disk_) return false;
  if (!pin) {
    disk_->unpin(m);
    return true;
  }
  if (disk_->pin(m)) return true;  // on disk (or being written) already
  const uint8_t* src = nullptr;
  if (device >= 0) {
    gather(device, scratch_.data());
    src = scratch_.data();
  } else if (const int32_t s = ram_ ? ram_->find(m) : -1; s >= 0) {
    src = ram_->bytes(s);
  } else {
    return false;
  }
  st_.bytes_stored += (int64_t)payload_bytes_;
  return disk_->store(m, src, /*blocking=*/true, /*pinned=*/true);
}

void TieredKvStore::prefetch(const TierBlockMeta& m) {
  if (!disk_ || (ram_ && ram_->find(m) >= 0)) return;
  disk_->prefetch(m);
}

bool TieredKvStore::ready(const TierBlockMeta& m) {
  if (!disk_ || (ram_ && ram_->find(m) >= 0)) return true;
  return disk_->ready(m);
}

void TieredKvStore::persist() {
  if (!disk_) return;
  if (ram_)
    for (int32_t s : ram_->slots_lru()) disk_->store(ram_->meta(s).view(), ram_->bytes(s), /*blocking=*/true);
  disk_->drain();
}

KvTierStats TieredKvStore::stats() const {
  KvTierStats s = st_;
  s.ram_blocks = ram_ ? ram_->size() : 0;
  if (disk_) {
    const DiskTier::Stats d = disk_->stats();
    s.disk_bytes = d.bytes;
    s.disk_files = d.files;
    s.disk_writes = d.writes;
    s.disk_write_drops = d.write_drops;
    s.disk_evictions = d.evictions;
    s.disk_corrupt = d.corrupt;
    s.disk_foreign = d.foreign;
    s.disk_recovered = d.recovered;
    s.disk_pinned = d.pinned;
    s.disk_prefetches = d.prefetches;
    s.disk_staged_reads = d.staged_reads;
    s.disk_staged_loads = d.staged_loads;
    s.disk_staged_drops = d.staged_drops;
    s.disk_staged_bytes = d.staged_bytes;
  }
  return s;
}

}  // namespace serval
