// Hand-built blocks of every dequantizable type. The bytes are written out
// literally (F16 scales as bit patterns, packed nibbles / high bits / 6-bit
// scales packed by hand) and the expected floats are derived by hand from the
// format description, independently of the implementation.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ref/quants.h"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace serval {
namespace {

// F16 bit patterns used below.
constexpr uint16_t kH1 = 0x3C00;     // 1.0
constexpr uint16_t kH2 = 0x4000;     // 2.0
constexpr uint16_t kHalf = 0x3800;   // 0.5
constexpr uint16_t kQuarter = 0x3400;  // 0.25
constexpr uint16_t kEighth = 0x3000;   // 0.125
constexpr uint16_t kHm1 = 0xBC00;    // -1.0

template <typename Block>
std::vector<float> dequant(DType t, const Block& b) {
  std::vector<float> y(BlockOf<Block>::qk, -12345.f);
  ref::dequantize_row(t, &b, y.data(), BlockOf<Block>::qk);
  return y;
}

void expect_all(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

// j | (15 - j) << 4: low nibbles count up 0..15, high nibbles count down.
constexpr std::array<uint8_t, 16> kUpDown = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                                             0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};

TEST(QuantBlocks, LayoutMatchesDtypeTable) {
  auto check = [](auto block) {
    using B = decltype(block);
    const auto tr = dtype_traits(BlockOf<B>::type);
    ASSERT_TRUE(tr.has_value());
    EXPECT_EQ(tr->block_size, (uint32_t)BlockOf<B>::qk) << tr->name;
    EXPECT_EQ(tr->type_size, sizeof(B)) << tr->name;
    EXPECT_TRUE(tr->supported) << tr->name;
    EXPECT_TRUE(ref::can_dequantize(BlockOf<B>::type)) << tr->name;
    EXPECT_TRUE(ref::can_quantize(BlockOf<B>::type)) << tr->name;
  };
  check(block_q4_0{}); check(block_q4_1{}); check(block_q5_0{}); check(block_q5_1{});
  check(block_q8_0{}); check(block_iq4_nl{}); check(block_q2_K{}); check(block_q3_K{});
  check(block_q4_K{}); check(block_q5_K{}); check(block_q6_K{}); check(block_iq4_xs{});
  EXPECT_TRUE(ref::can_dequantize(DType::f32));
  EXPECT_TRUE(ref::can_dequantize(DType::f16));
  EXPECT_TRUE(ref::can_dequantize(DType::bf16));
  EXPECT_FALSE(ref::can_dequantize(DType::q8_1));
  EXPECT_FALSE(ref::can_dequantize(DType::q8_k));
  EXPECT_FALSE(ref::can_dequantize(DType::i8));
  EXPECT_TRUE(ref::can_quantize(DType::iq3_s));
  EXPECT_FALSE(ref::can_quantize(DType::i32));
}

TEST(QuantBlocks, F16AndBF16Rows) {
  const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x3555, 0x0400};
  float y[8];
  ref::dequantize_row(DType::f16, h, y, 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 65504.0f);
  EXPECT_EQ(y[3], 5.9604644775390625e-8f);  // 2^-24, smallest subnormal
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_TRUE(std::signbit(y[4]));
  EXPECT_EQ(y[5], INFINITY);
  EXPECT_EQ(y[6], 0.333251953125f);  // 0x3555 = (1 + 0x155/1024) / 4
  EXPECT_EQ(y[7], 6.103515625e-5f);  // 2^-14, smallest normal

  const uint16_t b[] = {0x3F80, 0xC0A0, 0x7F80, 0x0001, 0x4049, 0xFF80, 0x8000, 0x3E80};
  ref::dequantize_row(DType::bf16, b, y, 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -5.0f);
  EXPECT_EQ(y[2], INFINITY);
  EXPECT_EQ(y[3], 9.18354961579912115600575419705e-41f);  // 2^-133
  EXPECT_EQ(y[4], 3.140625f);
  EXPECT_EQ(y[5], -INFINITY);
  EXPECT_TRUE(std::signbit(y[6]));
  EXPECT_EQ(y[7], 0.25f);

