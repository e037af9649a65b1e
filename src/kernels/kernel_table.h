// Internal to kernels/: the per-ISA kernel tables behind the one dispatch point
// (matmul.cpp). Not a public API.
//
// Every SIMD table (avx2, avx2vnni, avx512, avx512vnni) computes bit-identical results:
// the kernels are written once (x86/matmul_tmpl.inc) against a 16-lane vector
// abstraction that AVX-512 implements with one zmm and AVX2 with two ymm, and
// every floating-point step is the same IEEE operation on the same lane in every
// implementation (integer partial sums are exact, so how they are formed does
// not matter). See x86/matmul_tmpl.inc for the reduction order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "tensor/dtype.h"

namespace serval::kernels::detail {

enum class ActKind {
  f32,    // the kernel reads X as given
  q8_32,  // X prepared by quantize_act_q8_32 (act_quant.h)
  q8_k,   // X prepared by quantize_act_q8_k
  q8_0p,  // X prepared by quantize_act_q8_0p (packed weights)
};

// One matmul call, as the row kernels see it.
struct MatmulTask {
  const uint8_t* w = nullptr;  // [rows] rows of w_stride bytes
  size_t w_stride = 0;
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;      // [n, cols] F32 (ActKind::f32)
  const uint8_t* act = nullptr;  // [n] prepared rows of act_stride bytes (q8 kinds)
  size_t act_stride = 0;
  int64_t n = 0;
  float* y = nullptr;  // [n, rows]
};

// Computes y[i, r] for all i < n and r0 <= r < r1. Called concurrently on
// disjoint row ranges.
using MatmulRowsFn = void (*)(const MatmulTask& t, int64_t r0, int64_t r1);

struct MatmulKernel {
  MatmulRowsFn fn = nullptr;  // nullptr: no fast path for this type
  ActKind act = ActKind::f32;
  int act_offset = 0;  // the offset to pass to quantize_act_q8_32
};

// PackedMatrix's X16 layouts (Q4_0x16, IQ4_NLx16, Q4_1x16, Q5_0x16, Q5_1x16,
// Q8_0x16): rows in groups of 16 (rows past the end of the last group are
// zero), nb = cols / 32 blocks of 32 columns, in pairs (an odd nb pads the last
// pair with zeros); each pair of blocks b, b + 1 (b even) takes
// 2 * Q + 64 (+ 64 with a min) bytes: both blocks' quants, both blocks' scales,
// both blocks' mins, so that one stream carries them all. Q = 256 (Q4_0,
// IQ4_NL, Q4_1: the same nibble layout, codes instead of q - 8 for IQ4_NL),
// 320 (Q5_0, Q5_1: the nibbles, then 64 bytes of fifth bits) or 512 (Q8_0).
// A group takes ceil(nb / 2) pairs, from g * (group bytes); per block b:
//   uint8_t  qs[Q / 64][64]  nibbles: qs[b][k][4 * l + j] (k < 4) = byte
//                                4k + j of the qs of row l's block b, so
//                                (qs[b][k] & 15) holds elements 4k..4k+3 of
//                                every row and (qs[b][k] >> 4) elements
//                                16 + 4k..16 + 4k + 3; Q5: qs[b][4][4 * l + j]
//                                bit k = the fifth bit of element 4k + j;
//                                Q8_0: qs[b][k][4 * l + j] = element 4k + j
//                                plus 128 (biased to unsigned, as vpdpbusd
//                                takes it: no per-use flip in the VNNI tiles)
//   uint16_t d[16]           F16 scale of row l's block b at d[b][l]
//   uint16_t m[16]           F16 min (Q4_1, Q5_1)
// 64-byte loads stay aligned. MatmulTask::w_stride is the bytes of a group.
constexpr int64_t kX16Rows = 16;

// PackedMatrix's K-quant layouts (Q2_Kx16, Q3_Kx16, Q4_Kx16, Q5_Kx16, Q6_Kx16,
// IQ4_XSx16; x86/packed_kq.inc): rows in groups of 16 as above, each group
// nsb = cols / 256 super-blocks of kQ2Kx16SbBytes / kQ3Kx16SbBytes / ... /
// kIq4XsX16SbBytes bytes (64-byte multiples), in order. Row l's
// element e of a super-block sits in "quad vector" e / 4 (64 bytes, byte
// 4l + e % 4). Q4_K (2368 bytes):
//   uint8_t  qs[32][64]   vector 8p + i: low nibble = element 64p + 4i + j,
//                         high nibble = element 64p + 32 + 4i + j (byte 4l + j;
//                         that is byte 32p + 4i + j of row l's stored qs)
//   uint8_t  sc[8][16], mn[8][16]   sub-block scale / min j of row l at [j][l]
//   uint16_t d[16], dmin[16]        F16
// Q5_K (2880 bytes): Q4_K's qs, then the fifth bits, then Q4_K's sc .. dmin
//   uint8_t  qh[8][64]    vector i, byte 4l + j = row l's stored qh[4i + j]:
//                         bit 2p + h = the fifth bit of element 64p + 32h + 4i + j
// Q6_K (3392 bytes): 6-bit q (value q - 32)
//   uint8_t  ql[32][64]   as Q4_K's qs, the low 4 bits of q
//   uint8_t  qh[16][64]   vector n, byte 4l + j: bits 2s, 2s + 1 = the high bits
//                         of slot s: s = 0 / 1: ql vector 2n's low / high
//                         nibble, s = 2 / 3: ql vector 2n + 1's
//   int8_t   sc[16][16]   sub-block (16 elements) scale k of row l at [k][l]
//   uint16_t d[16]        F16; then 32 bytes of zeros
// Q2_K (1344 bytes, as stored): 2-bit q, y = d * sc * q - dmin * m
//   uint8_t  qs[2][8][64] as Q3_K's below
//   uint8_t  sm[16][16]   sub-block (16 elements) s of row l: scale | min << 4
//   uint16_t d[16], dmin[16]  F16
// Q3_K (1856 bytes): 3-bit q (value q - 4)
//   uint8_t  qs[2][8][64] vector (h, i), byte 4l + j = row l's stored
//                         qs[32h + 4i + j]: bits 2k, 2k + 1 = the low bits of
//                         element 128h + 32k + 4i + j
//   uint8_t  hm[8][64]    vector i, byte 4l + j = row l's stored hmask[4i + j]:
//                         bit 4h + k = the high bit of element 128h + 32k + 4i + j
//   int8_t   sc[16][16]   sub-block (16 elements) scale s of row l (sc - 32)
//   uint16_t d[16]        F16; then 32 bytes of zeros
// IQ4_XS (2240 bytes): codebook indices (kIq4nlValues)
//   uint8_t  qs[32][64]   vector 4j + k: low nibble = element 32j + 4k + i,
//                         high nibble = element 32j + 16 + 4k + i (byte
//                         4l + i; byte 16j + 4k + i of row l's stored qs)
//   int8_t   sc[8][16]    sub-block (32 elements) scale j of row l (ls - 32)
//   uint16_t d[16]        F16; then 32 bytes of zeros
constexpr size_t kQ2Kx16SbBytes = 1344;
constexpr size_t kQ3Kx16SbBytes = 1856;
constexpr size_t kQ4Kx16SbBytes = 2368;
constexpr size_t kQ5Kx16SbBytes = 2880;
constexpr size_t kQ6Kx16SbBytes = 3392;
constexpr size_t kIq4XsX16SbBytes = 2240;

// As kernels::attention, with `scores` holding n_heads / n_kv_heads * n_ctx floats.
using AttentionFn = void (*)(const float* q, const float* const* k_blocks, const float* const* v_blocks,
                             int32_t block_size, int64_t kv_stride, int64_t n_ctx, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, float scale, float* out, float* scores);

struct KernelTable {
  Isa isa = Isa::ref;
  MatmulKernel (*matmul_kernel)(DType t) = nullptr;
  AttentionFn attention = nullptr;
  // SIMD versions of act_quant.h's quantizers (the same output).
  void (*quantize_q8_32)(const float* x, int64_t cols, int offset, uint8_t* dst) = nullptr;
  void (*quantize_q8_k)(const float* x, int64_t cols, uint8_t* dst) = nullptr;
  // Kernels over PackedMatrix's X16 layouts (rows [r0, r1), r0 a multiple of
  // 16); fn nullptr where t has no packed layout.
  MatmulKernel (*packed_kernel)(DType t) = nullptr;
  void (*quantize_q8_0p)(const float* x, int64_t cols, int offset, uint8_t* dst) = nullptr;
};

// The tables of each level; nullptr where the build has none (non-x86).
// Callers must check isa_supported() before using one.
const KernelTable* kernel_table_avx2();
const KernelTable* kernel_table_avx2vnni();
const KernelTable* kernel_table_avx512();
const KernelTable* kernel_table_avx512vnni();

}  // namespace serval::kernels::detail
