// quantize_row -> dequantize_row on seeded data: error bounds per type, exact
// round trips of values already on a type's grid, special rows, imatrix use,
// and dot_row against dequantize-then-dot.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/ref/quants.h"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"
#include "kernels/test_rng.h"

namespace serval {
namespace {

using test::Rng;

std::vector<float> gaussian(int64_t n, uint64_t seed, double sigma = 1.0) {
  Rng r(seed);
  std::vector<float> x((size_t)n);
  for (auto& v : x) v = (float)(sigma * r.normal());
  return x;
}

// Weight-like data: Laplace body with rare large outliers, and a per-32-column
// scale that varies (as real weight rows do).
std::vector<float> heavy_tailed(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x((size_t)n);
  double col_scale = 1;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) col_scale = 0.5 + r.uniform();
    const double u = r.uniform() - 0.5;
    double v = -std::copysign(std::log(1 - 2 * std::fabs(u)), u);
    if (r.uniform() < 0.002) v *= 8;
    x[(size_t)i] = (float)(v * col_scale);
  }
  return x;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x, const float* imatrix = nullptr) {
  const int64_t n = (int64_t)x.size();
  std::vector<uint8_t> q(row_size(t, n) + 16, 0xAB);  // guard bytes after the row
  ref::quantize_row(t, x.data(), q.data(), n, imatrix);
  for (size_t i = row_size(t, n); i < q.size(); ++i) EXPECT_EQ(q[i], 0xAB) << "wrote past the row";
  std::vector<float> y((size_t)n);
  ref::dequantize_row(t, q.data(), y.data(), n);
  return y;
}

// sqrt(sum w (y - x)^2 / sum w x^2); w == nullptr: unit weights.
double rel_rmse(const std::vector<float>& x, const std::vector<float>& y, const float* w = nullptr) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double wi = w ? w[i] : 1.0;
    e += wi * ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
    s += wi * (double)x[i] * x[i];
  }
  return std::sqrt(e / s);
}

bool all_finite(const std::vector<float>& y) {
  for (float v : y)
    if (!std::isfinite(v)) return false;
  return true;
}

struct Bound {
  DType type;
  double gaussian;  // max relative RMSE on N(0, 1) data
  double heavy;     // ... on heavy-tailed weight-like data
};

// Bounds a little above the measured errors (printed by the tests): a
// regression in a search shows up, noise does not.
const Bound kBounds[] = {
    {DType::f32, 0.0, 0.0},
    {DType::f16, 2.5e-4, 2.5e-4},
    {DType::bf16, 1.8e-3, 1.8e-3},
    {DType::q8_0, 0.0055, 0.0075},
    {DType::q6_k, 0.0183, 0.0235},
    {DType::q5_1, 0.036, 0.044},
    {DType::q5_0, 0.042, 0.058},
    {DType::q5_k, 0.0375, 0.046},
    {DType::q4_1, 0.074, 0.090},
    {DType::q4_0, 0.085, 0.115},
    {DType::q4_k, 0.074, 0.090},
    {DType::iq4_nl, 0.078, 0.096},
    {DType::iq4_xs, 0.079, 0.097},
    {DType::q3_k, 0.154, 0.186},
    {DType::q2_k, 0.299, 0.352},
};

constexpr int64_t kN = 256 * 64;  // 16384 elements: 512 small blocks / 64 super-blocks

TEST(QuantRoundTrip, RelativeRmseWithinPerTypeBound) {
  const auto g = gaussian(kN, 1234);
  const auto h = heavy_tailed(kN, 99);
  for (const Bound& b : kBounds) {
    ASSERT_TRUE(ref::can_quantize(b.type));
    const auto yg = round_trip(b.type, g);
    const auto yh = round_trip(b.type, h);
    const double eg = rel_rmse(g, yg), eh = rel_rmse(h, yh);
    std::printf("  %-7s gaussian %.5f  heavy-tailed %.5f\n", std::string(dtype_name(b.type)).c_str(), eg, eh);
    EXPECT_LE(eg, b.gaussian) << dtype_name(b.type);
    EXPECT_LE(eh, b.heavy) << dtype_name(b.type);
    EXPECT_TRUE(all_finite(yg) && all_finite(yh));
  }
}

