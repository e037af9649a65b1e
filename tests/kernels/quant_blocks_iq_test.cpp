// Hand-built blocks of the lattice-codebook (IQ1/IQ2/IQ3) and ternary (TQ)
// types. Grid entries used below are quoted from ggml's tables (the literal
// hex words of ggml-common.h), so the compact codebook encoding in
// tensor/iq_grids.cpp is checked against an independent source; every
// expected float is worked out by hand from the layout in quant_blocks.h.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/ref/quants.h"
#include "tensor/dtype.h"
#include "tensor/iq_grids.h"
#include "tensor/quant_blocks.h"

namespace serval {
namespace {

constexpr uint16_t kH1 = 0x3C00;       // 1.0
constexpr uint16_t kH2 = 0x4000;       // 2.0
constexpr uint16_t kHalf = 0x3800;     // 0.5
constexpr uint16_t kQuarter = 0x3400;  // 0.25

template <typename Block>
std::vector<float> dequant(const Block& b) {
  std::vector<float> y(QK_K, -12345.f);
  ref::dequantize_row(BlockOf<Block>::type, &b, y.data(), QK_K);
  return y;
}

// Expects y[from + i] == want[i].
void expect_run(const std::vector<float>& y, int from, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[(size_t)from + i], want[i]) << "element " << from + i;
}
void expect_fill(const std::vector<float>& y, int from, int to, float v) {
  for (int i = from; i < to; ++i) EXPECT_EQ(y[(size_t)i], v) << "element " << i;
}

TEST(QuantBlocksIq, LayoutMatchesDtypeTable) {
  auto check = [](auto block) {
    using B = decltype(block);
    const auto tr = dtype_traits(BlockOf<B>::type);
    ASSERT_TRUE(tr.has_value());
    EXPECT_EQ(tr->block_size, (uint32_t)QK_K) << tr->name;
    EXPECT_EQ(tr->type_size, sizeof(B)) << tr->name;
    EXPECT_TRUE(tr->supported) << tr->name;
    EXPECT_TRUE(ref::can_dequantize(BlockOf<B>::type)) << tr->name;
  };
  check(block_iq2_xxs{}); check(block_iq2_xs{}); check(block_iq2_s{}); check(block_iq3_xxs{});
  check(block_iq3_s{}); check(block_iq1_s{}); check(block_iq1_m{}); check(block_tq1_0{}); check(block_tq2_0{});
  EXPECT_EQ(dtype_from_name("IQ2_XXS"), DType::iq2_xxs);
  EXPECT_EQ(dtype_from_name("tq2_0"), DType::tq2_0);
}

TEST(QuantBlocksIq, GridsMatchGgmlTables) {
  EXPECT_EQ(iq2xxs_grid()[0], 0x0808080808080808ull);
  EXPECT_EQ(iq2xxs_grid()[1], 0x080808080808082bull);
  EXPECT_EQ(iq2xxs_grid()[85], 0x0819081919192b2bull);
  EXPECT_EQ(iq2xxs_grid()[255], 0x2b2b2b1908081908ull);
  EXPECT_EQ(iq2xs_grid()[170], 0x0819082b08190808ull);
  EXPECT_EQ(iq2xs_grid()[511], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(iq2s_grid()[341], 0x08192b080808192bull);
  EXPECT_EQ(iq2s_grid()[1023], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(iq3xxs_grid()[1], 0x04040414u);
  EXPECT_EQ(iq3xxs_grid()[85], 0x0c1c2434u);
  EXPECT_EQ(iq3xxs_grid()[255], 0x3e341c04u);
  EXPECT_EQ(iq3s_grid()[170], 0x03090707u);
  EXPECT_EQ(iq3s_grid()[511], 0x0f0f0101u);
  EXPECT_EQ(iq1s_grid()[0], 0xffffffffffffffffull);
  EXPECT_EQ(iq1s_grid()[1], 0xffffffffffffff01ull);
  EXPECT_EQ(iq1s_grid()[682], 0x00ffff01ff000001ull);
  EXPECT_EQ(iq1s_grid()[2047], 0x0101010101010101ull);
  // Sign bytes: 7 bits plus even parity.
  EXPECT_EQ(iq_sign_byte(0), 0x00);
  EXPECT_EQ(iq_sign_byte(1), 0x81);
  EXPECT_EQ(iq_sign_byte(3), 0x03);
  EXPECT_EQ(iq_sign_byte(127), 0xFF);
}

TEST(QuantBlocksIq, IQ2_XXS) {
  block_iq2_xxs b{};
  b.d = kH1;
  // Sub-block 0: groups = grid entries 0, 1, 0, 255; sign fields 0, 1, 0, 3;
  // scale 3: db = (0.5 + 3) / 4 = 0.875.
  const uint32_t a = 0u | 1u << 8 | 0u << 16 | 255u << 24;
  const uint32_t s = 3u << 28 | 1u << 7 | 3u << 21;
  b.qs[0] = (uint16_t)a; b.qs[1] = (uint16_t)(a >> 16);
  b.qs[2] = (uint16_t)s; b.qs[3] = (uint16_t)(s >> 16);
  const auto y = dequant(b);
  expect_fill(y, 0, 8, 7.0f);                                          // 0.875 * 8
  expect_run(y, 8, {-37.625f, 7, 7, 7, 7, 7, 7, -7});                   // sign 0x81
  expect_fill(y, 16, 24, 7.0f);
  expect_run(y, 24, {-7, -21.875f, 7, 7, 21.875f, 37.625f, 37.625f, 37.625f});  // sign 0x03
  expect_fill(y, 32, 256, 1.0f);                                       // scale 0: 0.125 * 8
}

TEST(QuantBlocksIq, IQ2_XS) {
  block_iq2_xs b{};
  b.d = kHalf;
  b.qs[0] = 1 | 1 << 9;        // grid 1, sign 0x81
  b.qs[1] = 511;               // all 43
  b.qs[2] = 170 | 127 << 9;    // grid 170, sign 0xFF
  b.scales[0] = 0x21;          // groups 0-1: 0.5 * 1.5 / 4 = 0.1875; 2-3: 0.5 * 2.5 / 4 = 0.3125
  const auto y = dequant(b);
  expect_run(y, 0, {-8.0625f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, -1.5f});
  expect_fill(y, 8, 16, 8.0625f);
  expect_run(y, 16, {-2.5f, -2.5f, -7.8125f, -2.5f, -13.4375f, -2.5f, -7.8125f, -2.5f});
  expect_fill(y, 24, 32, 2.5f);
  expect_fill(y, 32, 256, 0.5f);  // 0.5 * 0.5 / 4 * 8
}

TEST(QuantBlocksIq, IQ2_S) {
  block_iq2_s b{};
  b.d = kH1;
  b.qs[0] = 1;                 // grid 1
  b.qs[1] = 0x55;              // + qh bits 2-3 = 1: grid 341
  b.qs[3] = 0xFF;              // + qh bits 6-7 = 3: grid 1023
  b.qh[0] = 1 << 2 | 3 << 6;
  b.qs[32] = 0x01; b.qs[34] = 0x80; b.qs[35] = 0xFF;  // sign bytes
  b.scales[0] = 0x30;          // groups 0-1: 0.125; 2-3: 3.5 / 4 = 0.875
  const auto y = dequant(b);
  expect_run(y, 0, {-5.375f, 1, 1, 1, 1, 1, 1, 1});
  expect_run(y, 8, {5.375f, 3.125f, 1, 1, 1, 5.375f, 3.125f, 1});
  expect_run(y, 16, {7, 7, 7, 7, 7, 7, 7, -7});
  expect_fill(y, 24, 32, -37.625f);
  expect_fill(y, 32, 256, 1.0f);
}

TEST(QuantBlocksIq, IQ3_XXS) {
  block_iq3_xxs b{};
  b.d = kH1;
  b.qs[0] = 0; b.qs[1] = 1; b.qs[2] = 85; b.qs[3] = 255;  // group 0: grids 0, 1; group 1: 85, 255
  const uint32_t w = 1u << 28 | 1u | 64u << 7;  // scale 1: (0.5 + 1) / 2 = 0.75; signs 0x81, 0xC0
  std::memcpy(b.qs + 64, &w, 4);
  const auto y = dequant(b);
  expect_run(y, 0, {-3, 3, 3, 3, 15, 3, 3, -3});
  expect_run(y, 8, {39, 27, 21, 9, 3, 21, -39, -46.5f});
  expect_fill(y, 16, 32, 3.0f);
  expect_fill(y, 32, 256, 1.0f);  // scale 0: 0.25 * 4
}

TEST(QuantBlocksIq, IQ3_S) {
  block_iq3_s b{};
  b.d = kHalf;
  b.qs[0] = 1; b.qs[1] = 0xFF; b.qh[0] = 0x02;  // group 0: grids 1, 511
  b.qs[2] = 170;                                // group 1: grids 170, 0
  b.signs[0] = 0x10; b.signs[1] = 0x01;
  b.scales[0] = 0x21;  // sub-block 0: 0.5 * 3 = 1.5; sub-block 1: 0.5 * 5 = 2.5
  const auto y = dequant(b);
  expect_run(y, 0, {4.5f, 1.5f, 1.5f, 1.5f, -1.5f, 1.5f, 22.5f, 22.5f});
  expect_run(y, 8, {-10.5f, 10.5f, 13.5f, 4.5f, 1.5f, 1.5f, 1.5f, 1.5f});
  expect_fill(y, 16, 32, 1.5f);
  expect_fill(y, 32, 64, 2.5f);
  expect_fill(y, 64, 256, 0.5f);
}

TEST(QuantBlocksIq, IQ1_S) {
  block_iq1_s b{};
  b.d = kQuarter;
  b.qs[0] = 0; b.qs[1] = 1; b.qs[2] = 0xAA; b.qs[3] = 0xFF;
  b.qh[0] = 2 << 6 | 7 << 9 | 2 << 12;  // groups 2, 3: grids 682, 2047; scale 2: 0.25 * 5 = 1.25; delta +1/8
  b.qh[1] = 0x8000;                     // scale 0, delta -1/8
  const auto y = dequant(b);
  expect_fill(y, 0, 8, -1.09375f);  // 1.25 * (-1 + 0.125)
  expect_run(y, 8, {1.40625f, -1.09375f, -1.09375f, -1.09375f, -1.09375f, -1.09375f, -1.09375f, -1.09375f});
  expect_run(y, 16, {1.40625f, 0.15625f, 0.15625f, -1.09375f, 1.40625f, -1.09375f, -1.09375f, 0.15625f});
  expect_fill(y, 24, 32, 1.40625f);
  expect_fill(y, 32, 64, -0.28125f);  // 0.25 * (-1 - 0.125)
  expect_fill(y, 64, 256, -0.21875f);
}

TEST(QuantBlocksIq, IQ1_M) {
  block_iq1_m b{};
  // Super-scale 0.5 (F16 0x3800) in the top nibbles of the scale words:
  // w2 >> 12 = 8, w3 >> 12 = 3. Sub-block 0: scale 1 (groups 0-1), 2 (2-3).
  const uint16_t w[4] = {0x0011, 0x0000, 0x8000, 0x3000};
  std::memcpy(b.scales, w, 8);
  b.qs[0] = 1; b.qs[1] = 0; b.qs[2] = 0xAA; b.qs[3] = 0xFF;
  b.qh[0] = 0x08;                      // group 0: delta -; group 1: +
  b.qh[1] = 0x02 | 7 << 4 | 0x80;      // group 2: grid 682, +; group 3: grid 2047, -
  const auto y = dequant(b);
  expect_run(y, 0, {1.3125f, -1.6875f, -1.6875f, -1.6875f, -1.6875f, -1.6875f, -1.6875f, -1.6875f});
  expect_fill(y, 8, 16, -1.3125f);
  expect_run(y, 16, {2.8125f, 0.3125f, 0.3125f, -2.1875f, 2.8125f, -2.1875f, -2.1875f, 0.3125f});
  expect_fill(y, 24, 32, 2.1875f);
  expect_fill(y, 32, 256, -0.4375f);  // 0.5 * (-1 + 0.125)
}

TEST(QuantBlocksIq, TQ1_0) {
  block_tq1_0 b{};
  b.d = kH2;
  b.qs[0] = 207;   // trits 2 1 0 2 1 (196 = 2*81 + 27 + 2*3 + 1, as 207 = ceil(196 * 256 / 243))
  b.qs[32] = 207;
  b.qh[0] = 70;    // trits 0 2 1 1 (22 * 3 = 66 -> ceil(66 * 256 / 243) = 70)
  const auto y = dequant(b);
  std::vector<float> want(QK_K, -2.0f);  // trit 0 everywhere else
  const float t[5] = {2, 0, -2, 2, 0};
  for (int n = 0; n < 5; ++n) want[32 * n] = t[n], want[160 + 16 * n] = t[n];
  want[240] = -2; want[244] = 2; want[248] = 0; want[252] = 0;
  expect_run(y, 0, want);
}

TEST(QuantBlocksIq, TQ2_0) {
  block_tq2_0 b{};
  b.d = kHalf;
  b.qs[0] = 0xE4;   // 2-bit fields 0, 1, 2, 3 -> elements 0, 32, 64, 96
  b.qs[33] = 0x02;  // element 129: 2; element 161: 0
  const auto y = dequant(b);
  std::vector<float> want(QK_K, -0.5f);
  want[32] = 0; want[64] = 0.5f; want[96] = 1.0f; want[129] = 0.5f;
  expect_run(y, 0, want);
}

}  // namespace
}  // namespace serval