  const float f[] = {1.5f, -0.0f, 3.0e38f, 7.0f};
  ref::dequantize_row(DType::f32, f, y, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::memcmp(&y[i], &f[i], 4), 0);
}

TEST(QuantBlocks, Q4_0) {
  block_q4_0 b{};
  b.d = kHalf;
  std::memcpy(b.qs, kUpDown.data(), 16);
  // y[j] = 0.5 * (j - 8); y[16 + j] = 0.5 * (7 - j)
  expect_all(dequant(DType::q4_0, b),
             {-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5,
              3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4});
}

TEST(QuantBlocks, Q4_1) {
  block_q4_1 b{};
  b.d = kQuarter;
  b.m = kHm1;
  std::memcpy(b.qs, kUpDown.data(), 16);
  // y[j] = 0.25 j - 1; y[16 + j] = 0.25 (15 - j) - 1
  expect_all(dequant(DType::q4_1, b),
             {-1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75,
              2.75, 2.5, 2.25, 2, 1.75, 1.5, 1.25, 1, 0.75, 0.5, 0.25, 0, -0.25, -0.5, -0.75, -1});
}

// qh = 0xFF00F00F: 5th bit set for elements 0-3, 12-15 and 24-31.
constexpr uint8_t kQh[4] = {0x0F, 0xF0, 0x00, 0xFF};

TEST(QuantBlocks, Q5_0) {
  block_q5_0 b{};
  b.d = kH1;
  std::memcpy(b.qh, kQh, 4);
  std::memcpy(b.qs, kUpDown.data(), 16);
  // element j: (j | 16 * bit) - 16; element 16 + j: ((15 - j) | 16 * bit) - 16
  expect_all(dequant(DType::q5_0, b),
             {0, 1, 2, 3, -12, -11, -10, -9, -8, -7, -6, -5, 12, 13, 14, 15,
              -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0});
}

TEST(QuantBlocks, Q5_1) {
  block_q5_1 b{};
  b.d = kHalf;
  b.m = kH2;
  std::memcpy(b.qh, kQh, 4);
  std::memcpy(b.qs, kUpDown.data(), 16);
  // q = 16..19, 4..11, 28..31 | 15..8, 23..16; y = 0.5 q + 2
  expect_all(dequant(DType::q5_1, b),
             {10, 10.5, 11, 11.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 16, 16.5, 17, 17.5,
              9.5, 9, 8.5, 8, 7.5, 7, 6.5, 6, 13.5, 13, 12.5, 12, 11.5, 11, 10.5, 10});
}

TEST(QuantBlocks, Q8_0) {
  block_q8_0 b{};
  b.d = kEighth;
  for (int j = 0; j < 31; ++j) b.qs[j] = (int8_t)(8 * j - 128);
  b.qs[31] = 127;
  std::vector<float> want;
  for (int j = 0; j < 31; ++j) want.push_back((float)(j - 16));  // (8j - 128) / 8
  want.push_back(15.875f);                                        // 127 / 8
  expect_all(dequant(DType::q8_0, b), want);

  b.d = 0xC000;  // -2.0
  b.qs[0] = -1;
  b.qs[1] = 100;
  const auto y = dequant(DType::q8_0, b);
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_EQ(y[1], -200.0f);
  EXPECT_EQ(y[31], -254.0f);
}

TEST(QuantBlocks, IQ4_NL) {
  block_iq4_nl b{};
  b.d = kH2;
  std::memcpy(b.qs, kUpDown.data(), 16);
  // 2 * {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113},
  // then the same reversed
  expect_all(dequant(DType::iq4_nl, b),
             {-254, -208, -166, -130, -98, -70, -44, -20, 2, 26, 50, 76, 106, 138, 178, 226,
              226, 178, 138, 106, 76, 50, 26, 2, -20, -44, -70, -98, -130, -166, -208, -254});
}

