// kernels::matmul / attention at every kernel level this CPU has (ref, avx2,
// avx512, avx512vnni, each forced with set_isa): against the scalar references
// within per-format bounds, bit-for-bit batch invariance (n = 1 / 5 / 16, other
// rows, thread counts), bit-identical results across the SIMD levels, odd
// shapes; and the ISA selection of common/cpu_features.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "common/fp16.h"
#include "common/thread_pool.h"
#include "kernels/act_quant.h"
#include "kernels/isa_levels.h"
#include "kernels/kernel_table.h"
#include "kernels/matmul.h"
#include "kernels/ref/quants.h"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"
#include "kernels/test_rng.h"

namespace serval {
namespace {

using test::Rng;

// Activation-like rows: Gaussian with a few large outliers (as hidden states
// have), a varying scale per row.
std::vector<float> activations(int64_t n, int64_t cols, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x((size_t)(n * cols));
  for (int64_t i = 0; i < n; ++i) {
    const double s = 0.2 + 2.0 * r.uniform();
    for (int64_t j = 0; j < cols; ++j) {
      double v = s * r.normal();
      if (r.uniform() < 0.01) v *= 10;
      x[(size_t)(i * cols + j)] = (float)v;
    }
  }
  return x;
}

struct Weights {
  DType t;
  int64_t rows, cols;
  size_t stride;
  std::vector<uint8_t> data;
  std::vector<float> deq;  // [rows, cols] the exact values the format encodes
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  Weights w{t, rows, cols, row_size(t, cols), {}, {}};
  w.data.resize(w.stride * (size_t)rows);
  w.deq.resize((size_t)(rows * cols));
  Rng r(seed);
  std::vector<float> src((size_t)cols);
  for (int64_t i = 0; i < rows; ++i) {
    const double s = 0.01 + 0.05 * r.uniform();
    for (auto& v : src) v = (float)(s * r.normal());
    ref::quantize_row(t, src.data(), w.data.data() + (size_t)i * w.stride, cols);
    ref::dequantize_row(t, w.data.data() + (size_t)i * w.stride, w.deq.data() + i * cols, cols);
  }
  return w;
}

// Random bytes in every quant field, with sane F16 scales patched in: covers
// the whole range of each format (e.g. Q8_0's -128, any packed scale bits),
// which the quantizer never writes, and is fast to make.
Weights random_weights(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  Weights w{t, rows, cols, row_size(t, cols), {}, {}};
  w.data.resize(w.stride * (size_t)rows);
  w.deq.resize((size_t)(rows * cols));
  Rng r(seed);
  auto f16 = [&](double lo, double hi) { return fp32_to_fp16((float)(lo + (hi - lo) * r.uniform())); };
  auto put16 = [&](uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); };
  const auto tr = *dtype_traits(t);
  for (auto& b : w.data) b = (uint8_t)r.next();
  for (int64_t i = 0; i < rows; ++i) {
    uint8_t* row = w.data.data() + (size_t)i * w.stride;
    for (int64_t b = 0; b < cols / tr.block_size; ++b) {
      uint8_t* blk = row + (size_t)b * tr.type_size;
      switch (t) {
        case DType::q4_0: case DType::q8_0: case DType::iq4_nl: case DType::q5_0: put16(blk, f16(-0.02, 0.02)); break;
        case DType::mxfp4: blk[0] = (uint8_t)(112 + r.next() % 16); break;  // scales 2^-16 .. 2^-1
        case DType::q4_1: case DType::q5_1: put16(blk, f16(-0.02, 0.02)); put16(blk + 2, f16(-0.3, 0.3)); break;
        case DType::q4_k: case DType::q5_k: put16(blk, f16(0.0, 0.002)); put16(blk + 2, f16(0.0, 0.002)); break;
        case DType::q6_k: put16(blk + 208, f16(-0.001, 0.001)); break;
        case DType::q3_k: put16(blk + 108, f16(-0.002, 0.002)); break;
        case DType::iq4_xs: put16(blk, f16(-0.0005, 0.0005)); break;
        case DType::q2_k: put16(blk + 80, f16(0.0, 0.004)); put16(blk + 82, f16(0.0, 0.004)); break;
        case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s:
        case DType::iq1_s:
          put16(blk, f16(-0.002, 0.002));
          break;
        case DType::iq1_m: {  // the F16 super-scale sits in the top nibbles of the 4 scale words
          const uint16_t d = f16(-0.002, 0.002);
          for (int k = 0; k < 4; ++k) {
            uint16_t w16;
            std::memcpy(&w16, blk + 48 + 2 * k, 2);
            put16(blk + 48 + 2 * k, (uint16_t)((w16 & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12));
          }
          break;
        }
        case DType::tq1_0: put16(blk + 52, f16(-0.02, 0.02)); break;
        case DType::tq2_0: put16(blk + 64, f16(-0.02, 0.02)); break;
        case DType::f16: put16(blk, f16(-1, 1)); break;
        case DType::bf16: put16(blk, fp32_to_bf16((float)(2 * r.uniform() - 1))); break;
        case DType::f32: {
          const float v = (float)(2 * r.uniform() - 1);
          std::memcpy(blk, &v, 4);
          break;
        }
        default: break;
      }
    }
    ref::dequantize_row(t, row, w.deq.data() + i * cols, cols);
  }
  return w;
}

std::vector<float> run(const Weights& w, const std::vector<float>& x, int64_t n, ThreadPool* pool = nullptr) {
  std::vector<float> y((size_t)(n * w.rows), -1.0f);
  kernels::matmul(w.t, w.data.data(), w.rows, w.cols, x.data(), n, y.data(), pool);
  return y;
}

const DType kFastTypes[] = {DType::q4_0, DType::q8_0, DType::iq4_nl, DType::q4_1, DType::q5_0, DType::q5_1,
                            DType::q2_k, DType::q3_k, DType::q4_k,   DType::q5_k, DType::q6_k, DType::iq4_xs,
                            DType::f16,  DType::bf16, DType::f32};

int64_t act_block(DType t) {
  switch (t) {
    case DType::q4_0: case DType::q8_0: case DType::iq4_nl: case DType::q4_1: case DType::q5_0: case DType::q5_1:
    case DType::mxfp4:
      return 32;
    case DType::q2_k: case DType::q3_k: case DType::q4_k: case DType::q5_k: case DType::q6_k: case DType::iq4_xs:
    case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s:
    case DType::iq1_s: case DType::iq1_m: case DType::tq1_0: case DType::tq2_0:
      return 256;
    default: return 0;  // F32 activations
  }
}

// Columns for a type: a multiple of its block size; `odd` gives an odd number
// of 32-blocks (the half-pair tail) or a float tail.
int64_t cols_for(DType t, bool odd) {
  const int64_t bs = dtype_traits(t)->block_size;
  if (bs == 256) return odd ? 256 : 768;
  if (bs == 32) return odd ? 800 : 512;
  return odd ? 803 : 512;
}

// The levels this machine runs, each forced in turn; restores the level after.
class KernelLevels : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = kernels::active_isa(); }
  void TearDown() override { kernels::set_isa(saved_); }
  static std::vector<Isa> levels() { return test::available_isa_levels(); }
  static std::vector<Isa> simd_levels() {
    auto v = levels();
    v.erase(v.begin());
    return v;
  }

 private:
  Isa saved_ = Isa::ref;
};

// |y - exact| bound for one output. With 8-bit activations (SIMD levels,
// quantized weights) each activation block of B elements is rounded to a grid of
// step amax/127, so |x - x~| <= amax/254 per element and the dot moves by at
// most sum_blocks amax_b/254 * sum_{j in b} |w_j|; the rest is F32 rounding of
// the accumulation (cols terms, relative 2^-24 each, well under 1e-5 * sum|w x|
// for these sizes).
double bound(const Weights& w, const float* x, int64_t r, bool quantized_act) {
  const float* wr = w.deq.data() + r * w.cols;
  double l1 = 0;
  for (int64_t j = 0; j < w.cols; ++j) l1 += std::fabs((double)wr[j] * x[j]);
  double b = 1e-5 * l1 + 1e-7;
  const int64_t bs = act_block(w.t);
  if (quantized_act && bs > 0) {
    for (int64_t b0 = 0; b0 < w.cols; b0 += bs) {
      double amax = 0, wl1 = 0;
      for (int64_t j = b0; j < b0 + bs; ++j) {
        amax = std::max(amax, (double)std::fabs(x[j]));
        wl1 += std::fabs(wr[j]);
      }
      // + the F16-rounded stored scale of 32-blocks (act_quant.h): relative
      // 2^-11 on the block's whole contribution, <= amax * wl1 * 2^-11.
      b += amax / 254.0 * wl1 * 1.001 + (bs == 32 ? amax * wl1 * 0x1p-11 : 0.0);
    }
  }
  return b;
}

