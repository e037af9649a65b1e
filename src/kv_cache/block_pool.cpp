#include "kv_cache/block_pool.h"

#include <algorithm>

#include "common/status.h"

namespace serval {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, PrefixHashFn hash_fn, uint64_t hash_k0,
                     uint64_t hash_k1)
    : block_size_(block_size), hash_fn_(std::move(hash_fn)), hash_k0_(hash_k0), hash_k1_(hash_k1) {
  SERVAL_ASSERT(n_blocks >= 0 && block_size > 0);
  blocks_.resize(static_cast<size_t>(n_blocks));
  block_tokens_.resize(static_cast<size_t>(n_blocks) * static_cast<size_t>(block_size));
  for (BlockId b = 0; b < n_blocks; ++b) free_.push_back(b);
}

BlockId BlockPool::check(BlockId b) const {
  SERVAL_ASSERT(b >= 0 && b < n_blocks());
  return b;
}

BlockId BlockPool::take() {
  BlockId b;
  if (!free_.empty()) {
    b = free_.front();
    free_.pop_front();
  } else {
    SERVAL_ASSERT(lru_head_ >= 0);  // caller checked n_free() > 0
    b = lru_head_;
    lru_remove(b);
    if (tier_) tier_->store(meta(b), b);
    drop_entry(b);
    ++n_evictions_;
  }
  Block& blk = blocks_[b];
  SERVAL_ASSERT(blk.ref == 0 && blk.entry == 0);
  blk.ref = 1;
  return b;
}

void BlockPool::ref(BlockId b) {
  Block& blk = blocks_[check(b)];
  if (blk.ref == 0) {
    SERVAL_ASSERT(blk.entry != 0);  // only evictable (cached) blocks are revived; free ones are taken
    lru_remove(b);
  }
  ++blk.ref;
}

void BlockPool::unref(BlockId b) {
  Block& blk = blocks_[check(b)];
  SERVAL_ASSERT(blk.ref > 0);
  if (--blk.ref > 0) return;
  if (blk.entry != 0) {
    lru_push_back(b);
  } else {
    free_.push_back(b);
  }
}

Hash128 BlockPool::hash(const Hash128& parent, std::span<const TokenId> tokens, const PrefixKey& key) const {
  if (hash_fn_) return hash_fn_(parent, tokens, key);
  return prefix_block_hash(parent, tokens, key, hash_k0_, hash_k1_);
}

BlockId BlockPool::find(const Hash128& h, std::span<const TokenId> tokens, const PrefixKey& key,
                        uint64_t parent_entry) const {
  if (tokens.size() != static_cast<size_t>(block_size_)) return -1;
  auto it = by_hash_.find(h);
  if (it == by_hash_.end()) return -1;
  for (BlockId b : it->second) {
    const Block& blk = blocks_[b];
    if (blk.parent_entry != parent_entry || !(blk.key == key)) continue;
    const auto cached = tokens_of(b);
    if (std::equal(cached.begin(), cached.end(), tokens.begin())) return b;
  }
  return -1;
}

uint64_t BlockPool::cache(BlockId b, const Hash128& h, std::span<const TokenId> tokens, const PrefixKey& key,
                          uint64_t parent_entry, const Hash128& parent_hash) {
  Block& blk = blocks_[check(b)];
  SERVAL_ASSERT(blk.ref > 0 && blk.entry == 0);
  SERVAL_ASSERT(tokens.size() == static_cast<size_t>(block_size_));
  blk.entry = next_entry_++;
  blk.parent_entry = parent_entry;
  blk.hash = h;
  blk.parent_hash = parent_hash;
  blk.key = key;
  std::copy(tokens.begin(), tokens.end(), block_tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_);
  by_hash_[h].push_back(b);
  ++n_cached_;
  return blk.entry;
}

void BlockPool::uncache(BlockId b) {
  SERVAL_ASSERT(blocks_[check(b)].ref > 0);
  drop_entry(b);
}

void BlockPool::drop_entry(BlockId b) {
  Block& blk = blocks_[b];
  if (blk.entry == 0) return;
  auto it = by_hash_.find(blk.hash);
  SERVAL_ASSERT(it != by_hash_.end());
  auto& v = it->second;
  v.erase(std::find(v.begin(), v.end(), b));
  if (v.empty()) by_hash_.erase(it);
  blk.entry = 0;
  blk.parent_entry = 0;
  --n_cached_;
}

void BlockPool::lru_push_back(BlockId b) {
  Block& blk = blocks_[b];
  blk.lru_prev = lru_tail_;
  blk.lru_next = -1;
  if (lru_tail_ >= 0) {
    blocks_[lru_tail_].lru_next = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
  ++n_evictable_;
}

void BlockPool::lru_remove(BlockId b) {
  Block& blk = blocks_[b];
  if (blk.lru_prev >= 0) {
    blocks_[blk.lru_prev].lru_next = blk.lru_next;
  } else {
    lru_head_ = blk.lru_next;
  }
  if (blk.lru_next >= 0) {
    blocks_[blk.lru_next].lru_prev = blk.lru_prev;
  } else {
    lru_tail_ = blk.lru_prev;
  }
  blk.lru_prev = blk.lru_next = -1;
  --n_evictable_;
}

TierBlockMeta BlockPool::meta(BlockId b) const {
  const Block& blk = blocks_[check(b)];
  SERVAL_ASSERT(blk.entry != 0);
  return {blk.hash, blk.parent_hash, blk.key, tokens_of(b)};
}

std::vector<BlockId> BlockPool::cached_blocks() const {
  std::vector<BlockId> out;
  for (BlockId b = 0; b < n_blocks(); ++b)
    if (blocks_[b].entry != 0) out.push_back(b);
  return out;
}

std::vector<BlockId> BlockPool::evictable_lru() const {
  std::vector<BlockId> out;
  for (BlockId b = lru_head_; b >= 0; b = blocks_[b].lru_next) out.push_back(b);
  return out;
}

}  // namespace serval