TEST(QuantBlocks, IQ4_XS) {
  block_iq4_xs b{};
  b.d = kHalf;
  // Sub-block j: ls = 33 + j (low nibble 1 + j, high bits 2), scale 1 + j;
  // except sub-block 3: ls = 0, scale -32.
  for (int j = 0; j < 8; ++j) b.scales_l[j / 2] |= (uint8_t)(((1 + j) & 0x0F) << (4 * (j % 2)));
  b.scales_l[1] &= 0x0F;
  b.scales_h = 0xAA2A;
  // Every byte 0xF0: the first 16 elements of a sub-block take code 0 (-127),
  // the last 16 code 15 (113).
  std::memset(b.qs, 0xF0, sizeof b.qs);
  const auto y = dequant(DType::iq4_xs, b);
  EXPECT_EQ(y[0], 0.5f * 1 * -127);
  EXPECT_EQ(y[15], 0.5f * 1 * -127);
  EXPECT_EQ(y[16], 0.5f * 1 * 113);
  EXPECT_EQ(y[32 + 20], 0.5f * 2 * 113);
  EXPECT_EQ(y[96], 0.5f * -32 * -127);
  EXPECT_EQ(y[127], 0.5f * -32 * 113);
  EXPECT_EQ(y[224], 0.5f * 8 * -127);
  EXPECT_EQ(y[255], 0.5f * 8 * 113);
}

TEST(QuantBlocks, Q2_K) {
  block_q2_K b{};
  b.d = kHalf;
  b.dmin = kQuarter;
  for (int i = 0; i < 16; ++i) b.scales[i] = (uint8_t)(i | ((15 - i) << 4));  // scale i, min 15 - i
  // First 128 elements: byte 0xE4 = 3,2,1,0 in bit pairs 6,4,2,0 -> quant of
  // element 32k + l is k. Second 128: 0x1B -> quant 3 - k.
  std::memset(b.qs, 0xE4, 32);
  std::memset(b.qs + 32, 0x1B, 32);
  const auto y = dequant(DType::q2_k, b);
  // Spot values: y = 0.5 * scale * q - 0.25 * min.
  EXPECT_EQ(y[0], -3.75f);     // sub 0, q 0: -0.25 * 15
  EXPECT_EQ(y[40], -2.25f);    // sub 2, q 1: 1 - 3.25
  EXPECT_EQ(y[127], 8.5f);     // sub 7, q 3: 10.5 - 2
  EXPECT_EQ(y[130], 10.25f);   // sub 8, q 3: 12 - 1.75
  EXPECT_EQ(y[200], 5.25f);    // sub 12, q 1: 6 - 0.75
  EXPECT_EQ(y[255], 0.0f);     // sub 15, q 0
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 16, k = (e % 128) / 32;
    const int q = e < 128 ? k : 3 - k;
    EXPECT_EQ(y[e], 0.5f * sub * q - 0.25f * (15 - sub)) << e;
  }
}

TEST(QuantBlocks, Q3_K) {
  block_q3_K b{};
  b.d = kHalf;
  // Biased 6-bit scales u_i = (37 i + 5) % 64:
  //   5 42 15 52 25 62 35 8 45 18 55 28 1 38 11 48  -> signed u - 32:
  //   -27 10 -17 20 -7 30 3 -24 13 -14 23 -4 -31 6 -21 16
  // bytes 0-7: low nibble of u_j | low nibble of u_{j+8} << 4
  // bytes 8-11: bits 4-5 of u_m, u_{m+4}, u_{m+8}, u_{m+12} at bits 0, 2, 4, 6
  const uint8_t scales[12] = {0xD5, 0x2A, 0x7F, 0xC4, 0x19, 0x6E, 0xB3, 0x08, 0x24, 0x9E, 0x38, 0xD3};
  std::memcpy(b.scales, scales, 12);
  std::memset(b.qs, 0xE4, 64);  // low 2 bits of element 128h + 32k + l = k
  // High bit of element 128h + 32k + l is bit 4h + k of hmask[l]: set for the
  // first half when l < 16 and for the second half when l >= 16.
  for (int l = 0; l < 32; ++l) b.hmask[l] = l < 16 ? 0x0F : 0xF0;
  const int sc[16] = {-27, 10, -17, 20, -7, 30, 3, -24, 13, -14, 23, -4, -31, 6, -21, 16};
  const auto y = dequant(DType::q3_k, b);
  EXPECT_EQ(y[20], -20.0f);   // h0 k0 l20: high bit clear -> 0 - 4; sub 1: 0.5 * 10 * -4
  EXPECT_EQ(y[100], 4.5f);    // h0 k3 l4: set -> 3; sub 6: 0.5 * 3 * 3
  EXPECT_EQ(y[255], 24.0f);   // h1 k3 l31: set -> 3; sub 15: 0.5 * 16 * 3
  EXPECT_EQ(y[130], -26.0f);  // h1 k0 l2: clear -> -4; sub 8: 0.5 * 13 * -4
  EXPECT_EQ(y[181], -2.0f);   // h1 k1 l21: set -> 1; sub 11: 0.5 * -4 * 1
  EXPECT_EQ(y[47], -8.5f);    // h0 k1 l15: set -> 1; sub 2: 0.5 * -17 * 1
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const bool high = (l < 16) == (h == 0);
    const int v = high ? k : k - 4;
    EXPECT_EQ(y[e], 0.5f * sc[e / 16] * v) << e;
  }
}

