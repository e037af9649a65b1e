// kernels::lora_row against the update computed in double, on shapes that
// exercise every path (ranks past a multiple of 16, columns past a multiple
// of 4, outputs past a multiple of 64), and its determinism: the same row
// gives the same bytes whatever else is computed around it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "kernels/lora.h"

using namespace serval;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST(LoraRow, MatchesTheUpdateInDouble) {
  for (const auto& [rank, cols, rows] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16, 256, 128}, {19, 203, 150}, {3, 64, 64}, {32, 130, 70}, {1, 5, 1}}) {
    const auto at = randn((size_t)(cols * rank), 1, 0.1f), bt = randn((size_t)(rank * rows), 2, 0.1f);
    const auto x = randn((size_t)cols, 3, 1.0f), y0 = randn((size_t)rows, 4, 1.0f);
    const float scale = 1.5f;
    std::vector<float> y = y0, t((size_t)rank);
    kernels::lora_row(at.data(), bt.data(), rank, cols, rows, scale, x.data(), y.data(), t.data());
    for (int64_t j = 0; j < rows; ++j) {
      double want = y0[(size_t)j];
      for (int64_t k = 0; k < rank; ++k) {
        double tk = 0;
        for (int64_t i = 0; i < cols; ++i) tk += (double)at[(size_t)(i * rank + k)] * x[(size_t)i];
        want += scale * tk * bt[(size_t)kernels::lora_b_index(k, j, rank, rows)];
      }
      EXPECT_NEAR(y[(size_t)j], want, 1e-4 * (1 + std::abs(want))) << rank << "x" << cols << "x" << rows << " j " << j;
    }
    // The same inputs again, with other work in between: the same bytes.
    std::vector<float> y2 = y0, junk = y0;
    kernels::lora_row(bt.data(), at.data(), 1, rows, 1, 0.5f, y0.data(), junk.data(), t.data());
    kernels::lora_row(at.data(), bt.data(), rank, cols, rows, scale, x.data(), y2.data(), t.data());
    EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0);
  }
}

// F16 A and B: the same bytes as the F32 kernel on the widened values.
TEST(LoraRow, F16EqualsF32OnTheWidenedValues) {
  for (const auto& [rank, cols, rows] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16, 256, 128}, {19, 203, 150}, {3, 64, 64}, {32, 130, 70}, {48, 70, 200}, {1, 5, 1}}) {
    auto at = randn((size_t)(cols * rank), 5, 0.1f), bt = randn((size_t)(rank * rows), 6, 0.1f);
    std::vector<uint16_t> at16(at.size()), bt16(bt.size());
    for (size_t i = 0; i < at.size(); ++i) at[i] = fp16_to_fp32(at16[i] = fp32_to_fp16(at[i]));
    for (size_t i = 0; i < bt.size(); ++i) bt[i] = fp16_to_fp32(bt16[i] = fp32_to_fp16(bt[i]));
    const auto x = randn((size_t)cols, 7, 1.0f), y0 = randn((size_t)rows, 8, 1.0f);
    std::vector<float> y32 = y0, y16 = y0, t((size_t)rank);
    kernels::lora_row(at.data(), bt.data(), rank, cols, rows, 0.75f, x.data(), y32.data(), t.data());
    kernels::lora_row_f16(at16.data(), bt16.data(), rank, cols, rows, 0.75f, x.data(), y16.data(), t.data());
    EXPECT_EQ(std::memcmp(y32.data(), y16.data(), y32.size() * 4), 0) << rank << "x" << cols << "x" << rows;
  }
}

// Several rows of one adapter in one call (lora_rows / lora_rows_f16, any
// count, groups of kLoraGroupRows inside): each row gets exactly the bytes it
// gets alone from lora_row.
TEST(LoraRow, GroupedRowsEqualEachRowAlone) {
  for (const auto& [rank, cols, rows] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16, 256, 128}, {19, 203, 150}, {32, 130, 70}, {8, 64, 192}}) {
    auto at = randn((size_t)(cols * rank), 11, 0.1f), bt = randn((size_t)(rank * rows), 12, 0.1f);
    std::vector<uint16_t> at16(at.size()), bt16(bt.size());
    for (size_t i = 0; i < at.size(); ++i) at[i] = fp16_to_fp32(at16[i] = fp32_to_fp16(at[i]));
    for (size_t i = 0; i < bt.size(); ++i) bt[i] = fp16_to_fp32(bt16[i] = fp32_to_fp16(bt[i]));
    for (int n : {1, 2, 3, 4, 5, 9}) {
      const auto x = randn((size_t)(n * cols), 13 + n, 1.0f), y0 = randn((size_t)(n * rows), 14 + n, 1.0f);
      for (bool f16 : {false, true}) {
        std::vector<float> alone = y0, grouped = y0, t((size_t)(rank * kernels::kLoraGroupRows));
        std::vector<const float*> xs;
        std::vector<float*> ys;
        for (int r = 0; r < n; ++r) {
          const float* xr = x.data() + r * cols;
          if (f16)
            kernels::lora_row_f16(at16.data(), bt16.data(), rank, cols, rows, 0.5f, xr, alone.data() + r * rows, t.data());
          else
            kernels::lora_row(at.data(), bt.data(), rank, cols, rows, 0.5f, xr, alone.data() + r * rows, t.data());
          xs.push_back(xr);
          ys.push_back(grouped.data() + r * rows);
        }
        if (f16)
          kernels::lora_rows_f16(at16.data(), bt16.data(), rank, cols, rows, 0.5f, xs.data(), ys.data(), n, t.data());
        else
          kernels::lora_rows(at.data(), bt.data(), rank, cols, rows, 0.5f, xs.data(), ys.data(), n, t.data());
        EXPECT_EQ(std::memcmp(alone.data(), grouped.data(), alone.size() * 4), 0)
            << rank << "x" << cols << "x" << rows << " n " << n << (f16 ? " f16" : " f32");
        EXPECT_NE(std::memcmp(alone.data(), y0.data(), alone.size() * 4), 0);  // the update did something
      }
    }
  }
}
