#include "kv_cache/ram_tier.h"

#include <algorithm>

#include "common/status.h"

namespace serval {

bool OwnedBlockMeta::names(const TierBlockMeta& m) const {
  return hash == m.hash && parent == m.parent && key == m.key && tokens.size() == m.tokens.size() &&
         std::equal(tokens.begin(), tokens.end(), m.tokens.begin());
}

RamTier::RamTier(int32_t n_slots, size_t payload_bytes) : payload_bytes_(payload_bytes) {
  SERVAL_ASSERT(n_slots >= 0 && payload_bytes > 0);
  data_.reset(new uint8_t[static_cast<size_t>(n_slots) * payload_bytes]);
  meta_.resize(static_cast<size_t>(n_slots));
  prev_.assign(static_cast<size_t>(n_slots), -1);
  next_.assign(static_cast<size_t>(n_slots), -1);
  for (int32_t s = n_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t RamTier::find(const TierBlockMeta& m) const {
  auto it = index_.find(m.hash);
  if (it == index_.end() || !meta_[static_cast<size_t>(it->second)].names(m)) return -1;
  return it->second;
}

void RamTier::unlink(int32_t s) {
  const size_t i = static_cast<size_t>(s);
  if (prev_[i] >= 0) next_[static_cast<size_t>(prev_[i])] = next_[i]; else lru_head_ = next_[i];
  if (next_[i] >= 0) prev_[static_cast<size_t>(next_[i])] = prev_[i]; else lru_tail_ = prev_[i];
  prev_[i] = next_[i] = -1;
}

void RamTier::push_back(int32_t s) {
  const size_t i = static_cast<size_t>(s);
  prev_[i] = lru_tail_;
  next_[i] = -1;
  if (lru_tail_ >= 0) next_[static_cast<size_t>(lru_tail_)] = s; else lru_head_ = s;
  lru_tail_ = s;
}

void RamTier::touch(int32_t s) {
  unlink(s);
  push_back(s);
}

int32_t RamTier::insert(const TierBlockMeta& m) {
  SERVAL_ASSERT(!free_.empty());
  const int32_t s = free_.back();
  free_.pop_back();
  meta_[static_cast<size_t>(s)] = OwnedBlockMeta(m);
  // A different block under the same hash (a collision: never seen in
  // practice) loses its slot; the index keeps one block per hash.
  if (auto it = index_.find(m.hash); it != index_.end()) erase(it->second);
  index_[m.hash] = s;
  push_back(s);
  return s;
}

void RamTier::erase(int32_t s) {
  auto it = index_.find(meta_[static_cast<size_t>(s)].hash);
  SERVAL_ASSERT(it != index_.end() && it->second == s);
  index_.erase(it);
  unlink(s);
  meta_[static_cast<size_t>(s)] = OwnedBlockMeta();
  free_.push_back(s);
}

std::vector<int32_t> RamTier::slots_lru() const {
  std::vector<int32_t> out;
  for (int32_t s = lru_head_; s >= 0; s = next_[static_cast<size_t>(s)]) out.push_back(s);
  return out;
}

}  // namespace serval
