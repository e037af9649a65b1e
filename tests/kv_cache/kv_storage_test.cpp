// KvStorage for every KV element type: the pool's size follows the type's
// row bytes, and copy-on-write and swap move whole blocks byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kv_cache/kv_storage.h"

using namespace serval;

namespace {

// Fills every layer's K and V of block b with a pattern unique to (b, salt).
void fill(KvStorage& s, BlockId b, uint8_t salt) {
  const KvGeometry& g = s.geometry();
  const size_t n = (size_t)g.block_size * g.row_bytes();
  for (int32_t l = 0; l < g.n_layers; ++l)
    for (size_t i = 0; i < n; ++i) {
      s.k(l, b)[i] = (uint8_t)(i * 7 + l * 13 + b * 29 + salt);
      s.v(l, b)[i] = (uint8_t)(i * 11 + l * 5 + b * 31 + salt + 1);
    }
}

bool same(const KvStorage& s, BlockId a, BlockId b) {
  const KvGeometry& g = s.geometry();
  const size_t n = (size_t)g.block_size * g.row_bytes();
  for (int32_t l = 0; l < g.n_layers; ++l)
    if (std::memcmp(s.k(l, a), s.k(l, b), n) != 0 || std::memcmp(s.v(l, a), s.v(l, b), n) != 0) return false;
  return true;
}

}  // namespace

TEST(KvStorage, EveryTypeSizesCopiesAndSwapsWholeBlocks) {
  for (KvType t : kAllKvTypes) {
    const KvGeometry g{3, 128, 16, t};
    EXPECT_EQ(g.bytes_per_token(), 3u * 2 * kv_row_bytes(t, 128)) << kv_type_name(t);
    EXPECT_EQ(g.bytes_per_block(), 16 * g.bytes_per_token());
    auto st = KvStorage::create(g, 4, 2);
    ASSERT_TRUE(st.ok()) << kv_type_name(t);
    KvStorage& s = *st;
    // Blocks are adjacent runs of exactly row_bytes * block_size.
    EXPECT_EQ((size_t)(s.k(0, 1) - s.k(0, 0)), 16 * g.row_bytes());
    for (BlockId b = 0; b < 4; ++b) fill(s, b, (uint8_t)t);
    ASSERT_FALSE(same(s, 0, 1));
    s.copy_block({0, 1});
    EXPECT_TRUE(same(s, 0, 1)) << kv_type_name(t);
    // Swap block 2 out to host slot 1 and back in as block 3.
    fill(s, 3, 99);
    ASSERT_FALSE(same(s, 2, 3));
    s.swap_out({2, 1});
    s.swap_in({3, 1});
    EXPECT_TRUE(same(s, 2, 3)) << kv_type_name(t);
  }
}

TEST(KvStorage, RefusesBlockTypesThatDoNotTileTheRow) {
  EXPECT_FALSE(KvStorage::create({2, 48, 16, KvType::q8_0}, 4).ok());
  EXPECT_TRUE(KvStorage::create({2, 48, 16, KvType::f16}, 4).ok());
}
