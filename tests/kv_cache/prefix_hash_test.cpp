// SipHash-2-4-128 against the reference vectors (github.com/veorq/SipHash
// vectors.h: key 00..0f, message 00..(n-1)) and the block-hash chain inputs.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "kv_cache/prefix_hash.h"

namespace serval {
namespace {

constexpr uint64_t kK0 = 0x0706050403020100ull;  // bytes 00..07, little-endian
constexpr uint64_t kK1 = 0x0f0e0d0c0b0a0908ull;  // bytes 08..0f

std::array<uint8_t, 16> tag_bytes(const Hash128& h) {
  std::array<uint8_t, 16> b{};
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(h.lo >> (8 * i));
    b[8 + i] = static_cast<uint8_t>(h.hi >> (8 * i));
  }
  return b;
}

TEST(SipHash128, ReferenceVectors) {
  struct Case {
    size_t len;
    std::array<uint8_t, 16> tag;
  };
  const Case cases[] = {
      {0, {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93}},
      {1, {0xda, 0x87, 0xc1, 0xd8, 0x6b, 0x99, 0xaf, 0x44, 0x34, 0x76, 0x59, 0x11, 0x9b, 0x22, 0xfc, 0x45}},
      {7, {0xa1, 0xf1, 0xeb, 0xbe, 0xd8, 0xdb, 0xc1, 0x53, 0xc0, 0xb8, 0x4a, 0xa6, 0x1f, 0xf0, 0x82, 0x39}},
      {8, {0x3b, 0x62, 0xa9, 0xba, 0x62, 0x58, 0xf5, 0x61, 0x0f, 0x83, 0xe2, 0x64, 0xf3, 0x14, 0x97, 0xb4}},
      {15, {0x54, 0x93, 0xe9, 0x99, 0x33, 0xb0, 0xa8, 0x11, 0x7e, 0x08, 0xec, 0x0f, 0x97, 0xcf, 0xc3, 0xd9}},
      {16, {0x6e, 0xe2, 0xa4, 0xca, 0x67, 0xb0, 0x54, 0xbb, 0xfd, 0x33, 0x15, 0xbf, 0x85, 0x23, 0x05, 0x77}},
      {63, {0x51, 0x50, 0xd1, 0x77, 0x2f, 0x50, 0x83, 0x4a, 0x50, 0x3e, 0x06, 0x9a, 0x97, 0x3f, 0xbd, 0x7c}},
  };
  std::vector<uint8_t> msg(64);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i);
  for (const Case& c : cases) {
    EXPECT_EQ(tag_bytes(siphash128(msg.data(), c.len, kK0, kK1)), c.tag) << "length " << c.len;
  }
}

TEST(PrefixBlockHash, EveryInputMatters) {
  const std::vector<TokenId> t = {1, 2, 3, 4};
  const PrefixKey k{7, 9};
  const Hash128 base = prefix_block_hash({}, t, k);
  EXPECT_EQ(base, prefix_block_hash({}, t, k));  // deterministic
  EXPECT_NE(base, prefix_block_hash({1, 0}, t, k));
  EXPECT_NE(base, prefix_block_hash({0, 1}, t, k));
  EXPECT_NE(base, prefix_block_hash({}, std::vector<TokenId>{1, 2, 4, 3}, k));
  EXPECT_NE(base, prefix_block_hash({}, std::vector<TokenId>{1, 2, 3, 5}, k));
  EXPECT_NE(base, prefix_block_hash({}, t, PrefixKey{8, 9}));
  EXPECT_NE(base, prefix_block_hash({}, t, PrefixKey{7, 10}));
  EXPECT_NE(base, prefix_block_hash({}, t, k, 1, 0));  // keyed
  // A chain: the second block's hash depends on the first block's tokens.
  const Hash128 a = prefix_block_hash(prefix_block_hash({}, std::vector<TokenId>{1, 2}, k), t, k);
  const Hash128 b = prefix_block_hash(prefix_block_hash({}, std::vector<TokenId>{2, 1}, k), t, k);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace serval