// The dot the SIMD levels compute, in double: the dequantized weights against
// the activations as act_quant.h quantizes them (q * stored scale). The kernels
// take exact integer block sums and a handful of float roundings per block on
// top, so they land within ~1e-6 of sum |w_j x~_j| of this.
struct ModelDot {
  double value = 0, l1 = 0;
};
ModelDot quantized_model_dot(const Weights& w, const float* x, int64_t r) {
  const float* wr = w.deq.data() + r * w.cols;
  const int64_t bs = act_block(w.t);
  std::vector<float> xq((size_t)w.cols);
  if (bs == 32) {
    std::vector<uint8_t> buf(kernels::detail::act_q8_32_row_bytes(w.cols));
    kernels::detail::quantize_act_q8_32(x, w.cols, 0, buf.data());
    for (int64_t j = 0; j < w.cols; ++j) {
      const uint8_t* u = buf.data() + (j / 64) * kernels::detail::kActQ8_32PairBytes;
      float d;
      std::memcpy(&d, u + 128 + 4 * (8 * ((j % 64) / 32)), 4);
      xq[(size_t)j] = d * (float)(int8_t)u[j % 64];
    }
  } else {
    std::vector<uint8_t> buf(kernels::detail::act_q8_k_row_bytes(w.cols));
    kernels::detail::quantize_act_q8_k(x, w.cols, buf.data());
    for (int64_t j = 0; j < w.cols; ++j) {
      const uint8_t* u = buf.data() + (j / 256) * kernels::detail::kActQ8_KBlockBytes;
      float d;
      std::memcpy(&d, u + 304, 4);
      xq[(size_t)j] = d * (float)(int8_t)u[j % 256];
    }
  }
  ModelDot m;
  for (int64_t j = 0; j < w.cols; ++j) {
    m.value += (double)wr[j] * xq[(size_t)j];
    m.l1 += std::fabs((double)wr[j] * xq[(size_t)j]);
  }
  return m;
}

// Every output within bound() of the exact dot; at SIMD levels with quantized
// weights also within 1e-6 * sum|w x~| of quantized_model_dot() (the error is
// exactly the activation rounding the format implies, nothing else).
// *worst_ratio: max |err| / bound.
void check_against_ref(const Weights& w, const std::vector<float>& x, int64_t n, const std::vector<float>& y, Isa isa,
                       double* worst_ratio) {
  const bool qact = isa != Isa::ref && act_block(w.t) > 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* xi = x.data() + i * w.cols;
      const double want = ref::dot_row(w.t, w.data.data() + (size_t)r * w.stride, xi, w.cols);
      const double got = y[(size_t)(i * w.rows + r)];
      const double b = bound(w, xi, r, qact);
      ASSERT_LE(std::fabs(got - want), b) << dtype_name(w.t) << " at " << isa_name(isa) << " row " << r << " act "
                                          << i << ": got " << got << " want " << want;
      *worst_ratio = std::max(*worst_ratio, std::fabs(got - want) / b);
      if (qact) {
        const ModelDot m = quantized_model_dot(w, xi, r);
        ASSERT_LE(std::fabs(got - m.value), 1e-6 * m.l1 + 1e-30)
            << dtype_name(w.t) << " at " << isa_name(isa) << " row " << r << " act " << i << ": got " << got
            << " model " << m.value;
      }
    }
  }
}

TEST_F(KernelLevels, LevelsAvailable) {
  const auto lv = levels();
  ASSERT_FALSE(lv.empty());
  EXPECT_EQ(lv[0], Isa::ref);
  std::string names;
  for (Isa i : lv) names += std::string(isa_name(i)) + " ";
  std::printf("kernel levels on this CPU: %s(default %s)\n", names.c_str(), isa_name(selected_isa()));
}

TEST_F(KernelLevels, MatchesReferenceWithinFormatBound) {
  for (Isa isa : levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (DType t : kFastTypes) {
      for (bool odd : {false, true}) {
        const int64_t cols = cols_for(t, odd);
        const Weights w = make_weights(t, 37, cols, 11 + (uint64_t)t);
        const auto x = activations(5, cols, 7);
        EXPECT_EQ(kernels::has_fast_matmul(t), isa != Isa::ref) << dtype_name(t);
        const auto y = run(w, x, 5);
        double worst = 0;
        check_against_ref(w, x, 5, y, isa, &worst);
        if (HasFatalFailure()) return;
        // The bound is not vacuous: with 8-bit activations the error uses a fair
        // part of it.
        if (isa != Isa::ref && act_block(t) > 0) {
          EXPECT_GT(worst, 0.02) << dtype_name(t);
        }
        if (!odd) {
          std::printf("  %-10s %-7s max |err| / bound = %.3f\n", isa_name(isa), std::string(dtype_name(t)).c_str(),
                      worst);
        }
      }
    }
  }
}

TEST_F(KernelLevels, BatchInvariantBitForBit) {
  ThreadPool pool2(2), pool3(3);
  for (DType t : kFastTypes) {
    for (bool odd : {false, true}) {
      const int64_t cols = cols_for(t, odd), rows = 45;
      const Weights w = make_weights(t, rows, cols, 3 + (uint64_t)t);
      const auto x = activations(16, cols, 21);
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        const auto y16 = run(w, x, 16);
        // The same with 2 and 3 threads.
        EXPECT_EQ(run(w, x, 16, &pool2), y16) << dtype_name(t) << " " << isa_name(isa);
        EXPECT_EQ(run(w, x, 16, &pool3), y16) << dtype_name(t) << " " << isa_name(isa);
        const auto others = activations(4, cols, 99);
        for (int64_t i : {0, 3, 15}) {
          const float* xi = x.data() + i * cols;
          // Alone.
          std::vector<float> x1(xi, xi + cols);
          const auto y1 = run(w, x1, 1);
          EXPECT_EQ(std::memcmp(y1.data(), y16.data() + i * rows, (size_t)rows * 4), 0)
              << dtype_name(t) << " " << isa_name(isa) << " n=1 row " << i;
          // Third of five, among other rows.
          std::vector<float> x5(others.begin(), others.begin() + 2 * cols);
          x5.insert(x5.end(), xi, xi + cols);
          x5.insert(x5.end(), others.begin() + 2 * cols, others.end());
          const auto y5 = run(w, x5, 5, &pool2);
          EXPECT_EQ(std::memcmp(y5.data() + 2 * rows, y16.data() + i * rows, (size_t)rows * 4), 0)
              << dtype_name(t) << " " << isa_name(isa) << " n=5 row " << i;
        }
      }
    }
  }
}

TEST_F(KernelLevels, GemvThreadSplitInvariant) {
  // Enough rows that n = 1 really splits across threads.
  ThreadPool pool2(2);
  for (DType t : kFastTypes) {
    const int64_t cols = 2048, rows = 300;
    const Weights w = random_weights(t, rows, cols, 8);
    const auto x = activations(1, cols, 4);
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      EXPECT_EQ(run(w, x, 1, &pool2), run(w, x, 1)) << dtype_name(t) << " " << isa_name(isa);
    }
  }
}

TEST_F(KernelLevels, SimdLevelsBitIdentical) {
  const auto lv = simd_levels();
  if (lv.size() < 2) GTEST_SKIP() << "fewer than two SIMD levels on this CPU";
  for (DType t : kFastTypes) {
    for (bool odd : {false, true}) {
      const int64_t cols = cols_for(t, odd);
      const Weights w = make_weights(t, 29, cols, 17);
      const auto x = activations(7, cols, 23);
      kernels::set_isa(lv[0]);
      const auto want = run(w, x, 7);
      for (size_t k = 1; k < lv.size(); ++k) {
        kernels::set_isa(lv[k]);
        EXPECT_EQ(run(w, x, 7), want) << dtype_name(t) << ": " << isa_name(lv[k]) << " vs " << isa_name(lv[0]);
      }
    }
  }
}

