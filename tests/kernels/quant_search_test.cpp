// Internal helpers of the reference quantizers (kernels/ref/quant_search.h)
// where a brute-force answer exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/ref/quant_search.h"
#include "tensor/quant_blocks.h"

namespace serval::ref::detail {
namespace {

int brute_nearest(const int8_t* values, float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs((double)v - values[i]) < std::fabs((double)v - values[best])) best = i;
  return best;
}

TEST(Codebook16, NearestMatchesBruteForceIncludingBoundaries) {
  const Codebook16 cb(kIq4nlValues);
  std::vector<float> probes;
  for (float v = -300.0f; v < 300.0f; v += 0.01f) probes.push_back(v);
  // every code point, every midpoint, and a few ulps either side of each
  for (int i = 0; i < 16; ++i) {
    const float pts[] = {(float)kIq4nlValues[i],
                         i < 15 ? 0.5f * ((float)kIq4nlValues[i] + (float)kIq4nlValues[i + 1]) : 200.0f};
    for (float p : pts) {
      float lo = p, hi = p;
      for (int k = 0; k < 40; ++k) {
        probes.push_back(lo);
        probes.push_back(hi);
        lo = std::nextafter(lo, -1e9f);
        hi = std::nextafter(hi, 1e9f);
      }
    }
  }
  for (float v : {1e6f, -1e6f, 0.0f, -0.0f, 1e-30f}) probes.push_back(v);
  for (float v : probes) ASSERT_EQ(cb.nearest(v), brute_nearest(kIq4nlValues, v)) << v;
  EXPECT_EQ(cb.nearest(NAN), 0);
}

TEST(RoundClamp, RoundsHalfToEvenAndClamps) {
  EXPECT_EQ(round_clamp(2.5f, -8, 7), 2);
  EXPECT_EQ(round_clamp(3.5f, -8, 7), 4);
  EXPECT_EQ(round_clamp(-2.5f, -8, 7), -2);
  EXPECT_EQ(round_clamp(7.4f, -8, 7), 7);
  EXPECT_EQ(round_clamp(1e30f, -8, 7), 7);
  EXPECT_EQ(round_clamp(-1e30f, -8, 7), -8);
  EXPECT_EQ(round_clamp(NAN, -8, 7), -8);
}

TEST(ScaleSearch, SubnormalSuperScalesAreSearchedNotJustRounded) {
  // 16 sub-scales around 3e-5, quantized to 8-bit integers against an F16
  // super-scale that is necessarily subnormal (max / 128 < 2^-14), i.e. a
  // multiple k * 2^-24 with k ~ 4: plain rounding of max / 128 to F16 loses
  // up to ~12%. Compare with the brute-force optimum over every subnormal d.
  float v[16];
  for (int j = 0; j < 16; ++j) v[j] = 3.125e-5f * (0.4f + 0.6f * (float)((j * 7) % 16) / 15.0f);
  auto error = [&](double d) {  // best integer codes for d, sum of squares
    double e = 0;
    for (float x : v) {
      const double q = std::fmin(127.0, std::fmax(-128.0, std::nearbyint(x / d)));
      e += (x - d * q) * (x - d * q);
    }
    return e;
  };
  int8_t q[16];
  const float d = quantize_scales_signed(16, 128, 127, v, nullptr, q);
  double ours = 0;
  for (int j = 0; j < 16; ++j) ours += ((double)v[j] - (double)d * q[j]) * ((double)v[j] - (double)d * q[j]);
  EXPECT_NEAR(ours, error(d), 1e-24);  // the codes are the best ones for d
  double best = 1e9;
  for (int k = 1; k < 1024; ++k) best = std::min(best, error(std::ldexp((double)k, -24)));
  // plain: max / 128 rounded to the nearest subnormal
  float vmax = 0;
  for (float x : v) vmax = std::max(vmax, x);
  const double plain = error(std::ldexp(std::nearbyint(std::ldexp((double)vmax / 128, 24)), -24));
  std::printf("  sum sq error: ours %.3g  brute-force optimum %.3g  plain rounding %.3g\n", ours, best, plain);
  EXPECT_LE(ours, 1.001 * best);
  EXPECT_LT(ours, 0.5 * plain);
}

}  // namespace
}  // namespace serval::ref::detail