const DType kQuantTypes[] = {DType::q8_0, DType::q6_k, DType::q5_1, DType::q5_0, DType::q5_k,
                             DType::q4_1, DType::q4_0, DType::q4_k, DType::iq4_nl, DType::q3_k,
                             DType::q2_k};

// ---- exact round trips of values already on the grid ------------------------
//
// Rows built from each format's formula (not through dequantize_row), with the
// extreme code present in every group so that the scale is recoverable, and
// F16 scales with few significant bits so that every product is exact in float.

// F16-exact positive scales with at most 2 significant bits.
float pick_scale(Rng& r) {
  const float s[] = {0.125f, 0.0078125f, 0.75f, 3.0f, 0.046875f, 1.0f};
  return s[r.below(6)];
}

// n values c[i] in [lo, hi], with lo and hi each at a random position (distinct).
std::vector<int> codes_with_extremes(Rng& r, int n, int lo, int hi) {
  std::vector<int> c(n);
  for (auto& v : c) v = lo + r.below(hi - lo + 1);
  const int a = r.below(n);
  const int b = (a + 1 + r.below(n - 1)) % n;
  c[a] = lo;
  c[b] = hi;
  return c;
}

std::vector<float> grid_row(DType t, int nblocks, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x;
  auto symmetric32 = [&](int nmax) {  // Q8_0 / Q4_0 / Q5_0: d * q, q in [-nmax, nmax - 1]
    const float d = pick_scale(r) * (r.below(2) ? 1.f : -1.f);
    // the largest magnitude must be unique to the -nmax end
    const auto c = codes_with_extremes(r, 32, -nmax, nmax - 1);
    for (int q : c) x.push_back(d * (float)q);
  };
  auto affine32 = [&](int qmax) {  // Q4_1 / Q5_1: d * q + m
    const float d = pick_scale(r);
    const float ms[] = {-1.5f, 0.25f, 3.0f, -0.375f, 0.0f};
    const float m = ms[r.below(5)];
    for (int q : codes_with_extremes(r, 32, 0, qmax)) x.push_back(d * (float)q + m);
  };
  for (int b = 0; b < nblocks; ++b) {
    switch (t) {
      case DType::q8_0: {
        const float d = pick_scale(r) * (r.below(2) ? 1.f : -1.f);
        for (int q : codes_with_extremes(r, 32, -127, 127)) x.push_back(d * (float)q);
        break;
      }
      case DType::q4_0: symmetric32(8); break;
      case DType::q5_0: symmetric32(16); break;
      case DType::q4_1: affine32(15); break;
      case DType::q5_1: affine32(31); break;
      case DType::iq4_nl: {
        const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const float d = pick_scale(r) * (r.below(2) ? 1.f : -1.f);
        for (int q : codes_with_extremes(r, 32, 0, 15)) x.push_back(d * (float)kv[q]);
        break;
      }
      case DType::q6_k:
      case DType::q3_k: {
        // d * sc[j] * q: 16 sub-blocks of 16, signed sub-scales with one at
        // the negative end, q in [-qn, qn - 1] with -qn in every sub-block.
        const int qn = t == DType::q6_k ? 32 : 4;
        const int sn = t == DType::q6_k ? 128 : 32;
        const float d = pick_scale(r) / 64;
        auto sc = codes_with_extremes(r, 16, -sn, sn - 1);
        for (auto& v : sc)
          if (v == 0) v = 1;
        for (int j = 0; j < 16; ++j) {
          const auto c = codes_with_extremes(r, 16, -qn, qn - 1);
          for (int q : c) x.push_back(d * (float)sc[j] * (float)q);
        }
        break;
      }
      case DType::q4_k:
      case DType::q5_k:
      case DType::q2_k: {
        // d * sc[j] * q - dmin * m[j], sub-blocks of 32 (16 for Q2_K), with
        // the largest scale and min at the top of their ranges and q spanning
        // its full range in every sub-block.
        const bool q2 = t == DType::q2_k;
        const int nsub = q2 ? 16 : 8, sub = q2 ? 16 : 32;
        const int smax = q2 ? 15 : 63;
        const int qmax = t == DType::q5_k ? 31 : (q2 ? 3 : 15);
        const float d = pick_scale(r) / 16, dmin = pick_scale(r) / 16;
        const auto sc = codes_with_extremes(r, nsub, 1, smax);
        const auto m = codes_with_extremes(r, nsub, 0, smax);
        for (int j = 0; j < nsub; ++j)
          for (int q : codes_with_extremes(r, sub, 0, qmax))
            x.push_back(d * (float)sc[j] * (float)q - dmin * (float)m[j]);
        break;
      }
      default: ADD_FAILURE() << "no grid for " << dtype_name(t);
    }
  }
  return x;
}

