// Tile attention over typed, paged KV (kernels/attention.h): the KV row codecs
// against independent oracles, every kernel level x every KV type against a
// double-precision attention computed here, SIMD levels bit-identical to each
// other, and the batch-invariance promise (a query's output is the same bits
// alone or inside any tile).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "common/fp16.h"
#include "kernels/attention.h"
#include "kernels/isa_levels.h"
#include "kernels/matmul.h"
#include "tensor/kv_type.h"

namespace serval {
namespace {

std::vector<Isa> levels() { return test::available_isa_levels(); }
using test::IsaGuard;

// ---- FP8 E4M3 ----------------------------------------------------------------

// The E4M3 value of a code from its definition (sign, 4-bit exponent with bias
// 7, 3-bit mantissa; exponent 0 is subnormal; S.1111.111 is NaN).
double fp8_definition(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double s = (b & 0x80) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return NAN;
  return e == 0 ? s * m / 8.0 * std::pow(2.0, -6) : s * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}

TEST(Fp8E4m3, DecodesEveryCodeAsDefined) {
  for (int b = 0; b < 256; ++b) {
    const double want = fp8_definition(b);
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(fp8_e4m3_to_fp32((uint8_t)b))) << b;
    else EXPECT_EQ((double)fp8_e4m3_to_fp32((uint8_t)b), want) << b;
  }
  EXPECT_EQ(fp8_e4m3_to_fp32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4m3, EncodesToTheNearestCodeTiesToEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 9.5f);
  for (int it = 0; it < 20000; ++it) {
    float x = std::exp2(mag(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    if (it % 97 == 0) x = (float)fp8_definition((int)(rng() % 126)) * 1.0f;  // exact codes
    if (it % 89 == 0) x = (float)((fp8_definition(40) + fp8_definition(41)) / 2);  // a tie
    // Brute force: the finite code nearest to x (ties: even mantissa code).
    int best = -1;
    double bd = INFINITY;
    for (int b = 0; b < 256; ++b) {
      const double v = fp8_definition(b);
      if (std::isnan(v) || (std::signbit(v) != std::signbit(x) && v != 0)) continue;
      const double d = std::fabs(v - std::fmin(std::fabs((double)x), 448.0) * (x < 0 ? -1 : 1));
      if (d < bd || (d == bd && (b & 1) == 0 && (best & 1) == 1)) {
        bd = d;
        best = b;
      }
    }
    const uint8_t got = fp32_to_fp8_e4m3(x);
    EXPECT_EQ(fp8_e4m3_to_fp32(got), (float)fp8_definition(best)) << x;
  }
  EXPECT_EQ(fp32_to_fp8_e4m3(1e6f), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(fp32_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(-0.0f), 0x80);
}

// ---- KV row codecs ------------------------------------------------------------

TEST(KvType, NamesBytesAndHeadDimCheck) {
  for (KvType t : kAllKvTypes) EXPECT_EQ(parse_kv_type(kv_type_name(t)), t);
  EXPECT_FALSE(parse_kv_type("q5_k").has_value());
  EXPECT_EQ(kv_row_bytes(KvType::f32, 64), 256u);
  EXPECT_EQ(kv_row_bytes(KvType::f16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvType::bf16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvType::q8_0, 64), 68u);
  EXPECT_EQ(kv_row_bytes(KvType::q4_0, 64), 36u);
  EXPECT_EQ(kv_row_bytes(KvType::fp8, 64), 64u);
  EXPECT_EQ(kv_type_check(KvType::f16, 8), "");
  EXPECT_NE(kv_type_check(KvType::q8_0, 8).find("multiple of 32"), std::string::npos);
  EXPECT_EQ(kv_type_check(KvType::q4_0, 64), "");
}

// The F16 row store at every level gives the scalar codec's bits
// (common/fp16.h, tested against its definition) for every input class: a
// stride through all 2^32 bit patterns (normals, subnormals, the rounding
// ties, overflow to inf, NaNs with payloads) and rows of every length mod 8.
TEST(KvType, F16StoreAtEveryLevelEqualsTheScalarCodec) {
  IsaGuard guard;
  std::vector<float> x;
  for (uint64_t b = 0; b < (1ull << 32); b += 65521) {
    const uint32_t u = (uint32_t)b;
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f, -0.0f,
                  INFINITY, -INFINITY, NAN})
    x.push_back(f);
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = fp32_to_fp16(x[i]);
  for (Isa isa : levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    std::vector<uint16_t> got(x.size() + 8, 0xdead);
    kernels::kv_store_row(KvType::f16, x.data(), (int64_t)x.size(), reinterpret_cast<uint8_t*>(got.data()));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " at " << i << " x = " << x[i];
    EXPECT_EQ(got[x.size()], 0xdead) << "wrote past the row";
    for (int64_t n = 1; n <= 17; ++n) {  // short rows: the 8-wide groups and the scalar tail
      std::vector<uint16_t> row((size_t)n);
      kernels::kv_store_row(KvType::f16, x.data() + 1000, n, reinterpret_cast<uint8_t*>(row.data()));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(row[(size_t)i], want[(size_t)(1000 + i)]) << isa_name(isa) << " n " << n;
    }
  }
}

// Round trip error bounds, per 32-element block of max |x| = a:
//   f16: half an ulp, 2^-11 relative;  bf16: 2^-8 relative;
//   fp8: 2^-4 relative (3 mantissa bits) or 2^-10 absolute (subnormals);
//   q8_0: d/2 with d = a/127 (+ the F16 rounding of d, 2^-11 relative, times 127);
//   q4_0: d with d = a/8 (llama.cpp's rule maps the largest magnitude to code
//         -8, so the opposite side clamps at +7: one full step), + the F16 term times 8.
TEST(KvType, RowRoundTripWithinTheFormatsError) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t n = 256;
  std::vector<float> x((size_t)n), y((size_t)n);
  for (auto& v : x) v = nd(rng);
  x[5] = 0.0f;
  for (KvType t : kAllKvTypes) {
    std::vector<uint8_t> row(kv_row_bytes(t, n));
    kernels::kv_store_row(t, x.data(), n, row.data());
    kernels::kv_load_row(t, row.data(), n, y.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float a = 0;
      for (int i = 0; i < 32; ++i) a = std::max(a, std::fabs(x[(size_t)(32 * b + i)]));
      for (int i = 0; i < 32; ++i) {
        const float xv = x[(size_t)(32 * b + i)], err = std::fabs(y[(size_t)(32 * b + i)] - xv);
        float bound = 0;
        switch (t) {
          case KvType::f32: bound = 0; break;
          case KvType::f16: bound = std::fabs(xv) * 0x1p-11f; break;
          case KvType::bf16: bound = std::fabs(xv) * 0x1p-8f; break;
          case KvType::fp8: bound = std::max(std::fabs(xv) * 0x1p-4f, 0x1p-10f); break;
          case KvType::q8_0: bound = a / 127 / 2 + a * 0x1p-11f * 1.01f; break;
          case KvType::q4_0: bound = a / 8 + a * 0x1p-11f * 8.1f; break;
        }
        EXPECT_LE(err, bound) << kv_type_name(t) << " element " << 32 * b + i;
      }
    }
  }
}

// ---- attention ----------------------------------------------------------------

// K and V of one sequence, stored as `type` in blocks taken from a pool in
// reverse order (so the block table is not the identity).
struct PagedKv {
  PagedKv(KvType type, int64_t n_pos, int32_t block_size, int32_t kv_dim, uint32_t seed)
      : type(type), bs(block_size), kv_dim(kv_dim), row_bytes(kv_row_bytes(type, kv_dim)) {
    const int64_t nb = (n_pos + bs - 1) / bs;
    kpool.resize((size_t)(nb * bs) * row_bytes);
    vpool.resize(kpool.size());
    kf.resize((size_t)(n_pos * kv_dim));
    vf.resize(kf.size());
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> row((size_t)kv_dim);
    for (int64_t b = 0; b < nb; ++b) {
      kb.push_back(kpool.data() + (size_t)((nb - 1 - b) * bs) * row_bytes);
      vb.push_back(vpool.data() + (size_t)((nb - 1 - b) * bs) * row_bytes);
    }
    for (int64_t p = 0; p < n_pos; ++p)
      for (int kv = 0; kv < 2; ++kv) {
        for (auto& v : row) v = nd(rng);
        uint8_t* dst = (kv ? vb : kb)[(size_t)(p / bs)];
        dst = const_cast<uint8_t*>(dst) + (size_t)(p % bs) * row_bytes;
        kernels::kv_store_row(type, row.data(), kv_dim, dst);
        // The values the kernels must see: the stored ones, decoded.
        kernels::kv_load_row(type, dst, kv_dim, (kv ? vf : kf).data() + p * kv_dim);
      }
  }
  kernels::KvView view(bool v) const { return {(v ? vb : kb).data(), bs, row_bytes, type}; }

