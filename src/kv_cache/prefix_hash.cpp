#include "kv_cache/prefix_hash.h"

#include <cstring>
#include <vector>

namespace serval {
namespace {

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void store_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
    v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
  }
  void compress(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

}  // namespace

Hash128 siphash128(const void* data, size_t n_bytes, uint64_t k0, uint64_t k1) {
  const auto* in = static_cast<const uint8_t*>(data);
  SipState s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
             k1 ^ 0x7465646279746573ull};
  s.v1 ^= 0xee;  // 128-bit tag variant
  const size_t n_words = n_bytes / 8;
  for (size_t i = 0; i < n_words; ++i) s.compress(load_le64(in + 8 * i));
  uint64_t b = static_cast<uint64_t>(n_bytes) << 56;
  const size_t tail = n_bytes & 7;
  for (size_t i = 0; i < tail; ++i) b |= static_cast<uint64_t>(in[8 * n_words + i]) << (8 * i);
  s.compress(b);
  s.v2 ^= 0xee;
  for (int i = 0; i < 4; ++i) s.round();
  Hash128 h;
  h.lo = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  s.v1 ^= 0xdd;
  for (int i = 0; i < 4; ++i) s.round();
  h.hi = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  return h;
}

Hash128 prefix_block_hash(const Hash128& parent, std::span<const TokenId> tokens, const PrefixKey& key,
                          uint64_t k0, uint64_t k1) {
  // Serialize explicitly (little-endian, fixed widths) so the hash does not
  // depend on struct padding or host byte order.
  thread_local std::vector<uint8_t> buf;
  buf.resize(32 + 4 * tokens.size());
  uint8_t* p = buf.data();
  store_le64(p + 0, parent.lo);
  store_le64(p + 8, parent.hi);
  store_le64(p + 16, key.salt);
  store_le64(p + 24, key.adapter_id);
  p += 32;
  for (TokenId t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(u >> (8 * i));
  }
  return siphash128(buf.data(), buf.size(), k0, k1);
}

}  // namespace serval
