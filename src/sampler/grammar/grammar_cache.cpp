#include "sampler/grammar/grammar_cache.h"

namespace serval {

Expected<GrammarPtr> GrammarCache::get(const std::string& key, const std::function<Expected<GrammarPtr>()>& compile) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->value;
    }
  }
  Expected<GrammarPtr> v = compile();
  if (key.size() > max_key_bytes_ / 4) return v;  // too big to keep
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    it->second->value = v;
    return v;
  }
  lru_.push_front(Entry{key, v});
  index_.emplace(key, lru_.begin());
  key_bytes_ += key.size();
  while (lru_.size() > max_entries_ || key_bytes_ > max_key_bytes_) {
    key_bytes_ -= lru_.back().key.size();
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return v;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lru_.size();
}

uint64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lk(mu_);
  return hits_;
}

}  // namespace serval