// The AVX-VNNI table (VEX vpdpbusd) against plain AVX2, stored and packed
// weights, random bytes in every quant field (e.g. Q8_0's -128).
TEST_F(KernelLevels, AvxVnniMatchesAvx2BitForBit) {
  if (!isa_supported(Isa::avx2vnni, cpu_features())) GTEST_SKIP() << "this CPU lacks AVX-VNNI (avxvnni)";
  for (DType t : kFastTypes) {
    const int64_t cols = cols_for(t, true);
    const Weights w = random_weights(t, 35, cols, 41);
    const auto x = activations(9, cols, 43);
    ASSERT_EQ(kernels::set_isa(Isa::avx2), Isa::avx2);
    const auto want = run(w, x, 9);
    std::vector<float> want_packed;
    std::unique_ptr<kernels::PackedMatrix> p;
    if (kernels::PackedMatrix::packable(t)) {
      p = std::make_unique<kernels::PackedMatrix>(kernels::PackedMatrix::pack(t, w.data.data(), w.rows, w.cols));
      want_packed.resize((size_t)(9 * w.rows));
      kernels::matmul(*p, x.data(), 9, want_packed.data(), nullptr);
    }
    ASSERT_EQ(kernels::set_isa(Isa::avx2vnni), Isa::avx2vnni);
    EXPECT_EQ(run(w, x, 9), want) << dtype_name(t);
    if (p) {
      std::vector<float> y(want_packed.size());
      kernels::matmul(*p, x.data(), 9, y.data(), nullptr);
      EXPECT_EQ(y, want_packed) << dtype_name(t) << " packed";
    }
  }
}

TEST_F(KernelLevels, RandomBlocksMatchReferenceAndAcrossLevels) {
  for (DType t : kFastTypes) {
    for (bool odd : {false, true}) {
      const int64_t cols = cols_for(t, odd);
      const Weights w = random_weights(t, 21, cols, 77 + (uint64_t)t);
      const auto x = activations(5, cols, 13);
      std::vector<float> first;
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        const auto y = run(w, x, 5);
        double worst = 0;
        check_against_ref(w, x, 5, y, isa, &worst);
        if (HasFatalFailure()) return;
        if (isa == Isa::ref) continue;
        if (first.empty()) first = y;
        else EXPECT_EQ(y, first) << dtype_name(t) << " " << isa_name(isa);
        // Batch invariance on these blocks too.
        std::vector<float> x1(x.begin() + 2 * cols, x.begin() + 3 * cols);
        const auto y1 = run(w, x1, 1);
        EXPECT_EQ(std::memcmp(y1.data(), y.data() + 2 * w.rows, (size_t)w.rows * 4), 0) << dtype_name(t);
      }
    }
  }
}

// The lattice (IQ1/IQ2/IQ3) and ternary (TQ) types, read from files but not
// written by serval's quantizer: random bytes in every field (every grid
// index, sign and scale). Every level within the format bound of the exact
// dot and within 1e-6 of the quantized-activation model; the SIMD levels bit
// for bit alike; each row's result the same alone, among 16 and over 1, 2 or
// 3 threads.
const DType kIqTypes[] = {DType::iq2_xxs, DType::iq2_xs, DType::iq2_s, DType::iq3_xxs, DType::iq3_s,
                          DType::iq1_s,   DType::iq1_m,  DType::tq1_0, DType::tq2_0};

TEST_F(KernelLevels, IqTypesMatchReferenceAndAreBatchInvariant) {
  ThreadPool pool2(2), pool3(3);
  for (DType t : kIqTypes) {
    const int64_t cols = 768, rows = 37;
    const Weights w = random_weights(t, rows, cols, 5 + (uint64_t)t);
    const auto x = activations(16, cols, 19);
    std::vector<float> first;
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      EXPECT_EQ(kernels::has_fast_matmul(t), isa != Isa::ref) << dtype_name(t);
      const auto y = run(w, x, 16);
      double worst = 0;
      check_against_ref(w, x, 16, y, isa, &worst);
      if (HasFatalFailure()) return;
      if (isa == Isa::ref) continue;
      EXPECT_GT(worst, 0.02) << dtype_name(t);  // the activation rounding shows: the bound is not vacuous
      std::printf("  %-10s %-7s max |err| / bound = %.3f\n", isa_name(isa), std::string(dtype_name(t)).c_str(), worst);
      if (first.empty()) first = y;
      else EXPECT_EQ(y, first) << dtype_name(t) << " " << isa_name(isa);
      EXPECT_EQ(run(w, x, 16, &pool2), y) << dtype_name(t) << " " << isa_name(isa);
      EXPECT_EQ(run(w, x, 16, &pool3), y) << dtype_name(t) << " " << isa_name(isa);
      for (int64_t i : {0, 7, 15}) {
        std::vector<float> x1(x.begin() + i * cols, x.begin() + (i + 1) * cols);
        const auto y1 = run(w, x1, 1);
        EXPECT_EQ(std::memcmp(y1.data(), y.data() + i * rows, (size_t)rows * 4), 0)
            << dtype_name(t) << " " << isa_name(isa) << " n=1 row " << i;
        std::vector<float> x3(x.begin() + 3 * cols, x.begin() + 5 * cols);
        x3.insert(x3.end(), x1.begin(), x1.end());
        const auto y3 = run(w, x3, 3, &pool2);
        EXPECT_EQ(std::memcmp(y3.data() + 2 * rows, y.data() + i * rows, (size_t)rows * 4), 0)
            << dtype_name(t) << " " << isa_name(isa) << " n=3 row " << i;
      }
    }
  }
}

TEST_F(KernelLevels, OddShapes) {
  for (DType t : kFastTypes) {
    const int64_t bs = dtype_traits(t)->block_size;
    std::vector<int64_t> col_list = bs == 1 ? std::vector<int64_t>{1, 7, 16, 17, 33} : std::vector<int64_t>{bs, 3 * bs};
    for (int64_t cols : col_list) {
      for (int64_t rows : {1, 3, 5, 13}) {
        const Weights w = make_weights(t, rows, cols, 31 + (uint64_t)(rows * cols));
        const auto x = activations(6, cols, 41);
        for (Isa isa : levels()) {
          ASSERT_EQ(kernels::set_isa(isa), isa);
          const auto y6 = run(w, x, 6);
          double worst = 0;
          check_against_ref(w, x, 6, y6, isa, &worst);
          if (HasFatalFailure()) return;
          for (int64_t i = 0; i < 6; ++i) {
            std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
            const auto y1 = run(w, xi, 1);
            EXPECT_EQ(std::memcmp(y1.data(), y6.data() + i * rows, (size_t)rows * 4), 0)
                << dtype_name(t) << " " << isa_name(isa) << " rows " << rows << " cols " << cols;
          }
        }
      }
    }
  }
}