  KvType type;
  int32_t bs, kv_dim;
  size_t row_bytes;
  std::vector<uint8_t> kpool, vpool;
  std::vector<uint8_t*> kb, vb;
  std::vector<float> kf, vf;  // decoded [n_pos, kv_dim]
};

struct Shape {
  int32_t n_heads, n_kv_heads, head_dim, block_size;
  int64_t p0;
  int32_t m;
  int32_t window = 0;     // sliding window (0: full attention)
  float softcap = 0.0f;   // score soft-capping (0: none)
};

std::vector<float> run_tile(const PagedKv& kv, const std::vector<float>& q, const Shape& s, int64_t p0, int32_t m,
                            int64_t q_row0) {
  const int64_t q_dim = (int64_t)s.n_heads * s.head_dim;
  std::vector<float> out((size_t)(m * q_dim), NAN);
  std::vector<const uint8_t*> kb(kv.kb.begin(), kv.kb.end()), vb(kv.vb.begin(), kv.vb.end());
  if (s.window > 0) {
    // Blocks wholly before the first query's window may be released by the
    // allocator: the kernel must not touch them.
    const int64_t lo = std::max<int64_t>(0, p0 - s.window + 1);
    for (int64_t b = 0; (b + 1) * kv.bs <= lo; ++b) kb[(size_t)b] = vb[(size_t)b] = nullptr;
  }
  for (int32_t g = 0; g < s.n_kv_heads; ++g) {
    kernels::AttentionTile t;
    t.q = q.data() + q_row0 * q_dim;
    t.q_stride = q_dim;
    t.k = {kb.data(), kv.bs, kv.row_bytes, kv.type};
    t.v = {vb.data(), kv.bs, kv.row_bytes, kv.type};
    t.p0 = p0;
    t.m = m;
    t.n_heads = s.n_heads;
    t.n_kv_heads = s.n_kv_heads;
    t.head_dim = s.head_dim;
    t.kv_head = g;
    t.scale = 1.0f / std::sqrt((float)s.head_dim);
    t.window = s.window;
    t.softcap = s.softcap;
    t.out = out.data();
    t.out_stride = q_dim;
    kernels::attention_tile(t);
  }
  return out;
}

// Causal attention in double over the decoded K/V: the oracle.
std::vector<double> oracle(const PagedKv& kv, const std::vector<float>& q, const Shape& s) {
  const int64_t q_dim = (int64_t)s.n_heads * s.head_dim, group = s.n_heads / s.n_kv_heads;
  std::vector<double> out((size_t)(s.m * q_dim), 0.0);
  for (int32_t i = 0; i < s.m; ++i)
    for (int32_t h = 0; h < s.n_heads; ++h) {
      const int64_t n = s.p0 + i + 1, koff = (h / group) * s.head_dim;
      const int64_t lo = s.window > 0 ? std::max<int64_t>(0, n - s.window) : 0;
      std::vector<double> sc((size_t)n, -INFINITY);
      double mx = -INFINITY, sum = 0;
      for (int64_t p = lo; p < n; ++p) {
        double d = 0;
        for (int32_t j = 0; j < s.head_dim; ++j)
          d += (double)q[(size_t)(i * q_dim + h * s.head_dim + j)] * kv.kf[(size_t)(p * kv.kv_dim + koff + j)];
        d /= std::sqrt((double)s.head_dim);
        if (s.softcap > 0) d = s.softcap * std::tanh(d / s.softcap);
        sc[(size_t)p] = d;
        mx = std::max(mx, sc[(size_t)p]);
      }
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      for (int64_t p = lo; p < n; ++p)
        for (int32_t j = 0; j < s.head_dim; ++j)
          out[(size_t)(i * q_dim + h * s.head_dim + j)] += sc[(size_t)p] / sum * kv.vf[(size_t)(p * kv.kv_dim + koff + j)];
    }
  return out;
}

std::vector<float> random_q(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> q((size_t)n);
  for (auto& v : q) v = nd(rng);
  return q;
}

// Every level x every KV type, a tile of m queries against the oracle.
// Tolerance 2e-5 absolute (values ~N(0,1)): the kernel's float steps (dot
// products of <= 128 terms, exp within 6e-9, and a convex combination of <= 300
// V rows accumulated in float) stay well below it; a wrong position, head or
// mask gives errors of order 0.1.
TEST(AttentionTile, EveryLevelAndKvTypeMatchesTheOracle) {
  IsaGuard guard;
  // Groups of 4, 1, 3, 8 and 5 query heads per KV head (the AVX-512 kernel
  // takes up to 4 at a time, AVX2 one), head_dim with and without a tail.
  const Shape shapes[] = {{8, 2, 64, 16, 183, 37}, {4, 4, 32, 7, 0, 20}, {6, 2, 40, 16, 40, 3},
                          {16, 2, 24, 16, 50, 5},  {10, 2, 32, 16, 20, 6}, {8, 4, 8, 16, 33, 2}};
  for (const Shape& s : shapes)
    for (KvType t : kAllKvTypes) {
      if (!kv_type_check(t, s.head_dim).empty()) continue;
      const PagedKv kv(t, s.p0 + s.m, s.block_size, s.n_kv_heads * s.head_dim, 11);
      const auto q = random_q((int64_t)s.m * s.n_heads * s.head_dim, 5);
      const auto want = oracle(kv, q, s);
      std::vector<float> simd_ref;
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        const auto got = run_tile(kv, q, s, s.p0, s.m, 0);
        double worst = 0;
        for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::fabs(got[j] - want[j]));
        EXPECT_LT(worst, 2e-5) << isa_name(isa) << " " << kv_type_name(t) << " head_dim " << s.head_dim;
        if (isa == Isa::ref) continue;
        if (simd_ref.empty()) simd_ref = got;
        else EXPECT_EQ(std::memcmp(got.data(), simd_ref.data(), got.size() * 4), 0)
                 << isa_name(isa) << " differs from the first SIMD level, " << kv_type_name(t);
      }
    }
}

