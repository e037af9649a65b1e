// The lattice (IQ1/IQ2/IQ3) and ternary (TQ) quantizers: rows already on a
// format's grid come back exactly, errors on random data stay within bounds,
// an imatrix lowers the error it weights, and hostile rows stay finite.
// (Against an independent quantizer: tests/quantize/iq_quantize_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/ref/quants.h"
#include "tensor/dtype.h"
#include "tensor/iq_grids.h"
#include "kernels/test_rng.h"

namespace serval {
namespace {

using test::Rng;

const DType kTypes[] = {DType::iq2_xxs, DType::iq2_xs, DType::iq2_s, DType::iq3_xxs, DType::iq3_s,
                        DType::iq1_s,   DType::iq1_m,  DType::tq1_0, DType::tq2_0};

std::vector<float> round_trip(DType t, const std::vector<float>& x, const float* imatrix = nullptr) {
  const int64_t n = (int64_t)x.size();
  std::vector<uint8_t> q(row_size(t, n) + 16, 0xAB);
  ref::quantize_row(t, x.data(), q.data(), n, imatrix);
  for (size_t i = row_size(t, n); i < q.size(); ++i) EXPECT_EQ(q[i], 0xAB) << "wrote past the row";
  std::vector<float> y((size_t)n);
  ref::dequantize_row(t, q.data(), y.data(), n);
  return y;
}

// ---- rows on the grid ---------------------------------------------------------
//
// Built from each format's formula (y = d * f(l) * grid value * sign), not
// through dequantize_row: d has few significant bits so every product is exact;
// every super-block uses the largest scale code, and the first group of every
// sub-block holds the grid's largest magnitude, so the scales are recoverable.

const float kD[] = {0.125f, 0.0078125f, 0.75f, 3.0f, 0.046875f, 1.0f};

uint8_t byte_of(uint64_t g, int j) { return (uint8_t)(g >> (8 * j)); }

// A random entry of grid[0..n) whose elements include `want` (any entry if want < 0).
template <typename W>
int entry_with(Rng& r, const W* grid, int n, int dim, int want) {
  for (;;) {
    const int e = r.below(n);
    if (want < 0) return e;
    for (int j = 0; j < dim; ++j)
      if ((int)(int8_t)byte_of(grid[e], j) == want || (int)byte_of(grid[e], j) == want) return e;
  }
}

uint8_t even_parity_signs(Rng& r) {
  uint8_t s = (uint8_t)r.below(256);
  if (__builtin_popcount(s) & 1) s ^= 0x80;
  return s;
}

std::vector<float> grid_row(DType t, int nblocks, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x;
  for (int b = 0; b < nblocks; ++b) {
    const float d = kD[r.below(6)];
    switch (t) {
      case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s: {
        const bool iq3 = t == DType::iq3_xxs || t == DType::iq3_s;
        const int sub = (t == DType::iq2_xs || t == DType::iq2_s) ? 16 : 32;
        const int nsub = 256 / sub, top_l = r.below(nsub);
        for (int ib = 0; ib < nsub; ++ib) {
          const int l = ib == top_l ? 15 : r.below(16);
          const float s = t == DType::iq3_s ? d * (float)(1 + 2 * l)
                          : t == DType::iq3_xxs ? d * (0.5f + (float)l) * 0.5f
                                                : d * (0.5f + (float)l) * 0.25f;
          for (int g = 0; g < sub / 8; ++g) {
            const uint8_t sg = (t == DType::iq2_s || t == DType::iq3_s) ? (uint8_t)r.below(256) : even_parity_signs(r);
            uint8_t mag[8];
            if (iq3) {
              const uint32_t* grid = t == DType::iq3_s ? iq3s_grid() : iq3xxs_grid();
              const int n = t == DType::iq3_s ? 512 : 256, top = t == DType::iq3_s ? 15 : 62;
              for (int h = 0; h < 2; ++h) {
                const uint32_t e = grid[entry_with(r, grid, n, 4, g == 0 && h == 0 ? top : -1)];
                for (int j = 0; j < 4; ++j) mag[4 * h + j] = byte_of(e, j);
              }
            } else {
              const uint64_t* grid = t == DType::iq2_xxs ? iq2xxs_grid() : t == DType::iq2_xs ? iq2xs_grid() : iq2s_grid();
              const int n = t == DType::iq2_xxs ? 256 : t == DType::iq2_xs ? 512 : 1024;
              const uint64_t e = grid[entry_with(r, grid, n, 8, g == 0 ? 43 : -1)];
              for (int j = 0; j < 8; ++j) mag[j] = byte_of(e, j);
            }
            for (int j = 0; j < 8; ++j) {
              const float v = s * (float)mag[j];
              x.push_back((sg >> j & 1) ? -v : v);
            }
          }
        }
        break;
      }
      case DType::iq1_s: case DType::iq1_m: {
        const int sub = t == DType::iq1_s ? 32 : 16;
        const int nsub = 256 / sub, top_l = r.below(nsub);
        float neg = r.below(2) ? -0.125f : 0.125f;
        for (int ib = 0; ib < nsub; ++ib) {
          const int l = ib == top_l ? 7 : r.below(8);
          const float s = d * (float)(2 * l + 1);
          if (t == DType::iq1_s) neg = r.below(2) ? -0.125f : 0.125f;
          for (int g = 0; g < sub / 8; ++g) {
            if (t == DType::iq1_m) neg = r.below(2) ? -0.125f : 0.125f;
            // the sub-block's first group reaches |g + delta| = 1.125
            const uint64_t e = iq1s_grid()[entry_with(r, iq1s_grid(), 2048, 8, g == 0 ? (neg > 0 ? 1 : -1) : -2)];
            for (int j = 0; j < 8; ++j) x.push_back(s * ((float)(int8_t)byte_of(e, j) + neg));
          }
        }
        break;
      }
      case DType::tq1_0: case DType::tq2_0: {
        const int one = r.below(256);
        for (int i = 0; i < 256; ++i) x.push_back(d * (float)(i == one ? 1 : r.below(3) - 1));
        break;
      }
      default: ADD_FAILURE();
    }
  }
  return x;
}

TEST(IqQuantize, RowsOnTheGridComeBackExactly) {
  for (DType t : kTypes) {
    const auto x = grid_row(t, 24, 7 + (uint64_t)t);
    const auto y = round_trip(t, x);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += y[i] != x[i];
    EXPECT_EQ(bad, 0) << dtype_name(t) << ": " << bad << " of " << x.size() << " elements differ";
  }
}

// ---- random rows ----------------------------------------------------------------

std::vector<float> gaussian(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x((size_t)n);
  for (auto& v : x) v = (float)r.normal();
  return x;
}

double rel_rmse(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>* w = nullptr) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double wi = w ? (*w)[i] : 1.0;
    e += wi * ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
    s += wi * (double)x[i] * x[i];
  }
  return std::sqrt(e / s);
}

