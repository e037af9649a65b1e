// Internal to kernels/: the activation rows of a quantized matmul, quantized
// once per call to 8-bit blocks so that the weight dot products run on integer
// SIMD (vpdpbusd / vpmaddubsw). Not a public API.
//
// Two layouts, one row at a time, each row a whole number of 64-byte units:
//
// Q8_32 (for weights in 32-element blocks: Q4_0, Q8_0, IQ4_NL). The row's
// blocks are taken in pairs (b, b+1) (a missing last block is all zeros); per
// pair, 192 bytes:
//   int8_t  qs[64]    elements of blocks b and b+1, natural order
//   int32_t corr[16]  corr[8h + k] = -offset * (sum of qs[32h + 4k .. 32h + 4k + 3])
//   float   d[16]     d[8h + k] = scale of block b + h
// `offset` is the bias the kernel adds to signed weights to make them unsigned
// for vpdpbusd (8 for Q4_0 nibbles); with offset 0, corr is all zeros.
//
// Q8_0P (for weights packed 16 rows at a time, matmul.h's PackedMatrix), per
// 32-element block, 40 bytes:
//   int8_t  qs[32]
//   int32_t corr    -offset * (sum of qs)
//   float   d       the block's scale
//
// Q8_K (for the K-quants: Q4_K, Q5_K, Q6_K), per 256-element block, 320 bytes:
//   int8_t  qs[256]
//   int16_t bsum16[16]  sum of qs[16j .. 16j + 15]
//   int16_t bsum32[8]   sum of qs[32j .. 32j + 31]
//   float   d
//   (12 bytes of padding)
//
// Quantization (every layout): per block of 32 (Q8_32, Q8_0P) or 256 (Q8_K) elements,
// amax = max |x|, d = amax / 127, q = round-to-nearest-even(x * (127 / amax))
// in [-127, 127] (q = 0, d = 0 for an all-zero or non-finite block). Q8_32
// and Q8_0P store d rounded to F16 (when below 65504), as llama.cpp's Q8_0 does: with it
// the results follow llama.cpp's much more closely (teacher-forced mini IQ4_NL
// model: mean |d logprob| vs llama.cpp 0.039 -> 0.0014). Every step is an exact
// IEEE operation, so the result is the same on every ISA and depends on the row
// alone: the first half of batch invariance.
//
// Pure functions over caller-owned buffers; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/fp16.h"

namespace serval::kernels::detail {

constexpr size_t kActQ8_32PairBytes = 192;
constexpr size_t kActQ8_KBlockBytes = 320;
constexpr size_t kActQ8_0PBlockBytes = 40;

// Bytes of one prepared row of `cols` elements (cols a multiple of 32 / 256).
inline size_t act_q8_32_row_bytes(int64_t cols) { return (size_t)((cols / 32 + 1) / 2) * kActQ8_32PairBytes; }
inline size_t act_q8_k_row_bytes(int64_t cols) { return (size_t)(cols / 256) * kActQ8_KBlockBytes; }
inline size_t act_q8_0p_row_bytes(int64_t cols) { return (size_t)(cols / 32) * kActQ8_0PBlockBytes; }

// The stored Q8_32 scale for d >= 0.
inline float act_scale_q8_32(float d) { return d < 65504.0f ? fp16_to_fp32(fp32_to_fp16(d)) : d; }

void quantize_act_q8_32(const float* x, int64_t cols, int offset, uint8_t* dst);
void quantize_act_q8_k(const float* x, int64_t cols, uint8_t* dst);
void quantize_act_q8_0p(const float* x, int64_t cols, int offset, uint8_t* dst);

}  // namespace serval::kernels::detail