// Sliding windows (shorter and longer than a tile, not multiples of 16, 1)
// and soft-capping, every level and KV type, against the oracle; the blocks
// before the first query's window are null (released) and never read.
TEST(AttentionTile, SlidingWindowAndSoftcapMatchTheOracle) {
  IsaGuard guard;
  const Shape shapes[] = {{8, 2, 64, 16, 183, 37, 32},     {4, 4, 32, 16, 100, 20, 1},
                          {6, 2, 40, 16, 70, 3, 21},       {8, 4, 32, 8, 90, 17, 50, 10.0f},
                          {8, 2, 64, 16, 20, 40, 0, 5.0f}, {4, 2, 64, 16, 300, 16, 17},
                          // head_dim with a tail, blocks that do not align with the 16-position chunks
                          {8, 4, 24, 7, 90, 5, 20},        {8, 4, 8, 16, 60, 3, 9}};
  for (const Shape& s : shapes)
    for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::fp8, KvType::q8_0}) {
      if (!kv_type_check(t, s.head_dim).empty()) continue;
      const PagedKv kv(t, s.p0 + s.m, s.block_size, s.n_kv_heads * s.head_dim, 13);
      const auto q = random_q((int64_t)s.m * s.n_heads * s.head_dim, 7);
      const auto want = oracle(kv, q, s);
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        const auto got = run_tile(kv, q, s, s.p0, s.m, 0);
        double worst = 0;
        for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::fabs(got[j] - want[j]));
        EXPECT_LT(worst, 2e-5) << isa_name(isa) << " " << kv_type_name(t) << " window " << s.window << " softcap "
                               << s.softcap;
        // Batch invariance holds with a window too.
        const int64_t q_dim = (int64_t)s.n_heads * s.head_dim;
        for (int32_t i0 = 0; i0 < s.m; i0 += 5) {
          const int32_t m = std::min(5, s.m - i0);
          const auto part = run_tile(kv, q, s, s.p0 + i0, m, i0);
          EXPECT_EQ(std::memcmp(part.data(), got.data() + i0 * q_dim, part.size() * 4), 0)
              << isa_name(isa) << " " << kv_type_name(t) << " window " << s.window << " at " << i0;
        }
      }
    }
}