TEST_F(KernelLevels, ZeroAndConstantActivations) {
  for (Isa isa : levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (DType t : kFastTypes) {
      const int64_t cols = cols_for(t, true);
      const Weights w = make_weights(t, 9, cols, 2);
      std::vector<float> x((size_t)(2 * cols), 0.0f);
      for (int64_t j = 0; j < cols; ++j) x[(size_t)(cols + j)] = 0.5f;
      const auto y = run(w, x, 2);
      for (int64_t r = 0; r < 9; ++r) EXPECT_EQ(y[(size_t)r], 0.0f) << dtype_name(t) << " " << isa_name(isa);
      double worst = 0;
      check_against_ref(w, x, 2, y, isa, &worst);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- attention -------------------------------------------------------------------

struct AttnCase {
  int32_t n_heads, n_kv_heads, head_dim;
  int64_t n_ctx;
};

TEST_F(KernelLevels, AttentionMatchesDoubleReference) {
  const AttnCase cases[] = {{4, 4, 64, 1}, {4, 4, 64, 37}, {8, 2, 64, 50}, {4, 1, 8, 19},
                            {2, 2, 80, 33}, {6, 3, 20, 7},  {32, 4, 64, 70}};
  const int32_t block_size = 16;
  for (const AttnCase& c : cases) {
    const int64_t kv_stride = (int64_t)c.n_kv_heads * c.head_dim;
    const int64_t n_blocks = (c.n_ctx + block_size - 1) / block_size;
    Rng rng(c.n_ctx * 31 + c.head_dim);
    // Blocks in scrambled order in one pool.
    std::vector<float> kpool((size_t)((n_blocks + 2) * block_size * kv_stride)),
        vpool((size_t)((n_blocks + 2) * block_size * kv_stride));
    for (auto& v : kpool) v = (float)rng.normal();
    for (auto& v : vpool) v = (float)rng.normal();
    std::vector<const float*> kb, vb;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t phys = (b * 5 + 1) % (n_blocks + 2);
      kb.push_back(kpool.data() + phys * block_size * kv_stride);
      vb.push_back(vpool.data() + phys * block_size * kv_stride);
    }
    std::vector<float> q((size_t)(c.n_heads * c.head_dim));
    for (auto& v : q) v = (float)rng.normal();
    const float scale = 1.0f / std::sqrt((float)c.head_dim);

    // Double-precision reference.
    std::vector<double> want(q.size());
    const int32_t group = c.n_heads / c.n_kv_heads;
    for (int32_t h = 0; h < c.n_heads; ++h) {
      const int64_t koff = (int64_t)(h / group) * c.head_dim;
      std::vector<double> s((size_t)c.n_ctx);
      double mx = -1e300;
      for (int64_t p = 0; p < c.n_ctx; ++p) {
        const float* kp = kb[(size_t)(p / block_size)] + (p % block_size) * kv_stride + koff;
        double d = 0;
        for (int32_t j = 0; j < c.head_dim; ++j) d += (double)q[(size_t)(h * c.head_dim + j)] * kp[j];
        s[(size_t)p] = d * scale;
        mx = std::max(mx, s[(size_t)p]);
      }
      double sum = 0;
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (int64_t p = 0; p < c.n_ctx; ++p) {
        const float* vp = vb[(size_t)(p / block_size)] + (p % block_size) * kv_stride + koff;
        for (int32_t j = 0; j < c.head_dim; ++j) want[(size_t)(h * c.head_dim + j)] += s[(size_t)p] / sum * vp[j];
      }
    }

    std::vector<float> first;
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      std::vector<float> out(q.size(), -7.0f), scratch((size_t)c.n_ctx);
      kernels::attention(q.data(), kb.data(), vb.data(), block_size, kv_stride, c.n_ctx, c.n_heads, c.n_kv_heads,
                         c.head_dim, scale, out.data(), scratch.data());
      // Outputs are convex combinations of N(0,1) values: an absolute bound.
      for (size_t j = 0; j < out.size(); ++j)
        ASSERT_NEAR(out[j], want[j], 2e-5) << isa_name(isa) << " heads " << c.n_heads << "/" << c.n_kv_heads
                                           << " hd " << c.head_dim << " ctx " << c.n_ctx << " at " << j;
      if (isa != Isa::ref) {
        if (first.empty()) first = out;
        else EXPECT_EQ(out, first) << isa_name(isa) << ": SIMD levels differ";
      }
    }
  }
}

// ---- activation quantization ------------------------------------------------------

TEST(ActQuant, Q8_32LayoutAndRounding) {
  const int64_t cols = 96;  // three blocks: the last pair half-empty
  auto x = activations(1, cols, 5);
  for (int j = 32; j < 64; ++j) x[(size_t)j] = 0.0f;  // an all-zero block
  std::vector<uint8_t> buf(kernels::detail::act_q8_32_row_bytes(cols));
  ASSERT_EQ(buf.size(), 2 * kernels::detail::kActQ8_32PairBytes);
  kernels::detail::quantize_act_q8_32(x.data(), cols, 8, buf.data());
  for (int64_t b = 0; b < 4; ++b) {
    const uint8_t* u = buf.data() + (b / 2) * kernels::detail::kActQ8_32PairBytes;
    const int h = (int)(b % 2);
    const auto* qs = reinterpret_cast<const int8_t*>(u) + 32 * h;
    int32_t corr[16];
    float d[16];
    std::memcpy(corr, u + 64, sizeof corr);
    std::memcpy(d, u + 128, sizeof d);
    double amax = 0;
    for (int j = 0; j < 32 && b < 3; ++j) amax = std::max(amax, (double)std::fabs(x[(size_t)(32 * b + j)]));
    EXPECT_EQ(d[8 * h], fp16_to_fp32(fp32_to_fp16((float)amax / 127.0f))) << b;  // F16-rounded
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(d[8 * h + k], d[8 * h]);
      EXPECT_EQ(corr[8 * h + k], -8 * (qs[4 * k] + qs[4 * k + 1] + qs[4 * k + 2] + qs[4 * k + 3]));
    }
    for (int j = 0; j < 32; ++j) {
      EXPECT_GE(qs[j], -127);
      EXPECT_LE(qs[j], 127);
      const float xv = b < 3 ? x[(size_t)(32 * b + j)] : 0.0f;
      // Rounded on the grid amax/127 (before the F16 rounding of the stored d).
      EXPECT_LE(std::fabs(xv - (float)amax / 127.0f * qs[j]), amax / 127.0 * 0.5001 + 1e-30) << b << " " << j;
    }
  }
}

TEST(ActQuant, Q8_KSums) {
  const int64_t cols = 512;
  const auto x = activations(1, cols, 6);
  std::vector<uint8_t> buf(kernels::detail::act_q8_k_row_bytes(cols));
  kernels::detail::quantize_act_q8_k(x.data(), cols, buf.data());
  for (int b = 0; b < 2; ++b) {
    const uint8_t* u = buf.data() + b * kernels::detail::kActQ8_KBlockBytes;
    const auto* qs = reinterpret_cast<const int8_t*>(u);
    int16_t s16[16], s32[8];
    std::memcpy(s16, u + 256, sizeof s16);
    std::memcpy(s32, u + 288, sizeof s32);
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += qs[16 * j + l];
      EXPECT_EQ(s16[j], s);
    }
    for (int j = 0; j < 8; ++j) EXPECT_EQ(s32[j], s16[2 * j] + s16[2 * j + 1]);
  }
}

TEST(ActQuant, SimdQuantizersMatchScalar) {
  struct Level {
    Isa isa;
    const kernels::detail::KernelTable* table;
  };
  const Level lv[] = {{Isa::avx2, kernels::detail::kernel_table_avx2()},
                      {Isa::avx2vnni, kernels::detail::kernel_table_avx2vnni()},
                      {Isa::avx512, kernels::detail::kernel_table_avx512()},
                      {Isa::avx512vnni, kernels::detail::kernel_table_avx512vnni()}};
  for (int64_t cols : {256, 512, 1280}) {
    auto x = activations(3, cols, (uint64_t)cols);
    for (int j = 0; j < 32; ++j) x[(size_t)(cols + 64 + j)] = 0.0f;      // a zero 32-block
    for (int j = 0; j < 256; ++j) x[(size_t)(2 * cols + j)] = 0.0f;      // a zero 256-block
    x[5] = 3e38f;                                                         // extreme magnitudes
    x[cols + 7] = -1e-38f;
    for (int64_t i = 0; i < 3; ++i) {
      const float* xi = x.data() + i * cols;
      for (int64_t c : {cols, cols - 32}) {  // even and odd numbers of 32-blocks
        for (int offset : {0, 8, 128}) {
          std::vector<uint8_t> want(kernels::detail::act_q8_32_row_bytes(c)), got(want.size());
          kernels::detail::quantize_act_q8_32(xi, c, offset, want.data());
          for (const Level& l : lv) {
            if (!isa_supported(l.isa, cpu_features()) || !l.table) continue;
            std::fill(got.begin(), got.end(), 0xAB);
            l.table->quantize_q8_32(xi, c, offset, got.data());
            EXPECT_EQ(got, want) << isa_name(l.isa) << " q8_32 cols " << c << " offset " << offset << " row " << i;
          }
        }
      }
      {
        std::vector<uint8_t> want(kernels::detail::act_q8_0p_row_bytes(cols)), got(want.size());
        kernels::detail::quantize_act_q8_0p(xi, cols, 8, want.data());
        for (const Level& l : lv) {
          if (!isa_supported(l.isa, cpu_features()) || !l.table) continue;
          std::fill(got.begin(), got.end(), 0xAB);
          l.table->quantize_q8_0p(xi, cols, 8, got.data());
          EXPECT_EQ(got, want) << isa_name(l.isa) << " q8_0p cols " << cols << " row " << i;
        }
      }
      std::vector<uint8_t> want(kernels::detail::act_q8_k_row_bytes(cols)), got(want.size());
      kernels::detail::quantize_act_q8_k(xi, cols, want.data());
      for (const Level& l : lv) {
        if (!isa_supported(l.isa, cpu_features()) || !l.table) continue;
        std::fill(got.begin(), got.end(), 0xAB);
        l.table->quantize_q8_k(xi, cols, got.data());
        EXPECT_EQ(got, want) << isa_name(l.isa) << " q8_k cols " << cols << " row " << i;
      }
    }
  }
}

