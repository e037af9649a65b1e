// An approximate prefix tree of the prompts one replica was sent, for
// cache-aware routing (SGLang's cache_aware router, llm-d's prefix scorer).
//
// A prompt is cut into chunks of `chunk_chars` characters; chunk i is keyed by
// a hash chained over chunks 0..i, so a key stands for a whole prefix and the
// set of keys is a trie without pointers. match() counts the leading chunks
// already present; insert() adds them and marks them recently used; the least
// recently used keys beyond `max_chunks` are dropped (the replica's own KV
// cache forgets too). Approximate by design: characters, not tokens, and a
// replica may have evicted what the index still remembers.
//
// Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace serval::gateway {

// Chained hashes of the prompt's full chunks (a partial last chunk is left out).
std::vector<uint64_t> prefix_chunk_hashes(std::string_view text, int chunk_chars, size_t max_chunks = 4096);

class PrefixIndex {
 public:
  explicit PrefixIndex(size_t max_chunks) : max_(max_chunks) {}
  // Leading chunks of `hashes` present in the index.
  size_t match(const std::vector<uint64_t>& hashes) const;
  void insert(const std::vector<uint64_t>& hashes);
  void clear();
  size_t size() const;

 private:
  size_t max_;
  mutable std::mutex mu_;
  std::list<uint64_t> lru_;  // front: most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> map_;
};

}  // namespace serval::gateway
