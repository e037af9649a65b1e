// RamTier: the host-RAM tier of the prefix cache — a fixed number of slots,
// each holding one full block's KV bytes (every layer, K and V, of every KV
// pool the engine keeps) and its name (chain hash, parent hash, key, token
// ids), with an LRU over the slots. Bytes only: what goes in and out is
// decided by TieredKvStore (tiered_store.h). Allocated once; pages are
// committed as slots are first written. Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kv_cache/kv_tier.h"

namespace serval {

// A tier entry's name, owned (TierBlockMeta only views the tokens).
struct OwnedBlockMeta {
  Hash128 hash, parent;
  PrefixKey key;
  std::vector<TokenId> tokens;
  OwnedBlockMeta() = default;
  explicit OwnedBlockMeta(const TierBlockMeta& m)
      : hash(m.hash), parent(m.parent), key(m.key), tokens(m.tokens.begin(), m.tokens.end()) {}
  TierBlockMeta view() const { return {hash, parent, key, tokens}; }
  // Exactly the block m names (hash, parent, key and token ids).
  bool names(const TierBlockMeta& m) const;
};

class RamTier {
 public:
  RamTier(int32_t n_slots, size_t payload_bytes);

  int32_t capacity() const { return static_cast<int32_t>(meta_.size()); }
  int32_t size() const { return static_cast<int32_t>(index_.size()); }
  bool full() const { return size() == capacity(); }
  size_t payload_bytes() const { return payload_bytes_; }

  // The slot holding exactly m, or -1.
  int32_t find(const TierBlockMeta& m) const;
  // Makes slot s the most recently used.
  void touch(int32_t s);
  // The least recently used slot (requires size() > 0).
  int32_t lru() const { return lru_head_; }
  // A free slot now named m (most recently used); its bytes are to be
  // written by the caller. Requires !full() and find(m) < 0.
  int32_t insert(const TierBlockMeta& m);
  void erase(int32_t s);

  uint8_t* bytes(int32_t s) { return data_.get() + static_cast<size_t>(s) * payload_bytes_; }
  const OwnedBlockMeta& meta(int32_t s) const { return meta_[static_cast<size_t>(s)]; }
  // Occupied slots, least recently used first.
  std::vector<int32_t> slots_lru() const;

 private:
  void unlink(int32_t s);
  void push_back(int32_t s);

  size_t payload_bytes_;
  std::unique_ptr<uint8_t[]> data_;
  std::vector<OwnedBlockMeta> meta_;
  std::vector<int32_t> prev_, next_;
  std::vector<int32_t> free_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  std::unordered_map<Hash128, int32_t, Hash128Hasher> index_;
};

}  // namespace serval