// ---- packed Q4_0 / Q8_0 / Q4_K / Q6_K / F16 / BF16 (kernels::PackedMatrix) ---------

const DType kPackedTypes[] = {DType::q4_0, DType::iq4_nl, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0,
                              DType::q2_k,  DType::q3_k,   DType::q4_k, DType::q5_k, DType::q6_k, DType::iq4_xs,
                              DType::f16,   DType::bf16,   DType::mxfp4};
bool is_affine(DType t) { return t == DType::q4_1 || t == DType::q5_1; }
bool is_k(DType t) {
  return t == DType::q2_k || t == DType::q3_k || t == DType::q4_k || t == DType::q5_k || t == DType::q6_k || t == DType::iq4_xs;
}
bool is_float16(DType t) { return t == DType::f16 || t == DType::bf16; }

// The integer weight values of 32-block b of row r by the format's definition
// (quant_blocks.h; Q4_0: nibble - 8; Q5_0: 5-bit q - 16; Q4_1 / Q5_1: q, the
// min apart; Q8_0: qs), and the F16 min of the affine ones in *m.
void block_ints(const Weights& w, int64_t r, int64_t b, int32_t out[32], uint16_t* m = nullptr) {
  const uint8_t* row = w.data.data() + (size_t)r * w.stride;
  if (w.t == DType::q4_1) {
    const auto& blk = reinterpret_cast<const block_q4_1*>(row)[b];
    for (int j = 0; j < 16; ++j) {
      out[j] = blk.qs[j] & 15;
      out[j + 16] = blk.qs[j] >> 4;
    }
    if (m) *m = blk.m;
  } else if (w.t == DType::q5_0 || w.t == DType::q5_1) {
    const uint8_t* qs = w.t == DType::q5_0 ? reinterpret_cast<const block_q5_0*>(row)[b].qs
                                           : reinterpret_cast<const block_q5_1*>(row)[b].qs;
    const uint8_t* qhb = w.t == DType::q5_0 ? reinterpret_cast<const block_q5_0*>(row)[b].qh
                                            : reinterpret_cast<const block_q5_1*>(row)[b].qh;
    uint32_t qh;
    std::memcpy(&qh, qhb, 4);
    const int off = w.t == DType::q5_0 ? 16 : 0;
    for (int j = 0; j < 16; ++j) {
      out[j] = ((qs[j] & 15) | (int)((qh >> j) & 1) << 4) - off;
      out[j + 16] = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - off;
    }
    if (m && w.t == DType::q5_1) *m = reinterpret_cast<const block_q5_1*>(row)[b].m;
  } else if (w.t == DType::q4_0) {
    const auto& blk = reinterpret_cast<const block_q4_0*>(row)[b];
    for (int j = 0; j < 16; ++j) {
      out[j] = (blk.qs[j] & 15) - 8;
      out[j + 16] = (blk.qs[j] >> 4) - 8;
    }
  } else if (w.t == DType::iq4_nl) {
    const auto& blk = reinterpret_cast<const block_iq4_nl*>(row)[b];
    for (int j = 0; j < 16; ++j) {
      out[j] = kIq4nlValues[blk.qs[j] & 15];
      out[j + 16] = kIq4nlValues[blk.qs[j] >> 4];
    }
  } else if (w.t == DType::mxfp4) {
    const auto& blk = reinterpret_cast<const block_mxfp4*>(row)[b];
    for (int j = 0; j < 16; ++j) {
      out[j] = kMxfp4Values[blk.qs[j] & 15];
      out[j + 16] = kMxfp4Values[blk.qs[j] >> 4];
    }
  } else {
    const auto& blk = reinterpret_cast<const block_q8_0*>(row)[b];
    for (int j = 0; j < 32; ++j) out[j] = blk.qs[j];
  }
}
uint16_t block_d(const Weights& w, int64_t r, int64_t b) {
  if (w.t == DType::mxfp4)  // 2^(e - 128), an F16 for the scales the tests use
    return fp32_to_fp16(mxfp4_scale(reinterpret_cast<const block_mxfp4*>(w.data.data() + (size_t)r * w.stride)[b].e));
  uint16_t d;  // d is the first field of every 32-block type
  std::memcpy(&d, w.data.data() + (size_t)r * w.stride + (size_t)b * row_size(w.t, 32), 2);
  return d;
}

// Super-block sb of row r as integers, from the stored block by the format's
// definition (quant_blocks.h): q[256] (Q2_K: 0..3; Q3_K: value - 4, -4..3; Q4_K: 0..15;
// Q5_K: 0..31; Q6_K: value - 32, -32..31),
// the scale of each element's sub-block (sc), Q4_K's per-32 mins (mn[8]; Q2_K:
// per-16, mn16[16]), d, dmin.
// IQ4_XS: q = the codebook value, sc = ls - 32.
struct KInts {
  int32_t q[256], sc[256], mn[8], mn16[16];
  float d, dmin;
};
KInts k_ints(const Weights& w, int64_t r, int64_t sb) {
  KInts k{};
  const uint8_t* row = w.data.data() + (size_t)r * w.stride;
  if (w.t == DType::q4_k || w.t == DType::q5_k) {
    // Q5_K: Q4_K's fields with qh, the fifth bit of element 64p + l (bit 2p
    // of qh[l]) and of 64p + 32 + l (bit 2p + 1).
    const bool q5 = w.t == DType::q5_k;
    const auto* b4 = reinterpret_cast<const block_q4_K*>(row) + sb;
    const auto* b5 = reinterpret_cast<const block_q5_K*>(row) + sb;
    const uint8_t* s = q5 ? b5->scales : b4->scales;
    const uint8_t* qs = q5 ? b5->qs : b4->qs;
    for (int j = 0; j < 8; ++j) {
      const int scj = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      k.mn[j] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      for (int e = 32 * j; e < 32 * j + 32; ++e) k.sc[e] = scj;
    }
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) {
        const int h0 = q5 ? ((b5->qh[l] >> (2 * p)) & 1) << 4 : 0, h1 = q5 ? ((b5->qh[l] >> (2 * p + 1)) & 1) << 4 : 0;
        k.q[64 * p + l] = (qs[32 * p + l] & 15) | h0;
        k.q[64 * p + 32 + l] = (qs[32 * p + l] >> 4) | h1;
      }
    k.d = fp16_to_fp32(q5 ? b5->d : b4->d);
    k.dmin = fp16_to_fp32(q5 ? b5->dmin : b4->dmin);
  } else if (w.t == DType::q2_k) {
    const auto& b = reinterpret_cast<const block_q2_K*>(row)[sb];
    for (int i = 0; i < 16; ++i) {
      k.mn16[i] = b.scales[i] >> 4;
      for (int e = 16 * i; e < 16 * i + 16; ++e) k.sc[e] = b.scales[i] & 15;
    }
    for (int h = 0; h < 2; ++h)
      for (int kk = 0; kk < 4; ++kk)
        for (int l = 0; l < 32; ++l) k.q[128 * h + 32 * kk + l] = (b.qs[32 * h + l] >> (2 * kk)) & 3;
    k.d = fp16_to_fp32(b.d);
    k.dmin = fp16_to_fp32(b.dmin);
  } else if (w.t == DType::q3_k) {
    const auto& b = reinterpret_cast<const block_q3_K*>(row)[sb];
    for (int i = 0; i < 16; ++i) {
      const int lo = i < 8 ? (b.scales[i] & 0x0F) : (b.scales[i - 8] >> 4);
      const int hi = (b.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
      for (int e = 16 * i; e < 16 * i + 16; ++e) k.sc[e] = (lo | (hi << 4)) - 32;
    }
    for (int h = 0; h < 2; ++h)
      for (int kk = 0; kk < 4; ++kk)
        for (int l = 0; l < 32; ++l)
          k.q[128 * h + 32 * kk + l] =
              (((b.qs[32 * h + l] >> (2 * kk)) & 3) | (((b.hmask[l] >> (4 * h + kk)) & 1) << 2)) - 4;
    k.d = fp16_to_fp32(b.d);
  } else if (w.t == DType::iq4_xs) {
    const auto& b = reinterpret_cast<const block_iq4_xs*>(row)[sb];
    for (int j = 0; j < 8; ++j) {
      const int ls = ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
      for (int i = 0; i < 16; ++i) {
        k.q[32 * j + i] = kIq4nlValues[b.qs[16 * j + i] & 15];
        k.q[32 * j + 16 + i] = kIq4nlValues[b.qs[16 * j + i] >> 4];
      }
      for (int e = 32 * j; e < 32 * j + 32; ++e) k.sc[e] = ls - 32;
    }
    k.d = fp16_to_fp32(b.d);
  } else {
    const auto& b = reinterpret_cast<const block_q6_K*>(row)[sb];
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l)
        for (int t = 0; t < 4; ++t) {
          const int low = b.ql[64 * h + l + 32 * (t % 2)];
          const int e = 128 * h + 32 * t + l;
          k.q[e] = ((t < 2 ? low & 15 : low >> 4) | (((b.qh[32 * h + l] >> (2 * t)) & 3) << 4)) - 32;
        }
    for (int e = 0; e < 256; ++e) k.sc[e] = b.scales[e / 16];
    k.d = fp16_to_fp32(b.d);
  }
  return k;
}

