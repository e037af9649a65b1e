// A bounded LRU cache of compiled grammars (and of compile errors, so a
// repeated bad request costs a lookup). Keys are the front end plus its
// source text. Thread-safe; compiles run outside the lock, so two threads
// may compile the same key once each (the second result wins, both valid).
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "sampler/grammar/grammar.h"

namespace serval {

class GrammarCache {
 public:
  explicit GrammarCache(size_t max_entries = 128, size_t max_key_bytes = 8u << 20)
      : max_entries_(max_entries), max_key_bytes_(max_key_bytes) {}

  // The cached result for `key`, or compile() (and cache it).
  Expected<GrammarPtr> get(const std::string& key, const std::function<Expected<GrammarPtr>()>& compile);

  size_t size() const;
  uint64_t hits() const;

 private:
  struct Entry {
    std::string key;
    Expected<GrammarPtr> value;
  };
  const size_t max_entries_, max_key_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recent
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t key_bytes_ = 0;
  uint64_t hits_ = 0;
};

}  // namespace serval
