#include "kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <string>

namespace serval {

Status KvCacheManager::validate(const KvCacheConfig& cfg) {
  if (cfg.block_size < 1 || cfg.block_size > 4096)
    return invalid_argument("kv cache block_size: expected 1..4096, got " + std::to_string(cfg.block_size));
  if (cfg.n_blocks < 1)
    return invalid_argument("kv cache n_blocks: expected >= 1, got " + std::to_string(cfg.n_blocks));
  if (cfg.n_host_blocks < 0)
    return invalid_argument("kv cache n_host_blocks: expected >= 0, got " + std::to_string(cfg.n_host_blocks));
  return {};
}

KvCacheManager::KvCacheManager(KvCacheConfig cfg)
    : cfg_(std::move(cfg)), pool_(cfg_.n_blocks, cfg_.block_size, cfg_.hash_fn, cfg_.hash_k0, cfg_.hash_k1) {
  SERVAL_ASSERT(validate(cfg_).ok());
  for (int32_t h = 0; h < cfg_.n_host_blocks; ++h) host_free_.push_back(h);
}

const KvCacheManager::SeqBlocks* KvCacheManager::find_seq(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

void KvCacheManager::note_peak() {
  stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, pool_.n_used());
}

// ---------------------------------------------------------------------------
// prefix cache

std::vector<KvCacheManager::ChainLink> KvCacheManager::match(std::span<const TokenId> tokens,
                                                             const PrefixKey& key) const {
  std::vector<ChainLink> links;
  if (!cfg_.enable_prefix_caching || tokens.empty()) return links;
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // leave at least one token to compute
  Hash128 parent_hash;
  uint64_t parent_entry = 0;
  for (size_t i = 0; i < max_blocks; ++i) {
    const auto blk = tokens.subspan(i * bs, bs);
    const Hash128 h = pool_.hash(parent_hash, blk, key);
    const BlockId b = pool_.find(h, blk, key, parent_entry);
    if (b < 0) break;
    links.push_back({h, pool_.entry(b), b});
    parent_hash = h;
    parent_entry = pool_.entry(b);
  }
  return links;
}

int64_t KvCacheManager::acquire_cached_prefix(SeqId seq, std::span<const TokenId> tokens, const PrefixKey& key) {
  SeqBlocks& s = seqs_[seq];
  SERVAL_ASSERT(s.table.empty() && !s.swapped);
  if (!cfg_.enable_prefix_caching) return 0;
  s.chain = match(tokens, key);
  for (const ChainLink& l : s.chain) {
    pool_.ref(l.block);
    s.table.push_back(l.block);
  }
  const int64_t hit = static_cast<int64_t>(s.chain.size()) * cfg_.block_size;
  ++stats_.prefix_queries;
  stats_.prefix_query_tokens += static_cast<int64_t>(tokens.size());
  stats_.prefix_hit_tokens += hit;
  note_peak();
  return hit;
}

int64_t KvCacheManager::find_cached_prefix(std::span<const TokenId> tokens, const PrefixKey& key) const {
  return static_cast<int64_t>(match(tokens, key).size()) * cfg_.block_size;
}

bool KvCacheManager::can_admit(std::span<const TokenId> tokens, const PrefixKey& key, int64_t n_tokens) const {
  const auto links = match(tokens, key);
  int64_t need = std::max<int64_t>(0, blocks_for(n_tokens) - static_cast<int64_t>(links.size()));
  for (const ChainLink& l : links) need += pool_.ref_count(l.block) == 0 ? 1 : 0;
  return need <= pool_.n_free();
}

void KvCacheManager::cache_full_blocks(SeqId seq, std::span<const TokenId> tokens, int64_t n_computed,
                                       const PrefixKey& key) {
  if (!cfg_.enable_prefix_caching) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.swapped) return;
  SeqBlocks& s = it->second;
  SERVAL_ASSERT(n_computed >= 0 && n_computed <= static_cast<int64_t>(tokens.size()));
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  const size_t n_full = std::min(static_cast<size_t>(n_computed) / bs, s.table.size());
  if (n_full <= s.chain.size()) return;  // no newly full block

  // The chain may point at entries living in other sequences' (or evictable)
  // blocks; if one of them was evicted since, re-link from there on: this
  // seq's own blocks hold the same KV and take over.
  for (size_t i = 0; i < s.chain.size(); ++i) {
    if (pool_.entry(s.chain[i].block) != s.chain[i].entry) {
      s.chain.resize(i);
      break;
    }
  }
  for (size_t i = s.chain.size(); i < n_full; ++i) {
    const Hash128 parent_hash = i ? s.chain[i - 1].hash : Hash128{};
    const uint64_t parent_entry = i ? s.chain[i - 1].entry : 0;
    const auto blk = tokens.subspan(i * bs, bs);
    const Hash128 h = pool_.hash(parent_hash, blk, key);
    const BlockId found = pool_.find(h, blk, key, parent_entry);
    if (found >= 0) {  // an equal block is cached already (maybe this one): link to it
      s.chain.push_back({h, pool_.entry(found), found});
      continue;
    }
    const BlockId own = s.table[i];
    // Cached under another identity (a chain that was re-linked): re-register.
    if (pool_.is_cached(own)) pool_.uncache(own);
    const uint64_t e = pool_.cache(own, h, blk, key, parent_entry);
    s.chain.push_back({h, e, own});
  }
}

// ---------------------------------------------------------------------------
// allocation