// The documented numerics of matmul(PackedMatrix) for the K-quants (matmul.h,
// x86/packed_kq.inc), written plainly: scalar Q8_K activations; per super-block
// T = sum sc * q * a, M = sum mn_j * (sum of a over sub-block j) (Q4_K, Q5_K, Q2_K), then
// acc = fma(T, d * dx, acc) and acc = acc - M * (dmin * dx) (one rounding).
// Block b of a prepared activation row: its int8 quants, and its scale (at d_off) in *dx.
const int8_t* act_unit(const std::vector<uint8_t>& act, int64_t b, size_t unit_bytes, size_t d_off, float* dx) {
  const uint8_t* unit = act.data() + (size_t)b * unit_bytes;
  std::memcpy(dx, unit + d_off, 4);
  return reinterpret_cast<const int8_t*>(unit);
}

std::vector<float> packed_model_k(const Weights& w, const std::vector<float>& x, int64_t n) {
  const int64_t nsb = w.cols / 256;
  std::vector<float> y((size_t)(n * w.rows));
  std::vector<uint8_t> act(kernels::detail::act_q8_k_row_bytes(w.cols));
  for (int64_t i = 0; i < n; ++i) {
    kernels::detail::quantize_act_q8_k(x.data() + i * w.cols, w.cols, act.data());
    for (int64_t r = 0; r < w.rows; ++r) {
      float acc = 0.0f;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        float dx;
        const int8_t* qa = act_unit(act, sb, kernels::detail::kActQ8_KBlockBytes, 304, &dx);
        const KInts k = k_ints(w, r, sb);
        int64_t t = 0, m = 0;
        for (int e = 0; e < 256; ++e) {
          t += (int64_t)k.sc[e] * k.q[e] * qa[e];
          if (w.t == DType::q4_k || w.t == DType::q5_k) m += (int64_t)k.mn[e / 32] * qa[e];
          if (w.t == DType::q2_k) m += (int64_t)k.mn16[e / 16] * qa[e];
        }
        acc = std::fmaf((float)t, k.d * dx, acc);
        if (w.t == DType::q4_k || w.t == DType::q5_k || w.t == DType::q2_k) acc = std::fmaf(-(float)m, k.dmin * dx, acc);
      }
      y[(size_t)(i * w.rows + r)] = acc;
    }
  }
  return y;
}

// The documented numerics of matmul(PackedMatrix) at the SIMD levels, written
// plainly: scalar Q8_0P activations, exact integer block dots, one fmaf per
// block in block order (a second one for the min term of Q4_1 / Q5_1).
std::vector<float> packed_model(const Weights& w, const std::vector<float>& x, int64_t n) {
  if (is_k(w.t)) return packed_model_k(w, x, n);
  if (is_float16(w.t)) {  // one fmaf per column, in column order
    std::vector<float> y((size_t)(n * w.rows));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < w.rows; ++r) {
        float acc = 0.0f;
        for (int64_t k = 0; k < w.cols; ++k) acc = std::fmaf(w.deq[(size_t)(r * w.cols + k)], x[(size_t)(i * w.cols + k)], acc);
        y[(size_t)(i * w.rows + r)] = acc;
      }
    return y;
  }
  const int64_t nb = w.cols / 32;
  std::vector<float> y((size_t)(n * w.rows));
  std::vector<uint8_t> act(kernels::detail::act_q8_0p_row_bytes(w.cols));
  for (int64_t i = 0; i < n; ++i) {
    kernels::detail::quantize_act_q8_0p(x.data() + i * w.cols, w.cols, 0, act.data());
    for (int64_t r = 0; r < w.rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float dx;
        const int8_t* qa = act_unit(act, b, kernels::detail::kActQ8_0PBlockBytes, 36, &dx);
        int32_t q[32], t = 0, sa = 0;
        uint16_t m = 0;
        block_ints(w, r, b, q, &m);
        for (int j = 0; j < 32; ++j) {
          t += q[j] * qa[j];
          sa += qa[j];
        }
        acc = std::fmaf((float)t, fp16_to_fp32(block_d(w, r, b)) * dx, acc);
        if (is_affine(w.t)) acc = std::fmaf((float)sa, fp16_to_fp32(m) * dx, acc);
      }
      y[(size_t)(i * w.rows + r)] = acc;
    }
  }
  return y;
}

std::vector<float> run_packed(const kernels::PackedMatrix& p, const std::vector<float>& x, int64_t n,
                              ThreadPool* pool = nullptr) {
  std::vector<float> y((size_t)(n * p.rows()), -1.0f);
  kernels::matmul(p, x.data(), n, y.data(), pool);
  return y;
}

TEST(PackedMatrix, RowsRoundTrip) {
  for (DType t : kPackedTypes) {
    const int64_t bs = is_k(t) ? 256 : 32;
    const Weights w = random_weights(t, 37, 3 * bs, 5);
    ASSERT_TRUE(kernels::PackedMatrix::packable(t));
    const auto p = kernels::PackedMatrix::pack(t, w.data.data(), w.rows, w.cols);
    // 3 groups of 16 rows (the last one padded), 3 blocks; Q4_K's scales take 4
    // bytes more per row and super-block (unpacked to bytes; Q5_K too), Q6_K pads 32 bytes
    // per 16-row super-block, IQ4_XS 64 and Q3_K 96 (scales unpacked to bytes,
    // then padding).
    const size_t extra = t == DType::q4_k || t == DType::q5_k ? 4 * 16
                         : t == DType::q6_k                   ? 32
                         : t == DType::iq4_xs                 ? 64
                         : t == DType::q3_k                   ? 96
                         : t == DType::mxfp4                  ? 16  // the E8M0 byte widened to an F16 scale
                                                              : 0;
    // The 32-block layouts store blocks in pairs: 3 blocks take 4.
    const size_t blocks = is_k(t) || is_float16(t) ? 3 : 4;
    EXPECT_EQ(p.bytes(), (size_t)3 * blocks * (16 * row_size(t, bs) + extra)) << dtype_name(t);
    std::vector<float> row((size_t)w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      p.dequantize_row(r, row.data());
      EXPECT_EQ(std::memcmp(row.data(), w.deq.data() + r * w.cols, (size_t)w.cols * 4), 0)
          << dtype_name(t) << " row " << r;
    }
  }
  EXPECT_FALSE(kernels::PackedMatrix::packable(DType::f32));
}