TEST(QuantRoundTrip, ValuesOnTheGridRoundTripExactly) {
  for (DType t : kQuantTypes) {
    const int bs = (int)dtype_traits(t)->block_size;
    const int nblocks = bs == 32 ? 64 : 8;
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      const auto x = grid_row(t, nblocks, seed * 7919 + (uint64_t)t);
      ASSERT_EQ((int)x.size(), nblocks * bs);
      const auto y = round_trip(t, x);
      int mismatches = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (y[i] != x[i] && mismatches++ < 3)
          ADD_FAILURE() << dtype_name(t) << " seed " << seed << " element " << i << ": " << y[i] << " != " << x[i];
      }
    }
  }
}

TEST(QuantRoundTrip, F16AndBF16RoundTripTheirOwnValues) {
  Rng r(5);
  std::vector<float> x(4096);
  for (auto& v : x) v = (float)(r.normal() * 100);
  for (DType t : {DType::f16, DType::bf16}) {
    const auto once = round_trip(t, x);   // onto the grid
    const auto twice = round_trip(t, once);
    EXPECT_EQ(std::memcmp(once.data(), twice.data(), once.size() * 4), 0) << dtype_name(t);
  }
  EXPECT_EQ(std::memcmp(round_trip(DType::f32, x).data(), x.data(), x.size() * 4), 0);
}

// ---- special rows -------------------------------------------------------------

TEST(QuantRoundTrip, AllZeroRowGivesZeros) {
  for (DType t : kQuantTypes) {
    const std::vector<float> x(512, 0.0f);
    for (float v : round_trip(t, x)) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantRoundTrip, ConstantRowsStayConstantToF16Precision) {
  // Tolerance: F16's relative precision (2^-11) with slack; at c = -0.001 the
  // K-quants' super-scales are F16 subnormals with a few significant bits, so
  // there the bound is 3e-3.
  for (DType t : kQuantTypes) {
    for (float c : {0.37f, -2.5f, 1000.0f, -0.001f}) {
      const std::vector<float> x(512, c);
      const auto y = round_trip(t, x);
      const float tol = std::fabs(c) * (std::fabs(c) < 0.01f ? 3e-3f : 1.5e-3f);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(y[i], y[0]) << dtype_name(t) << " c=" << c << " i=" << i;
        ASSERT_NEAR(y[i], c, tol) << dtype_name(t) << " c=" << c;
      }
    }
  }
}

TEST(QuantRoundTrip, ScaledDataKeepsItsRelativeError) {
  // Magnitudes well inside F16's range for the scales: same relative error as
  // unit data (the bounds get 10% slack).
  for (double sigma : {1e4, 1e-2}) {
    const auto x = gaussian(kN, 777, sigma);
    for (const Bound& b : kBounds) {
      if (b.type == DType::f16 && sigma > 1e3) continue;  // F16 itself overflows near 65504
      const double e = rel_rmse(x, round_trip(b.type, x));
      EXPECT_LE(e, b.gaussian * 1.1 + 1e-6) << dtype_name(b.type) << " sigma " << sigma;
    }
  }
}

TEST(QuantRoundTrip, ExtremeMagnitudesNeverGiveNaNOrInf) {
  // Beyond what F16 scales can represent: the result is clamped, not garbage.
  for (double sigma : {1e30, 1e12, 1e-8, 1e-30}) {
    auto x = gaussian(1024, 31, sigma);
    for (DType t : kQuantTypes) {
      const auto y = round_trip(t, x);
      EXPECT_TRUE(all_finite(y)) << dtype_name(t) << " sigma " << sigma;
      // never much larger than the input (1e-6: F16's resolution for the
      // scales, 2^-24 times the largest code)
      double xmax = 0, ymax = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        xmax = std::max(xmax, std::fabs((double)x[i]));
        ymax = std::max(ymax, std::fabs((double)y[i]));
      }
      EXPECT_LE(ymax, 1.5 * xmax + 1e-6) << dtype_name(t) << " sigma " << sigma;
    }
  }
  // A row with a single huge outlier: the other blocks are unaffected.
  auto x = gaussian(1024, 32);
  x[5] = 1e6f;
  for (DType t : kQuantTypes) {
    const auto y = round_trip(t, x);
    EXPECT_TRUE(all_finite(y)) << dtype_name(t);
    const std::vector<float> rest_x(x.begin() + 256, x.end()), rest_y(y.begin() + 256, y.end());
    EXPECT_LE(rel_rmse(rest_x, rest_y), 0.4) << dtype_name(t);
  }
}