int64_t KvCacheManager::blocks_needed(const SeqBlocks* s, int64_t n_tokens, int64_t first_write_pos) const {
  const int64_t held = s ? static_cast<int64_t>(s->table.size()) : 0;
  const int64_t want = blocks_for(n_tokens);
  int64_t need = std::max<int64_t>(0, want - held);
  if (first_write_pos < 0) first_write_pos = n_tokens - 1;
  if (s && first_write_pos < n_tokens) {
    const int64_t end = std::min(held, want);
    for (int64_t j = std::max<int64_t>(0, first_write_pos / cfg_.block_size); j < end; ++j)
      need += pool_.ref_count(s->table[static_cast<size_t>(j)]) > 1 ? 1 : 0;
  }
  return need;
}

bool KvCacheManager::can_allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos) const {
  const SeqBlocks* s = find_seq(seq);
  if (s && s->swapped) return false;
  return blocks_needed(s, n_tokens, first_write_pos) <= pool_.n_free();
}

bool KvCacheManager::allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos,
                              std::vector<BlockCopy>* copies) {
  SERVAL_ASSERT(n_tokens >= 0);
  SeqBlocks& s = seqs_[seq];
  SERVAL_ASSERT(!s.swapped);
  if (first_write_pos < 0) first_write_pos = n_tokens - 1;
  if (blocks_needed(&s, n_tokens, first_write_pos) > pool_.n_free()) return false;
  const int64_t bs = cfg_.block_size;
  const int64_t want = blocks_for(n_tokens);
  if (first_write_pos < n_tokens) {
    const int64_t first_blk = std::max<int64_t>(0, first_write_pos / bs);
    const int64_t end = std::min(static_cast<int64_t>(s.table.size()), want);
    // Written blocks are no longer part of this seq's cached prefix.
    if (static_cast<int64_t>(s.chain.size()) > first_blk) s.chain.resize(static_cast<size_t>(first_blk));
    for (int64_t j = first_blk; j < end; ++j) {
      BlockId& b = s.table[static_cast<size_t>(j)];
      if (pool_.ref_count(b) > 1) {
        const BlockId dst = pool_.take();
        SERVAL_ASSERT(copies != nullptr);
        copies->push_back({b, dst});
        pool_.unref(b);
        b = dst;
      } else if (pool_.is_cached(b)) {
        pool_.uncache(b);
      }
    }
  }
  while (static_cast<int64_t>(s.table.size()) < want) s.table.push_back(pool_.take());
  note_peak();
  return true;
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  SERVAL_ASSERT(parent != child);
  const SeqBlocks* p = find_seq(parent);
  SERVAL_ASSERT(p != nullptr && !p->swapped);
  SeqBlocks& c = seqs_[child];
  SERVAL_ASSERT(c.table.empty() && !c.swapped);
  p = find_seq(parent);  // seqs_[child] may have rehashed
  c.table = p->table;
  c.chain = p->chain;
  for (BlockId b : c.table) pool_.ref(b);
}

void KvCacheManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqBlocks& s = it->second;
  for (int32_t h : s.host) host_free_.push_back(h);
  for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) pool_.unref(*b);
  seqs_.erase(it);
}

void KvCacheManager::truncate(SeqId seq, int64_t n_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqBlocks& s = it->second;
  SERVAL_ASSERT(!s.swapped && n_tokens >= 0);
  const size_t keep = static_cast<size_t>(blocks_for(n_tokens));
  while (s.table.size() > keep) {
    pool_.unref(s.table.back());
    s.table.pop_back();
  }
  const size_t full = static_cast<size_t>(n_tokens / cfg_.block_size);
  if (s.chain.size() > full) s.chain.resize(full);
}

// ---------------------------------------------------------------------------
// swap tier

bool KvCacheManager::can_swap_out(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  return s && !s->swapped && !s->table.empty() && s->table.size() <= host_free_.size();
}

void KvCacheManager::swap_out(SeqId seq, std::vector<BlockSwap>* out) {
  SERVAL_ASSERT(can_swap_out(seq) && out != nullptr);
  SeqBlocks& s = seqs_[seq];
  for (BlockId b : s.table) {
    const int32_t h = host_free_.front();
    host_free_.pop_front();
    out->push_back({b, h});
    s.host.push_back(h);
  }
  for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) pool_.unref(*b);
  s.table.clear();
  s.swapped = true;
}

bool KvCacheManager::can_swap_in(SeqId seq, int64_t n_tokens) const {
  const SeqBlocks* s = find_seq(seq);
  if (!s || !s->swapped) return false;
  const int64_t need = std::max<int64_t>(static_cast<int64_t>(s->host.size()), blocks_for(n_tokens));
  return need <= pool_.n_free();
}

void KvCacheManager::swap_in(SeqId seq, std::vector<BlockSwap>* in) {
  SERVAL_ASSERT(can_swap_in(seq) && in != nullptr);
  SeqBlocks& s = seqs_[seq];
  for (int32_t h : s.host) {
    const BlockId b = pool_.take();
    in->push_back({b, h});
    s.table.push_back(b);
    host_free_.push_back(h);
  }
  s.host.clear();
  s.swapped = false;
  note_peak();
}

bool KvCacheManager::is_swapped(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  return s && s->swapped;
}

// ---------------------------------------------------------------------------
// queries

std::span<const BlockId> KvCacheManager::block_table(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  if (!s) return {};
  return s->table;
}

std::span<const int32_t> KvCacheManager::host_table(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  if (!s) return {};
  return s->host;
}

KvCacheManager::Stats KvCacheManager::stats() const {
  Stats st = stats_;
  st.evictions = pool_.n_evictions();
  st.used_blocks = pool_.n_used();
  st.cached_blocks = pool_.n_cached();
  return st;
}

}  // namespace serval