// MXFP4: the reference dequantization of a hand-built block, the quantizer's
// error, and which matrices pack (a scale outside F16's range stays on the
// stored rows: the reference kernel).
TEST(Mxfp4, BlockQuantizeAndPackability) {
  block_mxfp4 b{};
  b.e = 127;  // 2^-1
  for (int j = 0; j < 16; ++j) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
  float y[32];
  ref::dequantize_row(DType::mxfp4, &b, y, 32);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1[j] * 1.0f) << j;       // value x2 in the codebook, x 2^-1
    EXPECT_EQ(y[j + 16], e2m1[15 - j] * 1.0f) << j;
  }
  EXPECT_EQ(mxfp4_scale(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(mxfp4_scale(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(mxfp4_scale(200), std::ldexp(1.0f, 72));
  // Round trip: within the E2M1 grid's half step of each element's block scale.
  Rng r(3);
  std::vector<float> x(32 * 64), back(x.size());
  for (auto& v : x) v = (float)(0.05 * r.normal());
  std::vector<block_mxfp4> q(64);
  ref::quantize_row(DType::mxfp4, x.data(), q.data(), (int64_t)x.size());
  ref::dequantize_row(DType::mxfp4, q.data(), back.data(), (int64_t)x.size());
  double err = 0, ref2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (x[i] - back[i]) * (x[i] - back[i]);
    ref2 += x[i] * x[i];
  }
  const double rel = std::sqrt(err / ref2);
  std::printf("mxfp4 round-trip relative RMS error %.4f\n", rel);
  EXPECT_LT(rel, 0.13);
  EXPECT_GT(rel, 0.02);  // it is a 4-bit format
  EXPECT_TRUE(kernels::PackedMatrix::packable_data(DType::mxfp4, q.data(), 2, 1024));
  q[5].e = 150;  // 2^22: no F16
  EXPECT_FALSE(kernels::PackedMatrix::packable_data(DType::mxfp4, q.data(), 2, 1024));
  std::memset(q[5].qs, 0x88, 16);  // all (negative) zeros: packs with scale 0
  EXPECT_TRUE(kernels::PackedMatrix::packable_data(DType::mxfp4, q.data(), 2, 1024));
}

TEST_F(KernelLevels, PackedMatchesItsModelBitForBit) {
  ThreadPool pool2(2), pool3(3);
  // Emulated (test::emulated()): one shape, 45 x 96 (three row groups: a
  // pair and a lone last one; three column blocks), every tile size below.
  using Sizes = std::vector<int64_t>;
  const Sizes row_counts = test::emulated() ? Sizes{45} : Sizes{45, 64, 300};
  const Sizes col_counts = test::emulated() ? Sizes{96} : Sizes{96, 512};
  for (DType ty : kPackedTypes)
  for (int64_t rows : row_counts) {
    for (int64_t cols : col_counts) {
      if (is_k(ty)) cols = cols == 96 ? 256 : 768;
      SCOPED_TRACE(dtype_name(ty));
      const Weights w = random_weights(ty, rows, cols, (uint64_t)(rows * cols));
      const auto p = kernels::PackedMatrix::pack(ty, w.data.data(), rows, cols);
      // 3 rows take the decode tiles (2 + 1); 19 and 45 the prefill tiles
      // (two row groups x 6, tails 1 and 3 -> 2 + 1, and a lone last group).
      for (int64_t n : {3, 19, 45}) {
      const auto x = activations(n, cols, 7);
      const auto model = packed_model(w, x, n);
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        if (isa == Isa::ref) {
          // The reference path: F32 dots of the dequantized rows, as for the stored rows.
          EXPECT_EQ(run_packed(p, x, n), run(w, x, n)) << "rows " << rows << " cols " << cols;
          continue;
        }
        const auto y = run_packed(p, x, n);
        EXPECT_EQ(std::memcmp(y.data(), model.data(), y.size() * 4), 0)
            << isa_name(isa) << " rows " << rows << " cols " << cols;
        EXPECT_EQ(run_packed(p, x, n, &pool2), y) << isa_name(isa);
        EXPECT_EQ(run_packed(p, x, n, &pool3), y) << isa_name(isa);
        // Batch invariance: each row alone, and among others.
        const auto others = activations(4, cols, 99);
        for (int64_t i : {0, 2, 8, 17, 18}) {
          if (i >= n) continue;
          const float* xi = x.data() + i * cols;
          std::vector<float> x1(xi, xi + cols);
          const auto y1 = run_packed(p, x1, 1, &pool2);
          EXPECT_EQ(std::memcmp(y1.data(), y.data() + i * rows, (size_t)rows * 4), 0)
              << isa_name(isa) << " n=1 row " << i;
          std::vector<float> x5(others.begin(), others.begin() + 2 * cols);
          x5.insert(x5.end(), xi, xi + cols);
          x5.insert(x5.end(), others.begin() + 2 * cols, others.end());
          const auto y5 = run_packed(p, x5, 5);
          EXPECT_EQ(std::memcmp(y5.data() + 2 * rows, y.data() + i * rows, (size_t)rows * 4), 0)
              << isa_name(isa) << " n=5 row " << i;
        }
      }
      }
    }
  }
}

// matmul_many (one input, several packed products: a layer's Q/K/V or
// gate/up) gives each product the bytes matmul gives it alone: weights of
// one activation format, of two (Q4_0's offset 8 and Q8_0's 128: X quantized
// twice), of the K-quants' Q8_K beside Q8_0P, of F16 (X read as given), and
// more products than one call fuses (the rest one by one); every level,
// thread count and decode- or prefill-sized n.
TEST_F(KernelLevels, ManyProductsOfOneInputMatchOneByOneBitForBit) {
  ThreadPool pool2(2), pool3(3);
  const std::vector<std::vector<DType>> groups = {
      {DType::q4_0, DType::q4_0, DType::q4_0},
      {DType::q4_0, DType::q8_0, DType::q4_0},
      {DType::q4_k, DType::q6_k, DType::q8_0},
      {DType::f16, DType::q4_0},
      {DType::iq4_xs, DType::q5_k, DType::bf16, DType::q4_1, DType::q5_0, DType::q5_1, DType::iq4_nl, DType::q3_k,
       DType::q2_k}};
  const int64_t cols = 512;
  // Emulated (test::emulated()): the decode and a prefill-sized n, one or two threads.
  const std::vector<int64_t> ns = test::emulated() ? std::vector<int64_t>{1, 16}
                                                    : std::vector<int64_t>{1, 3, 16, 45};
  std::vector<ThreadPool*> pools = {nullptr, &pool2};
  if (!test::emulated()) pools.push_back(&pool3);
  for (const auto& types : groups) {
    std::vector<kernels::PackedMatrix> ps;
    for (size_t j = 0; j < types.size(); ++j) {
      const int64_t rows = j == 0 ? 300 : (j == 1 ? 45 : 64 + 16 * (int64_t)j);
      const Weights w = random_weights(types[j], rows, cols, 1000 + j);
      ps.push_back(kernels::PackedMatrix::pack(types[j], w.data.data(), rows, cols));
    }
    for (int64_t n : ns) {
      const auto x = activations(n, cols, 77 + (uint64_t)n);
      for (Isa isa : levels()) {
        ASSERT_EQ(kernels::set_isa(isa), isa);
        for (ThreadPool* pool : pools) {
          std::vector<std::vector<float>> ys;
          std::vector<kernels::PackedProduct> pp;
          for (const auto& p : ps) ys.emplace_back((size_t)(n * p.rows()), -1.0f);
          for (size_t j = 0; j < ps.size(); ++j) pp.push_back({&ps[j], ys[j].data()});
          kernels::matmul_many(pp.data(), pp.size(), x.data(), n, pool);
          for (size_t j = 0; j < ps.size(); ++j) {
            const auto alone = run_packed(ps[j], x, n, pool);
            EXPECT_EQ(std::memcmp(ys[j].data(), alone.data(), alone.size() * 4), 0)
                << isa_name(isa) << " " << dtype_name(types[j]) << " product " << j << " n=" << n
                << " threads " << (pool ? pool->n_threads() : 1);
          }
        }
      }
    }
  }
}

// matmul_grouped (products of different inputs: a MoE layer's experts, each
// with its own tokens' rows) gives each product the bytes matmul gives it
// alone: many products of one type (decode: one or two rows each, and a
// product of no rows, skipped), mixed activation formats and cols (Q8_0P
// beside Q8_K, F16 reading X as given), every level and thread count.
TEST_F(KernelLevels, GroupedProductsOfOwnInputsMatchOneByOneBitForBit) {
  ThreadPool pool2(2), pool3(3);
  struct Spec {
    DType t;
    int64_t rows, cols, n;
  };
  const std::vector<std::vector<Spec>> groups = {
      // 12 experts of one format, 1-3 rows each, one of none.
      {{DType::q4_0, 96, 256, 1}, {DType::q4_0, 96, 256, 2}, {DType::q4_0, 96, 256, 0}, {DType::q4_0, 96, 256, 3},
       {DType::q4_0, 96, 256, 1}, {DType::q4_0, 96, 256, 1}, {DType::q4_0, 96, 256, 2}, {DType::q4_0, 96, 256, 1},
       {DType::q4_0, 96, 256, 1}, {DType::q4_0, 96, 256, 3}, {DType::q4_0, 96, 256, 1}, {DType::q4_0, 96, 256, 2}},
      // Mixed formats, rows that are not a multiple of 16, other cols.
      {{DType::q4_k, 40, 512, 5}, {DType::q8_0, 300, 256, 1}, {DType::q6_k, 64, 256, 17}, {DType::f16, 33, 128, 4},
       {DType::iq4_xs, 48, 256, 2}, {DType::q4_0, 17, 64, 9}},
  };
  std::vector<ThreadPool*> pools = {nullptr, &pool2};
  if (!test::emulated()) pools.push_back(&pool3);
  for (const auto& specs : groups) {
    std::vector<kernels::PackedMatrix> ps;
    std::vector<std::vector<float>> xs;
    for (size_t j = 0; j < specs.size(); ++j) {
      const Spec& sp = specs[j];
      const Weights w = random_weights(sp.t, sp.rows, sp.cols, 2000 + j);
      ps.push_back(kernels::PackedMatrix::pack(sp.t, w.data.data(), sp.rows, sp.cols));
      xs.push_back(activations(std::max<int64_t>(sp.n, 1), sp.cols, 300 + j));
    }
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      for (ThreadPool* pool : pools) {
        std::vector<std::vector<float>> ys;
        std::vector<kernels::GroupedProduct> gp;
        for (size_t j = 0; j < specs.size(); ++j) ys.emplace_back((size_t)(std::max<int64_t>(specs[j].n, 1) * specs[j].rows), -1.0f);
        for (size_t j = 0; j < specs.size(); ++j) gp.push_back({&ps[j], xs[j].data(), specs[j].n, ys[j].data()});
        kernels::matmul_grouped(gp.data(), gp.size(), pool);
        for (size_t j = 0; j < specs.size(); ++j) {
          if (specs[j].n == 0) {  // untouched
            EXPECT_EQ(ys[j][0], -1.0f) << isa_name(isa) << " product " << j;
            continue;
          }
          const auto alone = run_packed(ps[j], xs[j], specs[j].n, pool);
          EXPECT_EQ(std::memcmp(ys[j].data(), alone.data(), alone.size() * 4), 0)
              << isa_name(isa) << " " << dtype_name(specs[j].t) << " product " << j << " n=" << specs[j].n
              << " threads " << (pool ? pool->n_threads() : 1);
        }
      }
    }
  }
}