// Q4_K / Q5_K share the 6-bit scale packing. Scales {1, 63, 17, 40, 33, 5, 50,
// 22}, mins {0, 7, 63, 12, 48, 31, 2, 60}:
//   bytes 0-3: scale j | (scale j+4 >> 4) << 6 -> 0x81 0x3F 0xD1 0x68
//   bytes 4-7: min j | (min j+4 >> 4) << 6     -> 0xC0 0x47 0x3F 0xCC
//   bytes 8-11: (scale j+4 & 15) | (min j+4 & 15) << 4 -> 0x01 0xF5 0x22 0xC6
constexpr uint8_t kKScales[12] = {0x81, 0x3F, 0xD1, 0x68, 0xC0, 0x47, 0x3F, 0xCC, 0x01, 0xF5, 0x22, 0xC6};
constexpr int kKSc[8] = {1, 63, 17, 40, 33, 5, 50, 22};
constexpr int kKMin[8] = {0, 7, 63, 12, 48, 31, 2, 60};

TEST(QuantBlocks, Q4_K) {
  block_q4_K b{};
  b.d = kHalf;
  b.dmin = kEighth;
  std::memcpy(b.scales, kKScales, 12);
  // byte 32p + l: low nibble l % 16 (element 64p + l), high 15 - l % 16 (element 64p + 32 + l)
  for (int i = 0; i < 128; ++i) b.qs[i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
  const auto y = dequant(DType::q4_k, b);
  EXPECT_EQ(y[0], 0.0f);        // sub 0: 0.5 * 1 * 0 - 0
  EXPECT_EQ(y[33], 440.125f);   // sub 1, q 14: 0.5 * 63 * 14 - 0.125 * 7
  EXPECT_EQ(y[69], 34.625f);    // sub 2, q 5: 42.5 - 7.875
  EXPECT_EQ(y[148], 60.0f);     // sub 4, q 4: 66 - 6
  EXPECT_EQ(y[163], 26.125f);   // sub 5, q 12: 30 - 3.875
  EXPECT_EQ(y[255], -7.5f);     // sub 7, q 0: -0.125 * 60
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    const int q = (j % 2 == 0) ? l % 16 : 15 - l % 16;
    EXPECT_EQ(y[e], 0.5f * kKSc[j] * q - 0.125f * kKMin[j]) << e;
  }
}

