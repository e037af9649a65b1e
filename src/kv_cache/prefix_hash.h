// Prefix hashing for the prefix cache: a 128-bit hash chain over full KV blocks.
//
// A full block of `block_size` tokens is keyed by
//   hash(parent block's hash, the block's token ids, PrefixKey{salt, adapter_id})
// with the all-zero hash as the parent of a sequence's first block, so a block's
// hash names its whole prefix. The default function is SipHash-2-4 with a
// 128-bit tag (keyed: the engine can pick a random key at startup so that users
// cannot aim for collisions). The hash only finds candidates: BlockPool verifies
// every hit exactly (token ids, PrefixKey, parent entry), so correctness never
// rests on the hash. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kv_cache/kv_types.h"
#include "serval/types.h"

namespace serval {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Hash128&) const = default;
};

struct Hash128Hasher {  // for unordered containers: the bits are already mixed
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull)); }
};

// SipHash-2-4, 128-bit tag, of `data` under the 128-bit key (k0, k1). The tag's
// 16 bytes of the reference implementation are lo (little-endian) then hi.
Hash128 siphash128(const void* data, size_t n_bytes, uint64_t k0, uint64_t k1);

// The hash of one full block given its parent's hash (Hash128{} for the first
// block of a sequence). Injectable into KvCacheConfig (tests force collisions).
using PrefixHashFn =
    std::function<Hash128(const Hash128& parent, std::span<const TokenId> tokens, const PrefixKey& key)>;

// The default: SipHash-2-4-128 under (k0, k1) of the little-endian bytes
// parent.lo, parent.hi, key.salt, key.adapter_id, tokens[0..n).
Hash128 prefix_block_hash(const Hash128& parent, std::span<const TokenId> tokens, const PrefixKey& key,
                          uint64_t k0 = 0, uint64_t k1 = 0);

}  // namespace serval
