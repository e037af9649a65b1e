// Quantized block layouts, byte for byte as GGUF (ggml) stores them.
//
// Pure data: every struct is trivially copyable, has alignment 1 or 2 (no
// padding) and may be overlaid on GGUF tensor bytes at any 2-byte aligned
// offset. F16 scales are stored as raw IEEE half bits (uint16_t); convert with
// common/fp16.h. All multi-byte fields are little-endian (as in the file; serval
// only targets little-endian hosts).
//
// Notation below: a block dequantizes to y[0..QK) (or y[0..QK_K)); "nibble
// lo/hi" is (b & 0xF) / (b >> 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/dtype.h"

namespace serval {

constexpr int QK4_0 = 32;
constexpr int QK4_1 = 32;
constexpr int QK5_0 = 32;
constexpr int QK5_1 = 32;
constexpr int QK8_0 = 32;
constexpr int QK4_NL = 32;
constexpr int QK_K = 256;        // super-block of the K-quants
constexpr int K_SCALE_SIZE = 12;  // 8 six-bit scales + 8 six-bit mins (q4_K, q5_K)

// ---- 32-element blocks -------------------------------------------------------

// Q4_0: y[j] = d * (lo(qs[j]) - 8), y[j+16] = d * (hi(qs[j]) - 8), j < 16.
struct block_q4_0 {
  uint16_t d;              // F16 scale
  uint8_t qs[QK4_0 / 2];   // 4-bit quants, element j in the low nibble, j+16 in the high
};

// Q4_1: y[j] = d * lo(qs[j]) + m, y[j+16] = d * hi(qs[j]) + m.
struct block_q4_1 {
  uint16_t d;              // F16 scale
  uint16_t m;              // F16 min (added)
  uint8_t qs[QK4_1 / 2];
};

// Q5_0: 5-bit q = low nibble as Q4_0 | bit 4 from qh, where qh is a 32-bit
// little-endian word whose bit i is the 5th bit of element i.
// y[j] = d * ((lo(qs[j]) | bit(qh, j) << 4) - 16),
// y[j+16] = d * ((hi(qs[j]) | bit(qh, j+16) << 4) - 16).
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];           // high bits, little-endian uint32 (bit i -> element i)
  uint8_t qs[QK5_0 / 2];
};

// Q5_1: as Q5_0 without the -16 offset, plus the min: y = d * q + m.
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};

// Q8_0: y[j] = d * qs[j].
struct block_q8_0 {
  uint16_t d;
  int8_t qs[QK8_0];
};

// IQ4_NL: like Q4_0 but the nibble indexes a non-linear codebook:
// y[j] = d * kIq4nlValues[lo(qs[j])], y[j+16] = d * kIq4nlValues[hi(qs[j])].
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[QK4_NL / 2];
};

// The 16 IQ4_NL code points (ascending, asymmetric around zero).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4 (OCP microscaling, ggml type 39): 32 FP4 (E2M1) values with one E8M0
// exponent: y[j] = kMxfp4Values[lo(qs[j])] * 2^(e - 128) and y[j + 16] with
// hi(qs[j]) (the codebook holds twice the E2M1 values, so the scale is half
// of 2^(e - 127), as ggml's GGML_E8M0_TO_FP32_HALF).
struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[16];
};

// The 16 E2M1 values x 2: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as a float (subnormal for e < 2), exactly.
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- 256-element super-blocks (K-quants) -------------------------------------

// Q2_K: 16 sub-blocks of 16. scales[i]: low nibble = scale, high nibble = min of
// sub-block i. y = d * sc * q - dmin * m, q in 0..3.
// 2-bit quants: the block is two halves of 128; in half h, byte qs[32h + l]
// (l < 32) holds four quants at bit shifts 0, 2, 4, 6. Shift s = 2k covers
// elements 128h + 32k + l, whose sub-block is 8h + 2k + (l >= 16).
struct block_q2_K {
  uint8_t scales[QK_K / 16];  // 4-bit scale | 4-bit min << 4, per sub-block of 16
  uint8_t qs[QK_K / 4];       // 2-bit quants
  uint16_t d;                 // F16 super-scale of the scales
  uint16_t dmin;              // F16 super-scale of the mins
};

// Q3_K: 16 sub-blocks of 16, symmetric. q = (2 low bits) | (high bit) << 2,
// value q - 4 in -4..3. y = d * (sc - 32) * (q - 4).
// Low bits: as Q2_K (half h, byte qs[32h + l], shift 2k -> element 128h + 32k + l).
// High bit of element e (= 128h + 32k + l): bit (4h + k) of hmask[l].
// Note: the stored bit is the high bit itself: hmask bit set -> q in 4..7.
// scales: 16 six-bit values (stored biased by 32), packed in 12 bytes:
//   low 4 bits of scale i: i < 8 ? scales[i] & 0xF : scales[i - 8] >> 4
//   high 2 bits of scale i: (scales[8 + i % 4] >> (2 * (i / 4))) & 3
struct block_q3_K {
  uint8_t hmask[QK_K / 8];  // high bit of each quant
  uint8_t qs[QK_K / 4];     // low 2 bits
  uint8_t scales[12];       // 6-bit scales, packed as above
  uint16_t d;               // F16 super-scale
};

