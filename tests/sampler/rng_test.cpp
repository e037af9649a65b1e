// Rng: the published reference vectors of splitmix64 and xoshiro256**, and
// the seeded stream (checked against an independent Python transcription of
// both algorithms).
#include "sampler/rng.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>

namespace serval {
namespace {

TEST(SplitMix64, SeedZeroMatchesPublishedOutputs) {
  SplitMix64 sm(0);
  EXPECT_EQ(sm.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(sm.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(sm.next(), 0x06C45D188009454Full);
  EXPECT_EQ(sm.next(), 0xF88BB8A8724C81ECull);
}

TEST(Rng, Xoshiro256StarStarReferenceVectorFromState1234) {
  // Outputs of the reference xoshiro256starstar.c from state {1, 2, 3, 4}.
  Rng r = Rng::from_state({1, 2, 3, 4});
  const uint64_t expected[] = {11520ull,
                               0ull,
                               1509978240ull,
                               1215971899390074240ull,
                               1216172134540287360ull,
                               607988272756665600ull,
                               16172922978634559625ull,
                               8476171486693032832ull,
                               10595114339597558777ull,
                               2904607092377533576ull};
  for (uint64_t e : expected) EXPECT_EQ(r.next_u64(), e);
}

TEST(Rng, SeedExpandsThroughSplitMix64) {
  Rng r(0);
  EXPECT_EQ(r.state()[0], 0xE220A8397B1DCDAFull);
  EXPECT_EQ(r.state()[1], 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(r.state()[2], 0x06C45D188009454Full);
  EXPECT_EQ(r.state()[3], 0xF88BB8A8724C81ECull);
}

TEST(Rng, Seed42Stream) {
  Rng r(42);
  EXPECT_EQ(r.next_u64(), 1546998764402558742ull);
  EXPECT_EQ(r.next_u64(), 6990951692964543102ull);
  EXPECT_EQ(r.next_u64(), 12544586762248559009ull);
  EXPECT_EQ(r.next_u64(), 17057574109182124193ull);
}

TEST(Rng, UniformIsTop53BitsTimesTwoToMinus53) {
  Rng r(42);
  // 1546998764402558742 >> 11 = 755370490430936; * 2^-53 exactly:
  EXPECT_EQ(r.uniform(), 755370490430936.0 / 9007199254740992.0);
  EXPECT_DOUBLE_EQ(755370490430936.0 / 9007199254740992.0, 0.08386297105988216);
}

TEST(Rng, UniformRangeIsHalfOpen) {
  // All-ones bits give the largest value, 1 - 2^-53 < 1; zero bits give 0.
  EXPECT_LT((~0ull >> 11) * 0x1.0p-53, 1.0);
  Rng r(1);
  for (int i = 0; i < 100000; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Rng, SameSeedSameStreamDifferentSeedsDiffer) {
  Rng a(123), b(123), c(124);
  bool differs = false;
  for (int i = 0; i < 64; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
}

TEST(Rng, CopyContinuesTheSameSequence) {
  Rng a(9);
  a.next_u64();
  Rng b = a;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
}

TEST(Rng, OsSeedsVary) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 8; ++i) seen.insert(Rng::os_seed());
  EXPECT_GT(seen.size(), 1u);
}

}  // namespace
}  // namespace serval