TEST(QuantBlocks, Q5_K) {
  block_q5_K b{};
  b.d = kHalf;
  b.dmin = kEighth;
  std::memcpy(b.scales, kKScales, 12);
  for (int i = 0; i < 128; ++i) b.qs[i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
  // qh[l]: 0x55 (bits 0, 2, 4, 6: the low-nibble elements) for l < 16,
  // 0xAA (the high-nibble elements) for l >= 16.
  for (int l = 0; l < 32; ++l) b.qh[l] = l < 16 ? 0x55 : 0xAA;
  const auto y = dequant(DType::q5_k, b);
  EXPECT_EQ(y[0], 8.0f);        // sub 0, q 16
  EXPECT_EQ(y[33], 440.125f);   // sub 1, l 1 high nibble, no 5th bit: q 14
  EXPECT_EQ(y[69], 170.625f);   // sub 2, q 21: 0.5 * 17 * 21 - 7.875
  EXPECT_EQ(y[148], 60.0f);     // sub 4, l 20 low nibble, no 5th bit: q 4
  EXPECT_EQ(y[244], 289.5f);    // sub 7, l 20 high: q 11 + 16: 0.5 * 22 * 27 - 7.5
  EXPECT_EQ(y[255], 168.5f);    // sub 7, q 16: 176 - 7.5
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    const bool low_nibble = j % 2 == 0;
    int q = low_nibble ? l % 16 : 15 - l % 16;
    if (low_nibble == (l < 16)) q += 16;
    EXPECT_EQ(y[e], 0.5f * kKSc[j] * q - 0.125f * kKMin[j]) << e;
  }
}

TEST(QuantBlocks, Q6_K) {
  block_q6_K b{};
  b.d = kQuarter;
  const int8_t sc[16] = {1, -1, 2, -2, 3, -3, 4, -4, 127, -128, 5, -5, 10, -10, 64, -64};
  std::memcpy(b.scales, sc, 16);
  // ql byte i: low nibble i & 15, high nibble (i >> 2) & 15; qh bytes 0xE4:
  // bit pair r (r = 0..3) holds r.
  for (int i = 0; i < 128; ++i) b.ql[i] = (uint8_t)((i & 15) | (((i >> 2) & 15) << 4));
  std::memset(b.qh, 0xE4, 64);
  const auto y = dequant(DType::q6_k, b);
  EXPECT_EQ(y[0], -8.0f);     // ql[0] lo 0 | 0 << 4 = 0 -> -32; sc 1: 0.25 * -32
  EXPECT_EQ(y[37], -5.5f);    // r1 l5: ql[37] lo 5 | 1 << 4 = 21 -> -11; sc[2] = 2
  EXPECT_EQ(y[90], -4.5f);    // r2 l26: ql[26] hi 6 | 2 << 4 = 38 -> 6; sc[5] = -3
  EXPECT_EQ(y[127], -31.0f);  // r3 l31: ql[63] hi 15 | 3 << 4 = 63 -> 31; sc[7] = -4
  EXPECT_EQ(y[145], 992.0f);  // h1 r0 l17: ql[81] lo 1 -> -31; sc[9] = -128
  EXPECT_EQ(y[176], 20.0f);   // h1 r1 l16: ql[112] lo 0 | 16 -> -16; sc[11] = -5
  EXPECT_EQ(y[195], 0.0f);    // h1 r2 l3: ql[67] hi 0 | 32 -> 0
  EXPECT_EQ(y[255], -496.0f); // h1 r3 l31: ql[127] hi 15 | 48 -> 31; sc[15] = -64
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = (e % 128) / 32, l = e % 32;
    const int byte = 64 * h + l + 32 * (r % 2);
    const int lo = r < 2 ? (byte & 15) : ((byte >> 2) & 15);
    const int q = (lo | (r << 4)) - 32;
    EXPECT_EQ(y[e], 0.25f * sc[8 * h + 2 * r + l / 16] * q) << e;
  }
}

TEST(QuantBlocks, MultiBlockRowsKeepBlockOrder) {
  // Three Q8_0 blocks with scales 1, 2, 4: block b's element j is (j - 16) * 2^b.
  block_q8_0 blocks[3];
  const uint16_t ds[3] = {kH1, kH2, 0x4400};
  for (int b = 0; b < 3; ++b) {
    blocks[b].d = ds[b];
    for (int j = 0; j < 32; ++j) blocks[b].qs[j] = (int8_t)(j - 16);
  }
  std::vector<float> y(96);
  ref::dequantize_row(DType::q8_0, blocks, y.data(), 96);
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[32 * b + j], (float)((j - 16) << b));
}

}  // namespace
}  // namespace serval
