#include "gateway/prefix_index.h"

#include <algorithm>

namespace serval::gateway {

std::vector<uint64_t> prefix_chunk_hashes(std::string_view text, int chunk_chars, size_t max_chunks) {
  std::vector<uint64_t> out;
  if (chunk_chars <= 0) return out;
  const size_t n = std::min(text.size() / (size_t)chunk_chars, max_chunks);
  out.reserve(n);
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis, chained across chunks
  for (size_t i = 0; i < n; ++i) {
    for (char c : text.substr(i * chunk_chars, chunk_chars)) {
      h ^= (unsigned char)c;
      h *= 1099511628211ull;
    }
    // A chunk boundary marker, so "ab|c" and "a|bc" never share a key.
    h ^= 0xff;
    h *= 1099511628211ull;
    out.push_back(h);
  }
  return out;
}

size_t PrefixIndex::match(const std::vector<uint64_t>& hashes) const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  while (n < hashes.size() && map_.count(hashes[n])) ++n;
  return n;
}

void PrefixIndex::insert(const std::vector<uint64_t>& hashes) {
  std::lock_guard<std::mutex> lk(mu_);
  // Deepest first, so a prefix is always more recent than its extensions and
  // eviction trims branches from their ends.
  for (auto hi = hashes.rbegin(); hi != hashes.rend(); ++hi) {
    const uint64_t h = *hi;
    auto it = map_.find(h);
    if (it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      lru_.push_front(h);
      map_.emplace(h, lru_.begin());
    }
  }
  while (map_.size() > max_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

void PrefixIndex::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  lru_.clear();
  map_.clear();
}

size_t PrefixIndex::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

}  // namespace serval::gateway