// Batch invariance: each query row alone (m = 1) and in tiles of other sizes
// and starts gives the same bits.
TEST(AttentionTile, AQueryGivesTheSameBitsAloneOrInAnyTile) {
  IsaGuard guard;
  const Shape s{8, 2, 64, 16, 30, 45};
  for (KvType t : {KvType::f32, KvType::f16, KvType::q8_0, KvType::q4_0, KvType::fp8, KvType::bf16}) {
    const PagedKv kv(t, s.p0 + s.m, s.block_size, s.n_kv_heads * s.head_dim, 21);
    const auto q = random_q((int64_t)s.m * s.n_heads * s.head_dim, 9);
    const int64_t q_dim = (int64_t)s.n_heads * s.head_dim;
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      const auto whole = run_tile(kv, q, s, s.p0, s.m, 0);
      for (int32_t tile : {1, 5, 16}) {
        for (int32_t i0 = 0; i0 < s.m; i0 += tile) {
          const int32_t m = std::min(tile, s.m - i0);
          const auto part = run_tile(kv, q, s, s.p0 + i0, m, i0);
          EXPECT_EQ(std::memcmp(part.data(), whole.data() + i0 * q_dim, part.size() * 4), 0)
              << isa_name(isa) << " " << kv_type_name(t) << " tile " << tile << " at " << i0;
        }
      }
    }
  }
}

}  // namespace
}  // namespace serval