// Products that gather their rows from one shared input (a MoE layer's gate
// and up: each expert's tokens' rows of the normed input) get the bytes
// matmul gives them on the gathered rows: the shared rows are quantized once
// per activation format (Q4_0's and Q8_0's offsets differ; Q4_K's Q8_K),
// beside a product with its own X; and with an F16 product among them (X
// read as given: its rows gathered in F32).
TEST_F(KernelLevels, GroupedProductsGatheringSharedRowsMatchOneByOneBitForBit) {
  ThreadPool pool2(2);
  const int64_t cols = 256, n_src = 9;
  const auto src = activations(n_src, cols, 4242);
  const std::vector<std::vector<int64_t>> picks = {{0, 3}, {1}, {2, 5, 8}, {8}, {0, 1, 2, 3, 4, 5, 6, 7, 8}, {4, 6}};
  for (const std::vector<DType>& types : std::vector<std::vector<DType>>{
           {DType::q4_0, DType::q8_0, DType::q4_k, DType::q4_0, DType::q6_k, DType::q8_0},
           {DType::q4_0, DType::f16, DType::q4_0, DType::q4_0, DType::q4_0, DType::q4_0}}) {
    std::vector<kernels::PackedMatrix> ps;
    for (size_t j = 0; j < types.size(); ++j) {
      const Weights w = random_weights(types[j], 48, cols, 5000 + j);
      ps.push_back(kernels::PackedMatrix::pack(types[j], w.data.data(), 48, cols));
    }
    const auto own = activations(3, cols, 99);  // the last product's own X
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      for (ThreadPool* pool : {(ThreadPool*)nullptr, &pool2}) {
        std::vector<std::vector<float>> ys;
        std::vector<kernels::GroupedProduct> gp;
        for (size_t j = 0; j < ps.size(); ++j) {
          const bool is_own = j + 1 == ps.size();
          const int64_t n = is_own ? 3 : (int64_t)picks[j].size();
          ys.emplace_back((size_t)(n * 48), -1.0f);
          gp.push_back({&ps[j], is_own ? own.data() : src.data(), n, ys[j].data(), is_own ? nullptr : picks[j].data()});
        }
        kernels::matmul_grouped(gp.data(), gp.size(), pool);
        for (size_t j = 0; j < ps.size(); ++j) {
          std::vector<float> x;
          if (gp[j].rows == nullptr) x = own;
          else
            for (int64_t r : picks[j]) x.insert(x.end(), src.begin() + r * cols, src.begin() + (r + 1) * cols);
          const auto alone = run_packed(ps[j], x, gp[j].n, pool);
          EXPECT_EQ(std::memcmp(ys[j].data(), alone.data(), alone.size() * 4), 0)
              << isa_name(isa) << " " << dtype_name(types[j]) << " product " << j
              << " threads " << (pool ? pool->n_threads() : 1);
        }
      }
    }
  }
}

TEST_F(KernelLevels, PackedWithinFormatBound) {
  for (DType t : kPackedTypes) {
    const Weights w = make_weights(t, 40, is_k(t) ? 768 : 800, 31);
    const auto p = kernels::PackedMatrix::pack(t, w.data.data(), w.rows, w.cols);
    const auto x = activations(6, w.cols, 12);
    for (Isa isa : levels()) {
      ASSERT_EQ(kernels::set_isa(isa), isa);
      double worst = 0;
      check_against_ref(w, x, 6, run_packed(p, x, 6), isa, &worst);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- ISA selection ------------------------------------------------------------------

TEST(CpuFeatures, ChooseIsa) {
  CpuFeatures none;
  CpuFeatures avx2;
  avx2.avx2 = avx2.fma = avx2.f16c = true;
  CpuFeatures avx512 = avx2;
  avx512.avx512f = avx512.avx512bw = avx512.avx512vl = true;
  CpuFeatures vnni = avx512;
  vnni.avx512vnni = true;
  CpuFeatures avxvnni = avx2;  // Alder Lake: AVX-VNNI without AVX-512
  avxvnni.avxvnni = true;
  CpuFeatures icelake = vnni;  // AVX-512-VNNI without AVX-VNNI

  EXPECT_EQ(best_isa(none), Isa::ref);
  EXPECT_EQ(best_isa(avx2), Isa::avx2);
  EXPECT_EQ(best_isa(avx512), Isa::avx512);
  EXPECT_EQ(best_isa(vnni), Isa::avx512vnni);
  EXPECT_EQ(best_isa(avxvnni), Isa::avx2vnni);
  EXPECT_FALSE(isa_supported(Isa::avx2vnni, icelake));
  CpuFeatures no_fma = avx2;
  no_fma.fma = false;
  EXPECT_EQ(best_isa(no_fma), Isa::ref);

  std::string_view err;
  EXPECT_EQ(choose_isa(vnni, nullptr, &err), Isa::avx512vnni);
  EXPECT_EQ(choose_isa(vnni, "", &err), Isa::avx512vnni);
  EXPECT_EQ(choose_isa(vnni, "ref", &err), Isa::ref);
  EXPECT_EQ(choose_isa(vnni, "avx2", &err), Isa::avx2);
  EXPECT_EQ(choose_isa(avx2, "avx512vnni", &err), Isa::avx2);  // capped
  EXPECT_EQ(choose_isa(none, "avx512", &err), Isa::ref);
  EXPECT_EQ(choose_isa(avxvnni, "avx512vnni", &err), Isa::avx2vnni);  // capped
  EXPECT_EQ(choose_isa(icelake, "avx2vnni", &err), Isa::avx2);         // the highest supported below
  EXPECT_TRUE(err.empty());
  EXPECT_EQ(choose_isa(avx512, "sse9", &err), Isa::avx512);
  EXPECT_NE(err.find("unknown"), std::string_view::npos);

  for (Isa i : {Isa::ref, Isa::avx2, Isa::avx2vnni, Isa::avx512, Isa::avx512vnni})
    EXPECT_EQ(isa_from_name(isa_name(i)), i);
  EXPECT_FALSE(isa_from_name("AVX2").has_value());
}

TEST(CpuFeatures, HostIsConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512bw || f.avx512vl || f.avx512vnni || f.avx512vbmi) {
    EXPECT_TRUE(f.avx512f);
  }
  EXPECT_TRUE(isa_supported(selected_isa(), f));
  std::printf("cpu: avx2=%d fma=%d f16c=%d avx512f=%d bw=%d vl=%d vbmi=%d vnni=%d avxvnni=%d bf16=%d\n", f.avx2,
              f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vl, f.avx512vbmi, f.avx512vnni, f.avxvnni, f.avx512bf16);
}

}  // namespace
}  // namespace serval