// Q4_K: 8 sub-blocks of 32. y = d * sc * q - dmin * m, q in 0..15.
// Quants: for pair p (0..3), byte qs[32p + l] holds element 64p + l in the low
// nibble and 64p + 32 + l in the high nibble (sub-blocks 2p and 2p + 1).
// scales: 8 six-bit scales sc[j] and 8 six-bit mins m[j] in 12 bytes:
//   j < 4:  sc = scales[j] & 63,            m = scales[j + 4] & 63
//   j >= 4: sc = (scales[j + 4] & 0xF) | (scales[j - 4] >> 6) << 4,
//           m  = (scales[j + 4] >> 4)  | (scales[j] >> 6) << 4
struct block_q4_K {
  uint16_t d;                   // F16 super-scale of the scales
  uint16_t dmin;                // F16 super-scale of the mins
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};

// Q5_K: as Q4_K with a fifth bit: element 64p + l takes bit 2p of qh[l], element
// 64p + 32 + l takes bit 2p + 1 of qh[l] (l < 32). q in 0..31.
struct block_q5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales. y = d * sc * (q - 32),
// q in 0..63 (4 low bits in ql, 2 high bits in qh).
// Two halves of 128; in half h (ql += 64h, qh += 32h, scales += 8h), for l < 32:
//   element 128h +      l: lo(ql[l])      | ((qh[l] >> 0) & 3) << 4, scale sc[l/16 + 0]
//   element 128h + 32 + l: lo(ql[l + 32]) | ((qh[l] >> 2) & 3) << 4, scale sc[l/16 + 2]
//   element 128h + 64 + l: hi(ql[l])      | ((qh[l] >> 4) & 3) << 4, scale sc[l/16 + 4]
//   element 128h + 96 + l: hi(ql[l + 32]) | ((qh[l] >> 6) & 3) << 4, scale sc[l/16 + 6]
struct block_q6_K {
  uint8_t ql[QK_K / 2];     // low 4 bits
  uint8_t qh[QK_K / 4];     // high 2 bits
  int8_t scales[QK_K / 16]; // signed sub-block scales
  uint16_t d;               // F16 super-scale
};

// IQ4_XS: 8 sub-blocks of 32 on the IQ4_NL codebook, 6-bit sub-block scales
// ls = (4 bits of scales_l[j / 2] at 4 (j % 2)) | (bits 2j, 2j + 1 of
// scales_h) << 4; for sub-block j, l < 16:
// y[32j + l] = d * (ls - 32) * kIq4nlValues[lo(qs[16j + l])],
// y[32j + 16 + l] = d * (ls - 32) * kIq4nlValues[hi(qs[16j + l])].
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};

// ---- layout checks against the dtype table ----------------------------------

template <typename B>
constexpr bool kIsPlainBlock = std::is_trivially_copyable_v<B> && std::is_standard_layout_v<B> &&
                               alignof(B) <= 2;

static_assert(sizeof(block_q4_0) == 18 && kIsPlainBlock<block_q4_0>);
static_assert(sizeof(block_q4_1) == 20 && kIsPlainBlock<block_q4_1>);
static_assert(sizeof(block_q5_0) == 22 && kIsPlainBlock<block_q5_0>);
static_assert(sizeof(block_q5_1) == 24 && kIsPlainBlock<block_q5_1>);
static_assert(sizeof(block_q8_0) == 34 && kIsPlainBlock<block_q8_0>);
static_assert(sizeof(block_iq4_nl) == 18 && kIsPlainBlock<block_iq4_nl>);
static_assert(sizeof(block_mxfp4) == 17 && kIsPlainBlock<block_mxfp4>);
static_assert(sizeof(block_q2_K) == 84 && kIsPlainBlock<block_q2_K>);
static_assert(sizeof(block_q3_K) == 110 && kIsPlainBlock<block_q3_K>);
static_assert(sizeof(block_q4_K) == 144 && kIsPlainBlock<block_q4_K>);
static_assert(sizeof(block_q5_K) == 176 && kIsPlainBlock<block_q5_K>);
static_assert(sizeof(block_q6_K) == 210 && kIsPlainBlock<block_q6_K>);
static_assert(sizeof(block_iq4_xs) == 136 && kIsPlainBlock<block_iq4_xs>);
static_assert(offsetof(block_q2_K, d) == 80 && offsetof(block_q3_K, d) == 108);
static_assert(offsetof(block_q5_K, qs) == 48 && offsetof(block_q6_K, d) == 208);

// The DType each block struct encodes, and its elements per block (tests check
// these against dtype_traits()).
template <typename B> struct BlockOf;
template <> struct BlockOf<block_q4_0> { static constexpr DType type = DType::q4_0; static constexpr int qk = QK4_0; };
template <> struct BlockOf<block_q4_1> { static constexpr DType type = DType::q4_1; static constexpr int qk = QK4_1; };
template <> struct BlockOf<block_q5_0> { static constexpr DType type = DType::q5_0; static constexpr int qk = QK5_0; };
template <> struct BlockOf<block_q5_1> { static constexpr DType type = DType::q5_1; static constexpr int qk = QK5_1; };
template <> struct BlockOf<block_q8_0> { static constexpr DType type = DType::q8_0; static constexpr int qk = QK8_0; };
template <> struct BlockOf<block_iq4_nl> { static constexpr DType type = DType::iq4_nl; static constexpr int qk = QK4_NL; };
template <> struct BlockOf<block_mxfp4> { static constexpr DType type = DType::mxfp4; static constexpr int qk = 32; };
template <> struct BlockOf<block_q2_K> { static constexpr DType type = DType::q2_k; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_q3_K> { static constexpr DType type = DType::q3_k; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_q4_K> { static constexpr DType type = DType::q4_k; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_q5_K> { static constexpr DType type = DType::q5_k; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_q6_K> { static constexpr DType type = DType::q6_k; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq4_xs> { static constexpr DType type = DType::iq4_xs; static constexpr int qk = QK_K; };

}  // namespace serval