TEST(IqQuantize, GaussianErrorsOrderByBitsAndStayBounded) {
  const auto x = gaussian(256 * 32, 4242);
  std::vector<double> err;
  for (DType t : kTypes) {
    const auto y = round_trip(t, x);
    err.push_back(rel_rmse(x, y));
    std::printf("  %-8s gaussian rel RMSE %.4f\n", std::string(dtype_name(t)).c_str(), err.back());
  }
  // kTypes order: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, tq1_0, tq2_0
  EXPECT_LT(err[4], err[3]);  // IQ3_S (3.44 bpw) < IQ3_XXS (3.06)
  EXPECT_LT(err[3], err[2]);  // IQ3_XXS < IQ2_S (2.56)
  EXPECT_LT(err[2], err[1]);  // IQ2_S < IQ2_XS (2.31)
  EXPECT_LT(err[1], err[0]);  // IQ2_XS < IQ2_XXS (2.06)
  EXPECT_LT(err[0], err[6]);  // IQ2_XXS < IQ1_M (1.75)
  EXPECT_LT(err[6], err[5]);  // IQ1_M < IQ1_S (1.56)
  EXPECT_EQ(err[7], err[8]);  // TQ1_0 and TQ2_0 store the same ternary values
  // Measured 0.350 / 0.296 / 0.250 / 0.185 / 0.137 / 0.496 / 0.449 / 0.488 (no
  // imatrix: weights mean x^2 + x^2, plain error shown): bounds a little above.
  const double bound[] = {0.365, 0.31, 0.26, 0.195, 0.145, 0.515, 0.465, 0.505, 0.505};
  for (size_t i = 0; i < err.size(); ++i) EXPECT_LT(err[i], bound[i]) << dtype_name(kTypes[i]);
}

TEST(IqQuantize, AnImatrixLowersTheErrorItWeights) {
  const int64_t n = 256 * 16;
  const auto x = gaussian(n, 99);
  Rng r(5);
  std::vector<float> im((size_t)n), w((size_t)n);
  for (int64_t i = 0; i < n; ++i) im[(size_t)i] = r.below(8) == 0 ? 50.0f : 0.5f;  // an eighth of the columns matter
  for (DType t : kTypes) {
    const double plain = rel_rmse(x, round_trip(t, x), &im);
    const double with = rel_rmse(x, round_trip(t, x, im.data()), &im);
    std::printf("  %-8s importance-weighted rel RMSE without / with imatrix: %.4f / %.4f\n",
                std::string(dtype_name(t)).c_str(), plain, with);
    EXPECT_LT(with, 0.95 * plain) << dtype_name(t);
  }
}

TEST(IqQuantize, ZeroTinyHugeAndConstantRowsStayFinite) {
  for (DType t : kTypes) {
    std::vector<std::vector<float>> rows = {std::vector<float>(256, 0.0f), std::vector<float>(256, 1e-30f),
                                            std::vector<float>(256, 3.0f), std::vector<float>(256, -2.5f)};
    auto huge = gaussian(256, 3);
    for (auto& v : huge) v *= 1e8f;
    rows.push_back(huge);
    auto one = std::vector<float>(256, 0.0f);
    one[77] = -4.0f;
    rows.push_back(one);
    for (const auto& x : rows) {
      const auto y = round_trip(t, x);
      for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(t);
    }
    const auto z = round_trip(t, rows[0]);
    for (float v : z) EXPECT_EQ(v, 0.0f) << dtype_name(t);
    // A constant row is on every grid but IQ1's (shifted) one: close, and the right sign.
    const auto c = round_trip(t, rows[2]);
    for (float v : c) EXPECT_GT(v, 0.0f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace serval
