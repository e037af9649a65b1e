#include "kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <climits>
#include <string>

namespace serval {

Status KvCacheManager::validate(const KvCacheConfig& cfg) {
  if (cfg.block_size < 1 || cfg.block_size > 4096)
    return invalid_argument("kv cache block_size: expected 1..4096, got " + std::to_string(cfg.block_size));
  if (cfg.n_blocks < 1)
    return invalid_argument("kv cache n_blocks: expected >= 1, got " + std::to_string(cfg.n_blocks));
  if (cfg.n_host_blocks < 0)
    return invalid_argument("kv cache n_host_blocks: expected >= 0, got " + std::to_string(cfg.n_host_blocks));
  if (cfg.n_swa_blocks < 0)
    return invalid_argument("kv cache n_swa_blocks: expected >= 0, got " + std::to_string(cfg.n_swa_blocks));
  if (cfg.n_swa_blocks > 0 && cfg.swa_window < 1)
    return invalid_argument("kv cache swa_window: expected >= 1 with a sliding-window pool, got " +
                            std::to_string(cfg.swa_window));
  if (cfg.n_swa_blocks > 0 && cfg.n_host_blocks > 0)
    return invalid_argument("kv cache: no swap space with a sliding-window pool");
  return {};
}

KvCacheManager::KvCacheManager(KvCacheConfig cfg)
    : cfg_(std::move(cfg)),
      pool_(cfg_.n_blocks, cfg_.block_size, cfg_.hash_fn, cfg_.hash_k0, cfg_.hash_k1),
      swa_pool_(std::max(1, cfg_.n_swa_blocks), cfg_.block_size, cfg_.hash_fn, cfg_.hash_k0, cfg_.hash_k1) {
  SERVAL_ASSERT(validate(cfg_).ok());
  for (int32_t h = 0; h < cfg_.n_host_blocks; ++h) host_free_.push_back(h);
}

const KvCacheManager::SeqBlocks* KvCacheManager::find_seq(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

void KvCacheManager::note_peak() {
  stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, pool_.n_used());
  if (has_swa()) stats_.swa_peak_used_blocks = std::max(stats_.swa_peak_used_blocks, swa_pool_.n_used());
}

size_t KvCacheManager::swa_first_block(int64_t first_write_pos) const {
  const int64_t lo = std::max<int64_t>(0, first_write_pos - cfg_.swa_window + 1);
  return static_cast<size_t>(lo / cfg_.block_size);
}

// ---------------------------------------------------------------------------
// prefix cache

KvCacheManager::Match KvCacheManager::match(std::span<const TokenId> tokens, const PrefixKey& key,
                                            bool whole) const {
  Match m;
  std::vector<ChainLink>& links = m.links;
  if (!cfg_.enable_prefix_caching || tokens.empty()) return m;
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  // Leave at least one token to compute, unless asked for every full block.
  const size_t max_blocks = whole ? tokens.size() / bs : (tokens.size() - 1) / bs;
  Hash128 parent_hash;
  uint64_t parent_entry = 0;
  size_t i = 0;
  for (; i < max_blocks; ++i) {
    const auto blk = tokens.subspan(i * bs, bs);
    const Hash128 h = pool_.hash(parent_hash, blk, key);
    const BlockId b = pool_.find(h, blk, key, parent_entry);
    if (b < 0) break;
    links.push_back({h, pool_.entry(b), b});
    parent_hash = h;
    parent_entry = pool_.entry(b);
  }
  // The lower tiers continue the chain where the device pool's stops.
  if (tier_) {
    for (; i < max_blocks; ++i) {
      const auto blk = tokens.subspan(i * bs, bs);
      const Hash128 h = pool_.hash(parent_hash, blk, key);
      if (!tier_->contains({h, parent_hash, key, blk})) break;
      m.tier.push_back(h);
      parent_hash = h;
    }
    m.tier_complete = i == max_blocks;
  }
  if (!has_swa() || links.empty()) return m;
  // The longest k <= links.size() whose sliding-window blocks [lo(k), k) are
  // cached too: run[i] counts the consecutive hits ending at block i.
  std::vector<BlockId> found(links.size(), -1);
  std::vector<size_t> run(links.size(), 0);
  for (size_t i = 0; i < links.size(); ++i) {
    found[i] = swa_pool_.find(links[i].hash, tokens.subspan(i * bs, bs), key, links[i].entry);
    run[i] = found[i] < 0 ? 0 : (i ? run[i - 1] : 0) + 1;
  }
  for (size_t k = links.size(); k > 0; --k) {
    const size_t lo = std::min(swa_first_block(static_cast<int64_t>(k * bs)), k);
    if (lo == k || run[k - 1] >= k - lo) {
      links.resize(k);
      m.swa_lo = lo;
      m.swa.assign(found.begin() + static_cast<long>(lo), found.begin() + static_cast<long>(k));
      return m;
    }
  }
  links.clear();
  return m;
}

int64_t KvCacheManager::acquire_cached_prefix(SeqId seq, std::span<const TokenId> tokens, const PrefixKey& key) {
  if (!cfg_.enable_prefix_caching) {
    seqs_[seq];
    return 0;
  }
  const int64_t hit = acquire(seq, tokens, key, false);
  ++stats_.prefix_queries;
  stats_.prefix_query_tokens += static_cast<int64_t>(tokens.size());
  stats_.prefix_hit_tokens += hit;
  return hit;
}

int64_t KvCacheManager::acquire(SeqId seq, std::span<const TokenId> tokens, const PrefixKey& key, bool whole) {
  SeqBlocks& s = seqs_[seq];
  SERVAL_ASSERT(s.table.empty() && !s.swapped);
  Match m = match(tokens, key, whole);
  const size_t n_found = m.links.size() + m.tier.size();
  s.chain = std::move(m.links);
  for (const ChainLink& l : s.chain) {
    pool_.ref(l.block);
    s.table.push_back(l.block);
  }
  // Tier hits: each becomes a fresh device block filled from its tier and
  // cached there, exactly as if this sequence had computed it.
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  for (size_t j = m.tier.size(); j-- > 0;) {
    const size_t i = s.chain.size() + j;
    const Hash128 parent_hash = j ? m.tier[j - 1] : i ? s.chain[i - 1].hash : Hash128{};
    tier_->touch({m.tier[j], parent_hash, key, tokens.subspan(i * bs, bs)});
  }
  for (size_t j = 0; j < m.tier.size(); ++j) {
    if (pool_.n_free() == 0) break;
    const size_t i = s.chain.size();
    const auto blk = tokens.subspan(i * bs, bs);
    const Hash128 parent_hash = i ? s.chain[i - 1].hash : Hash128{};
    const uint64_t parent_entry = i ? s.chain[i - 1].entry : 0;
    const BlockId b = pool_.take();
    if (!tier_->load({m.tier[j], parent_hash, key, blk}, b)) {
      pool_.unref(b);
      ++stats_.tier_load_failures;
      break;
    }
    const uint64_t e = pool_.cache(b, m.tier[j], blk, key, parent_entry, parent_hash);
    s.chain.push_back({m.tier[j], e, b});
    s.table.push_back(b);
    stats_.tier_hit_tokens += cfg_.block_size;
  }
  if (tier_ && !m.tier_complete && s.chain.size() == n_found) tier_->note_miss();
  if (has_swa()) {
    s.swa.assign(s.chain.size(), -1);
    for (size_t i = 0; i < m.swa.size(); ++i) {
      swa_pool_.ref(m.swa[i]);
      s.swa[m.swa_lo + i] = m.swa[i];
    }
    s.swa_lo = m.swa_lo;
    s.swa_cached = s.chain.size();
  }
  note_peak();
  return static_cast<int64_t>(s.chain.size()) * cfg_.block_size;
}

int64_t KvCacheManager::pin_prefix(std::span<const TokenId> tokens, const PrefixKey& key, bool pin) {
  if (!tier_) return 0;
  const Match m = match(tokens, key, /*whole=*/true);
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  size_t i = 0;
  for (const ChainLink& l : m.links) {
    if (!tier_->pin(pool_.meta(l.block), l.block, pin)) return -1;
    ++i;
  }
  for (size_t j = 0; j < m.tier.size(); ++j, ++i) {
    const Hash128 parent = j ? m.tier[j - 1] : i ? m.links[i - 1].hash : Hash128{};
    if (!tier_->pin({m.tier[j], parent, key, tokens.subspan(i * bs, bs)}, -1, pin)) return -1;
  }
  return static_cast<int64_t>(i) * cfg_.block_size;
}

template <typename F>
void KvCacheManager::for_each_tier_block(std::span<const TokenId> tokens, const PrefixKey& key, F&& f) const {
  const Match m = match(tokens, key);
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  for (size_t j = 0; j < m.tier.size(); ++j) {
    const size_t i = m.links.size() + j;
    const Hash128 parent = j ? m.tier[j - 1] : i ? m.links[i - 1].hash : Hash128{};
    f(TierBlockMeta{m.tier[j], parent, key, tokens.subspan(i * bs, bs)});
  }
}

void KvCacheManager::prefetch_prefix(std::span<const TokenId> tokens, const PrefixKey& key) const {
  if (tier_) for_each_tier_block(tokens, key, [&](const TierBlockMeta& b) { tier_->prefetch(b); });
}

bool KvCacheManager::prefix_ready(std::span<const TokenId> tokens, const PrefixKey& key) const {
  bool all = true;
  if (tier_) for_each_tier_block(tokens, key, [&](const TierBlockMeta& b) { all = tier_->ready(b) && all; });
  return all;
}

int64_t KvCacheManager::restore_prefix(std::span<const TokenId> tokens, const PrefixKey& key) {
  if (!cfg_.enable_prefix_caching) return 0;
  constexpr SeqId kRestoreSeq = INT64_MIN;  // never an engine seq id
  const int64_t hit = acquire(kRestoreSeq, tokens, key, /*whole=*/true);
  free(kRestoreSeq);
  return hit;
}

int64_t KvCacheManager::find_cached_prefix(std::span<const TokenId> tokens, const PrefixKey& key) const {
  const Match m = match(tokens, key);
  return static_cast<int64_t>(m.links.size() + m.tier.size()) * cfg_.block_size;
}

void KvCacheManager::set_tier(KvTier* tier) {
  SERVAL_ASSERT(!has_swa());
  tier_ = tier;
  pool_.set_tier(tier);
}

void KvCacheManager::flush_to_tier() {
  if (!tier_) return;
  for (BlockId b : pool_.cached_blocks()) tier_->store(pool_.meta(b), b);
}

bool KvCacheManager::can_admit(std::span<const TokenId> tokens, const PrefixKey& key, int64_t n_tokens) const {
  const Match m = match(tokens, key);
  const auto& links = m.links;
  int64_t need = std::max<int64_t>(0, blocks_for(n_tokens) - static_cast<int64_t>(links.size()));
  for (const ChainLink& l : links) need += pool_.ref_count(l.block) == 0 ? 1 : 0;
  if (need > pool_.n_free()) return false;
  if (!has_swa()) return true;
  // The new sequence then writes from the hit on: blocks [max(k, lo), want) are new.
  const int64_t k = static_cast<int64_t>(links.size());
  const int64_t lo = static_cast<int64_t>(swa_first_block(k * cfg_.block_size));
  int64_t need_swa = std::max<int64_t>(0, blocks_for(n_tokens) - std::max(k, lo));
  for (BlockId b : m.swa) need_swa += swa_pool_.ref_count(b) == 0 ? 1 : 0;
  return need_swa <= swa_pool_.n_free();
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
  if (n_full <= s.chain.size() && (!has_swa() || s.swa_cached >= n_full)) return;  // no newly full block

  // The chain may point at entries living in other sequences' (or evictable)
  // blocks; if one of them was evicted since, re-link from there on: this
  // seq's own blocks hold the same KV and take over.
  for (size_t i = 0; i < s.chain.size(); ++i) {
    if (pool_.entry(s.chain[i].block) != s.chain[i].entry) {
      s.chain.resize(i);
      s.swa_cached = std::min(s.swa_cached, i);  // their sliding-window blocks are re-keyed below
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
    const uint64_t e = pool_.cache(own, h, blk, key, parent_entry, parent_hash);
    s.chain.push_back({h, e, own});
  }
  if (!has_swa()) return;
  // Sliding-window blocks, keyed by the main pool's entry of the same block
  // (released ones cannot be cached: a prefix hit then stops short of them).
  for (size_t i = s.swa_cached; i < n_full && i < s.swa.size(); ++i) {
    const BlockId own = s.swa[i];
    if (own < 0) continue;
    const ChainLink& l = s.chain[i];
    const auto blk = tokens.subspan(i * bs, bs);
    if (swa_pool_.find(l.hash, blk, key, l.entry) >= 0) continue;  // an equal block is cached (maybe this one)
    if (swa_pool_.is_cached(own)) swa_pool_.uncache(own);
    swa_pool_.cache(own, l.hash, blk, key, l.entry);
  }
  s.swa_cached = std::max(s.swa_cached, n_full);
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

int64_t KvCacheManager::swa_blocks_needed(const SeqBlocks* s, int64_t n_tokens, int64_t first_write_pos) const {
  if (!has_swa()) return 0;
  if (first_write_pos < 0) first_write_pos = n_tokens - 1;
  const size_t want = static_cast<size_t>(blocks_for(n_tokens));
  const size_t first = swa_first_block(first_write_pos);
  const size_t held = s ? s->swa.size() : 0;
  int64_t need = static_cast<int64_t>(want - std::min(want, std::max(held, first)));  // new entries
  if (s && first_write_pos < n_tokens) {
    const size_t w0 = std::max(first, static_cast<size_t>(first_write_pos / cfg_.block_size));
    for (size_t j = w0; j < std::min(held, want); ++j)
      need += s->swa[j] >= 0 && swa_pool_.ref_count(s->swa[j]) > 1 ? 1 : 0;  // copy-on-write
  }
  if (s)
    for (size_t j = s->swa_lo; j < std::min(first, held); ++j)
      need -= s->swa[j] >= 0 && swa_pool_.ref_count(s->swa[j]) == 1 ? 1 : 0;  // released first
  return need;
}

bool KvCacheManager::can_allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos) const {
  const SeqBlocks* s = find_seq(seq);
  if (s && s->swapped) return false;
  return blocks_needed(s, n_tokens, first_write_pos) <= pool_.n_free() &&
         swa_blocks_needed(s, n_tokens, first_write_pos) <= swa_pool_.n_free();
}

bool KvCacheManager::allocate(SeqId seq, int64_t n_tokens, int64_t first_write_pos,
                              std::vector<BlockCopy>* copies) {
  SERVAL_ASSERT(n_tokens >= 0);
  SeqBlocks& s = seqs_[seq];
  SERVAL_ASSERT(!s.swapped);
  if (first_write_pos < 0) first_write_pos = n_tokens - 1;
  if (blocks_needed(&s, n_tokens, first_write_pos) > pool_.n_free()) return false;
  if (swa_blocks_needed(&s, n_tokens, first_write_pos) > swa_pool_.n_free()) return false;
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
  if (has_swa()) {
    const size_t first = swa_first_block(first_write_pos);
    // Release what no position from first_write_pos on reads.
    for (size_t j = s.swa_lo; j < std::min(first, s.swa.size()); ++j) {
      if (s.swa[j] < 0) continue;
      swa_pool_.unref(s.swa[j]);
      s.swa[j] = -1;
      ++stats_.swa_released;
    }
    s.swa_lo = std::max(s.swa_lo, std::min(first, s.swa.size()));
    if (first_write_pos < n_tokens) {
      const size_t w0 = std::max(first, static_cast<size_t>(first_write_pos / bs));
      s.swa_cached = std::min(s.swa_cached, w0);
      for (size_t j = w0; j < std::min(s.swa.size(), static_cast<size_t>(want)); ++j) {
        BlockId& b = s.swa[j];
        SERVAL_ASSERT(b >= 0);  // the window only moves forward
        if (swa_pool_.ref_count(b) > 1) {
          const BlockId dst = swa_pool_.take();
          SERVAL_ASSERT(copies != nullptr);
          copies->push_back({b, dst, true});
          swa_pool_.unref(b);
          b = dst;
        } else if (swa_pool_.is_cached(b)) {
          swa_pool_.uncache(b);
        }
      }
    }
    while (s.swa.size() < static_cast<size_t>(want)) s.swa.push_back(s.swa.size() < first ? -1 : swa_pool_.take());
    s.swa_lo = std::max(s.swa_lo, std::min(first, s.swa.size()));
  }
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
  c.swa = p->swa;
  c.swa_lo = p->swa_lo;
  c.swa_cached = p->swa_cached;
  for (BlockId b : c.table) pool_.ref(b);
  for (BlockId b : c.swa)
    if (b >= 0) swa_pool_.ref(b);
}

void KvCacheManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqBlocks& s = it->second;
  for (int32_t h : s.host) host_free_.push_back(h);
  for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) pool_.unref(*b);
  for (auto b = s.swa.rbegin(); b != s.swa.rend(); ++b)
    if (*b >= 0) swa_pool_.unref(*b);
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
  while (s.swa.size() > keep) {
    if (s.swa.back() >= 0) swa_pool_.unref(s.swa.back());
    s.swa.pop_back();
  }
  s.swa_lo = std::min(s.swa_lo, s.swa.size());
  s.swa_cached = std::min(s.swa_cached, full);
}

// ---------------------------------------------------------------------------
// swap tier

bool KvCacheManager::can_swap_out(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  return !has_swa() && s && !s->swapped && !s->table.empty() && s->table.size() <= host_free_.size();
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

std::span<const BlockId> KvCacheManager::swa_block_table(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  if (!s) return {};
  return s->swa;
}

int32_t KvCacheManager::swa_blocks_held(SeqId seq) const {
  const SeqBlocks* s = find_seq(seq);
  if (!s) return 0;
  int32_t n = 0;
  for (BlockId b : s->swa) n += b >= 0;
  return n;
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
  st.swa_used_blocks = has_swa() ? swa_pool_.n_used() : 0;
  return st;
}

}  // namespace serval
