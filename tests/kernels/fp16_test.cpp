// F16 / BF16 conversions (common/fp16.h), exhaustively where the input space
// is 16 bits: every bit pattern decodes to the value an independent decoder
// (ldexp) gives, every finite value encodes back to itself, and every midpoint
// between neighbours rounds to the even one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/fp16.h"

namespace serval {
namespace {

// Value of an F16 bit pattern (finite), decoded from the IEEE 754 definition.
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

TEST(Fp16, DecodesEveryBitPattern) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = (uint16_t)i;
    const float f = fp16_to_fp32(h);
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    if ((h & 0x7c00) == 0x7c00) {
      if (h & 0x03ff) EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      else EXPECT_EQ(f, (h & 0x8000) ? -INFINITY : INFINITY);
    } else {
      EXPECT_EQ((double)f, f16_value(h)) << std::hex << h;
    }
  }
  EXPECT_EQ(fp16_to_fp32(0x0001), 5.9604644775390625e-8f);   // smallest subnormal, 2^-24
  EXPECT_EQ(fp16_to_fp32(0x03ff), 6.0975551605224609e-5f);   // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x0400), 6.103515625e-5f);          // smallest normal, 2^-14
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
}

TEST(Fp16, EveryValueEncodesBackToItself) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = (uint16_t)i;
    const uint16_t back = fp32_to_fp16(fp16_to_fp32(h));
    if (f16_is_nan(h)) {
      EXPECT_TRUE(f16_is_nan(back)) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000);
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Fp16, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (uint16_t h = 0; h < 0x7bff; ++h) {  // h and h + 1 adjacent finite positives
    const float a = (float)f16_value(h), b = (float)f16_value((uint16_t)(h + 1));
    const float mid = (a + b) / 2;  // 12 significant bits at most: exact in float
    ASSERT_EQ((double)mid, (f16_value(h) + f16_value((uint16_t)(h + 1))) / 2);
    const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
    EXPECT_EQ(fp32_to_fp16(mid), even) << std::hex << h;
    EXPECT_EQ(fp32_to_fp16(-mid), (uint16_t)(0x8000 | even)) << std::hex << h;
    EXPECT_EQ(fp32_to_fp16(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    EXPECT_EQ(fp32_to_fp16(std::nextafter(mid, INFINITY)), (uint16_t)(h + 1)) << std::hex << h;
  }
  // Above the largest finite value: 65504 + half an ulp (65520) is the midpoint
  // to "65536" = inf, and rounds to even, i.e. to inf.
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-1e6f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
  // Below the smallest subnormal: 2^-25 is the midpoint to 0, rounds to 0 (even).
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(fp32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 * 2^-24: tie, to even 2
  EXPECT_EQ(fp32_to_fp16(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 * 2^-24: tie, to even 2
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 * 2^-24: nearest 1
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-1e-10f), 0x8000);  // sign kept
  EXPECT_EQ(fp32_to_fp16(1e-40f), 0x0000);   // F32 subnormal input
  // Rounding that carries into the exponent: just below 2 rounds up to 2.0.
  EXPECT_EQ(fp32_to_fp16(1.99990f), 0x4000);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);  // largest subnormal + half -> smallest normal
}

TEST(Fp16, InfAndNaN) {
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_TRUE(f16_is_nan(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload lives only in the low 13 bits must not become inf.
  EXPECT_TRUE(f16_is_nan(fp32_to_fp16(fp32_from_bits(0x7f800001u))));
  const uint16_t neg_nan = fp32_to_fp16(fp32_from_bits(0xffc00000u));
  EXPECT_TRUE(f16_is_nan(neg_nan));
  EXPECT_EQ(neg_nan & 0x8000, 0x8000);
}

#if defined(__FLT16_MAX__)
TEST(Fp16, MatchesTheCompilersFloat16OnRandomFloats) {
  // The compiler's float -> _Float16 conversion (IEEE round-to-nearest-even)
  // as a second, independent reference, over bit patterns across all ranges.
  uint64_t s = 12345;
  for (int i = 0; i < 2000000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = (uint32_t)(s >> 32);
    const float f = fp32_from_bits(bits);
    if (std::isnan(f)) continue;
    const _Float16 g = (_Float16)f;
    uint16_t want;
    std::memcpy(&want, &g, 2);
    ASSERT_EQ(fp32_to_fp16(f), want) << std::hex << bits;
  }
}
#endif

TEST(Bf16, DecodesEveryBitPattern) {
  for (uint32_t b = 0; b < 65536; ++b) EXPECT_EQ(fp32_to_bits(bf16_to_fp32((uint16_t)b)), b << 16);
}

TEST(Bf16, RoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t exp = (b >> 7) & 0xff;
    if (exp == 0xff) continue;  // inf / NaN
    const uint32_t mid = (b << 16) | 0x8000;  // halfway to the next magnitude
    const uint16_t up = (uint16_t)(b + 1);     // (for b = max finite that is inf: correct)
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(mid)), (b & 1) ? up : (uint16_t)b) << std::hex << b;
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(mid - 1)), (uint16_t)b) << std::hex << b;
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(mid + 1)), up) << std::hex << b;
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(b << 16)), (uint16_t)b);  // exact values stay
  }
}

TEST(Bf16, InfAndNaN) {
  EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  const uint16_t n1 = fp32_to_bf16(fp32_from_bits(0x7f800001u));  // payload in the low bits only
  EXPECT_EQ(n1 & 0x7f80, 0x7f80);
  EXPECT_NE(n1 & 0x007f, 0);
  const uint16_t n2 = fp32_to_bf16(fp32_from_bits(0xffffffffu));  // must not carry into the sign
  EXPECT_EQ(n2 & 0xff80, 0xff80);
  EXPECT_NE(n2 & 0x007f, 0);
}

}  // namespace
}  // namespace serval