// ---- importance weights -----------------------------------------------------

TEST(QuantRoundTrip, ImatrixLowersTheWeightedError) {
  const auto x = gaussian(kN, 4242);
  Rng r(17);
  std::vector<float> imatrix(kN);
  for (auto& v : imatrix) v = (float)std::exp(2.0 * r.normal());  // spans orders of magnitude
  for (DType t : kQuantTypes) {
    const auto plain = round_trip(t, x);
    const auto weighted = round_trip(t, x, imatrix.data());
    const double e_plain = rel_rmse(x, plain, imatrix.data());
    const double e_weighted = rel_rmse(x, weighted, imatrix.data());
    std::printf("  %-7s imatrix-weighted rel RMSE: without %.5f  with %.5f\n",
                std::string(dtype_name(t)).c_str(), e_plain, e_weighted);
    if (t == DType::q8_0) {
      EXPECT_EQ(std::memcmp(plain.data(), weighted.data(), plain.size() * 4), 0);  // ignored
    } else {
      EXPECT_LT(e_weighted, e_plain * 0.95) << dtype_name(t);
    }
  }
  // An imatrix of ones changes nothing the search cares about: the error stays
  // within the unweighted bounds.
  const std::vector<float> ones(kN, 1.0f);
  for (const Bound& b : kBounds)
    EXPECT_LE(rel_rmse(x, round_trip(b.type, x, ones.data())), b.gaussian * 1.05) << dtype_name(b.type);
}

// ---- dot_row ------------------------------------------------------------------

TEST(DotRow, EqualsDequantizeThenDot) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q6_k, DType::q5_1, DType::q5_0,
                  DType::q5_k, DType::q4_1, DType::q4_0, DType::q4_k, DType::iq4_nl, DType::q3_k,
                  DType::q2_k}) {
    const int64_t bs = dtype_traits(t)->block_size;
    // a partial last chunk for the small-block types (11 blocks of 32)
    for (int64_t n : {bs == 256 ? (int64_t)256 * 3 : (int64_t)352, (int64_t)4096}) {
      const auto w = gaussian(n, 100 + n);
      const auto x = gaussian(n, 200 + n);
      std::vector<uint8_t> q(row_size(t, n));
      ref::quantize_row(t, w.data(), q.data(), n);
      std::vector<float> y((size_t)n);
      ref::dequantize_row(t, q.data(), y.data(), n);
      double want = 0;
      for (int64_t i = 0; i < n; ++i) want += (double)y[(size_t)i] * x[(size_t)i];
      EXPECT_FLOAT_EQ(ref::dot_row(t, q.data(), x.data(), n), (float)want) << dtype_name(t) << " n " << n;
    }
  }
}

TEST(DotRow, HandBuiltQ4_0Block) {
  // d = 0.5, codes 0..15 in the low nibbles, 15..0 in the high: values
  // 0.5 (j - 8) for j < 16, then 0.5 (7 - j).
  block_q4_0 b{};
  b.d = 0x3800;
  for (int j = 0; j < 16; ++j) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
  std::vector<float> x(32, 1.0f);
  EXPECT_EQ(ref::dot_row(DType::q4_0, &b, x.data(), 32), -8.0f);  // -4 + -4
  // x[i] = i on the first half only: 0.5 * sum (j^2 - 8 j) = 0.5 (1240 - 960)
  for (int i = 0; i < 32; ++i) x[i] = i < 16 ? (float)i : 0.0f;
  EXPECT_EQ(ref::dot_row(DType::q4_0, &b, x.data(), 32), 140.0f);
}

}  // namespace
}  // namespace serval
