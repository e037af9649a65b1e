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

// ---- 256-element super-blocks on lattice codebooks (IQ1/IQ2/IQ3) and ternary
// types (TQ). The codebooks ("grids") are in tensor/iq_grids.h: entry i of a
// grid holds 8 (or 4) unsigned magnitudes, element j of the group in byte j.
// A sign byte s (kmask bit j = 1 << j) negates element j when bit j is set;
// the 7-bit sign fields of IQ2_XXS / IQ2_XS / IQ3_XXS name one of the 128
// bytes of even parity: s = v | parity(v) << 7 (iq_sign_byte below).
// Every super-block is 8 sub-blocks of 32 elements = 4 groups of 8; "group
// (ib, l)" is elements 32 ib + 8 l .. + 7.

// IQ2_XXS (2.06 bpw): sub-block ib takes the two 32-bit words
// a = qs[4ib] | qs[4ib+1] << 16 and b = qs[4ib+2] | qs[4ib+3] << 16. Group l
// is grid entry byte l of a (kIq2xxs, 256 entries), its signs the 7 bits of b
// at 7l; the scale is b >> 28: y = d * (0.5 + (b >> 28)) * 0.25 * grid * sign.
struct block_iq2_xxs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
};
// IQ2_XS (2.31 bpw): group l of sub-block ib is qs[4ib + l]: the low 9 bits
// index kIq2xs (512 entries), the high 7 bits are its sign field; scales[ib]
// holds a 4-bit scale for groups 0-1 (low nibble) and 2-3 (high nibble):
// y = d * (0.5 + s) * 0.25 * grid * sign.
struct block_iq2_xs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
  uint8_t scales[QK_K / 32];
};
// IQ2_S (2.56 bpw): group l of sub-block ib has index qs[4ib + l] |
// ((qh[ib] >> 2l) & 3) << 8 into kIq2s (1024 entries) and the full sign byte
// signs[4ib + l] (the second half of qs); scales as IQ2_XS.
struct block_iq2_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];  // [0, 32): grid index low bits; [32, 64): sign bytes
  uint8_t qh[QK_K / 32];
  uint8_t scales[QK_K / 32];
};
// IQ3_XXS (3.06 bpw): group l of sub-block ib is two 4-element halves, grid
// entries qs[8ib + 2l] and qs[8ib + 2l + 1] of kIq3xxs (256 entries of 4);
// the 32-bit word w = sas[ib] (sas = the last 32 bytes, as 8 words) gives the
// sign field of group l at 7l and the scale w >> 28:
// y = d * (0.5 + (w >> 28)) * 0.5 * grid * sign.
struct block_iq3_xxs {
  uint16_t d;
  uint8_t qs[3 * QK_K / 8];  // [0, 64): grid indices; [64, 96): 8 scale-and-sign words
};
// IQ3_S (3.44 bpw): group l of sub-block ib is two 4-element halves with 9-bit
// indices qs[8ib + 2l + h] | bit (2l + h) of qh[ib] << 8 into kIq3s (512
// entries of 4), sign byte signs[4ib + l]; the 4-bit scale s of sub-block ib
// is nibble ib % 2 of scales[ib / 2]: y = d * (1 + 2s) * grid * sign.
struct block_iq3_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t signs[QK_K / 8];
  uint8_t scales[QK_K / 64];
};
// IQ1_S (1.56 bpw): group l of sub-block ib indexes kIq1s (2048 entries of
// int8 values in {-1, 0, 1}) with qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8;
// bits 12-14 of qh[ib] are the scale s, bit 15 the sign of the shift:
// y = d * (2s + 1) * (grid + delta), delta = -0.125 if bit 15 else +0.125.
struct block_iq1_s {
  uint16_t d;
  uint8_t qs[QK_K / 8];
  uint16_t qh[QK_K / 32];
};
// IQ1_M (1.75 bpw): no stored d; the F16 super-scale is the top nibbles of
// the four 16-bit scale words w[k] = scales[2k] | scales[2k+1] << 8:
// d bits = w0 >> 12 | (w1 >> 8 & 0xF0) | (w2 >> 4 & 0xF00) | (w3 & 0xF000).
// Group l of sub-block ib indexes kIq1s with qs[4ib + l] | 3 bits of
// qh[2ib + l / 2] at 4 (l % 2) << 8; bit 3 + 4 (l % 2) of that byte is the
// shift's sign. The 3-bit scales of groups 0-1 and 2-3 are bits
// 6 (ib % 2) and 6 (ib % 2) + 3 of w[ib / 2]: y = d * (2s + 1) * (grid + delta).
struct block_iq1_m {
  uint8_t qs[QK_K / 8];
  uint8_t qh[QK_K / 16];
  uint8_t scales[QK_K / 32];
};
// The F16 bits of an IQ1_M block's super-scale (see above).
inline uint16_t iq1_m_scale_bits(const block_iq1_m& b) {
  uint16_t w[4];
  std::memcpy(w, b.scales, 8);
  return (uint16_t)((w[0] >> 12) | ((w[1] >> 8) & 0x00F0) | ((w[2] >> 4) & 0x0F00) | (w[3] & 0xF000));
}
// TQ1_0 (1.69 bpw, ternary): 5 trits per byte of qs (48 bytes: 240 elements)
// and 4 per byte of qh (16). Trit n of byte q is ((uint8_t)(q * 3^n) * 3) >> 8
// (the byte is a base-3 fraction, most significant trit first); y = d * (t - 1).
// Element order: for the first 32 bytes of qs, trit n of byte m is element
// 32n + m; for the last 16, element 160 + 16n + m; for qh, element 240 + 4n + j.
struct block_tq1_0 {
  uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
  uint8_t qh[QK_K / 64];
  uint16_t d;
};
// TQ2_0 (2.06 bpw, ternary): 2 bits per element, value q - 1 in {-1, 0, 1}:
// element 128h + 32k + m is bits 2k, 2k + 1 of qs[32h + m]; y = d * (q - 1).
struct block_tq2_0 {
  uint8_t qs[QK_K / 4];
  uint16_t d;
};
// The sign byte of a 7-bit IQ2_XXS / IQ2_XS / IQ3_XXS sign field: bit 7 makes
// the parity even.
constexpr uint8_t iq_sign_byte(uint32_t v7) {
  const uint32_t v = v7 & 127;
  uint32_t p = v;
  p ^= p >> 4;
  p ^= p >> 2;
  p ^= p >> 1;
  return (uint8_t)(v | (p & 1) << 7);
}

static_assert(sizeof(block_iq2_xxs) == 66 && sizeof(block_iq2_xs) == 74 && sizeof(block_iq2_s) == 82);
static_assert(sizeof(block_iq3_xxs) == 98 && sizeof(block_iq3_s) == 110);
static_assert(sizeof(block_iq1_s) == 50 && sizeof(block_iq1_m) == 56);
static_assert(sizeof(block_tq1_0) == 54 && sizeof(block_tq2_0) == 66);


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
template <> struct BlockOf<block_iq2_xxs> { static constexpr DType type = DType::iq2_xxs; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq2_xs> { static constexpr DType type = DType::iq2_xs; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq2_s> { static constexpr DType type = DType::iq2_s; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq3_xxs> { static constexpr DType type = DType::iq3_xxs; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq3_s> { static constexpr DType type = DType::iq3_s; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq1_s> { static constexpr DType type = DType::iq1_s; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_iq1_m> { static constexpr DType type = DType::iq1_m; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_tq1_0> { static constexpr DType type = DType::tq1_0; static constexpr int qk = QK_K; };
template <> struct BlockOf<block_tq2_0> { static constexpr DType type = DType::tq2_0; static constexpr int qk = QK_K; };

}  // namespace serval
