// Internal to kernels/: the lattice (IQ1/IQ2/IQ3) and ternary (TQ) super-blocks
// decoded to integers for the integer-dot kernels: y[e] = d * sc[e / 16] * q[e]
// exactly (as real numbers), with q[256] signed bytes (|q| <= 62), sc[16]
// signed bytes (1..31) and d a float (the F16 scale times a power of two,
// exact). Scalar code shared by every SIMD level (x86/matmul_tmpl.inc
// includes it inside its target region), so the integers are the same on all.
//
//   type      q                       sc (per 16)        d
//   IQ2_XXS   grid * sign (8..43)     2 ls + 1           d / 8
//   IQ2_XS/S  grid * sign             2 s + 1 (per 16)   d / 8
//   IQ3_XXS   grid * sign (4..62)     2 ls + 1           d / 4
//   IQ3_S     grid * sign (1..15)     2 s + 1            d
//   IQ1_S     8 g + (+-1), g in -1..1 2 s + 1            d / 8
//   IQ1_M     8 g + (+-1)             2 s + 1 (per 16)   d / 8
//   TQ1_0/2_0 t - 1 in -1..1          1                  d
//
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "common/fp16.h"
#include "tensor/iq_grids.h"
#include "tensor/quant_blocks.h"

namespace serval::kernels::detail {

// kIqSignMask[s]: byte j = 0xFF where bit j of the sign byte s is set.
inline constexpr std::array<uint64_t, 256> kIqSignMask = [] {
  std::array<uint64_t, 256> t{};
  for (int s = 0; s < 256; ++s)
    for (int j = 0; j < 8; ++j)
      if (s >> j & 1) t[(size_t)s] |= 0xFFull << (8 * j);
  return t;
}();

// The sign byte of each 7-bit sign field (iq_sign_byte), looked up.
inline constexpr std::array<uint8_t, 128> kIqSign7 = [] {
  std::array<uint8_t, 128> t{};
  for (uint32_t v = 0; v < 128; ++v) t[v] = iq_sign_byte(v);
  return t;
}();

// Grid bytes (all >= 1) negated where the mask byte is 0xFF: -g = (g ^ 0xFF) + 1,
// and no byte carries since g >= 1.
inline uint64_t iq_apply_signs(uint64_t g, uint64_t m) { return (g ^ m) + (m & 0x0101010101010101ull); }

inline void iq_put8(int8_t* q, uint64_t v) { std::memcpy(q, &v, 8); }
inline uint32_t iq_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline float iq_decode(const block_iq2_xxs& b, int8_t* q, int8_t* sc) {
  const uint64_t* grid = iq2xxs_grid();
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t a = iq_u32(b.qs + 4 * ib), s = iq_u32(b.qs + 4 * ib + 2);
    sc[2 * ib] = sc[2 * ib + 1] = (int8_t)(2 * (s >> 28) + 1);
    for (int l = 0; l < 4; ++l)
      iq_put8(q + 32 * ib + 8 * l, iq_apply_signs(grid[(a >> (8 * l)) & 255], kIqSignMask[iq_sign_byte(s >> (7 * l))]));
  }
  return fp16_to_fp32(b.d) * 0.125f;
}

inline float iq_decode(const block_iq2_xs& b, int8_t* q, int8_t* sc) {
  const uint64_t* grid = iq2xs_grid();
  for (int ib = 0; ib < 8; ++ib) {
    sc[2 * ib] = (int8_t)(2 * (b.scales[ib] & 15) + 1);
    sc[2 * ib + 1] = (int8_t)(2 * (b.scales[ib] >> 4) + 1);
    for (int l = 0; l < 4; ++l) {
      const uint16_t v = b.qs[4 * ib + l];
      iq_put8(q + 32 * ib + 8 * l, iq_apply_signs(grid[v & 511], kIqSignMask[iq_sign_byte(v >> 9)]));
    }
  }
  return fp16_to_fp32(b.d) * 0.125f;
}

inline float iq_decode(const block_iq2_s& b, int8_t* q, int8_t* sc) {
  const uint64_t* grid = iq2s_grid();
  for (int ib = 0; ib < 8; ++ib) {
    sc[2 * ib] = (int8_t)(2 * (b.scales[ib] & 15) + 1);
    sc[2 * ib + 1] = (int8_t)(2 * (b.scales[ib] >> 4) + 1);
    for (int l = 0; l < 4; ++l) {
      const int idx = b.qs[4 * ib + l] | ((b.qh[ib] >> (2 * l)) & 3) << 8;
      iq_put8(q + 32 * ib + 8 * l, iq_apply_signs(grid[idx], kIqSignMask[b.qs[32 + 4 * ib + l]]));
    }
  }
  return fp16_to_fp32(b.d) * 0.125f;
}

inline float iq_decode(const block_iq3_xxs& b, int8_t* q, int8_t* sc) {
  const uint32_t* grid = iq3xxs_grid();
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t w = iq_u32(b.qs + 64 + 4 * ib);
    sc[2 * ib] = sc[2 * ib + 1] = (int8_t)(2 * (w >> 28) + 1);
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = (uint64_t)grid[b.qs[8 * ib + 2 * l]] | (uint64_t)grid[b.qs[8 * ib + 2 * l + 1]] << 32;
      iq_put8(q + 32 * ib + 8 * l, iq_apply_signs(g, kIqSignMask[iq_sign_byte(w >> (7 * l))]));
    }
  }
  return fp16_to_fp32(b.d) * 0.25f;
}

inline float iq_decode(const block_iq3_s& b, int8_t* q, int8_t* sc) {
  const uint32_t* grid = iq3s_grid();
  for (int ib = 0; ib < 8; ++ib) {
    sc[2 * ib] = sc[2 * ib + 1] = (int8_t)(2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1);
    const uint8_t* qs = b.qs + 8 * ib;
    const int qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const int i0 = qs[2 * l] | ((qh >> (2 * l)) & 1) << 8, i1 = qs[2 * l + 1] | ((qh >> (2 * l + 1)) & 1) << 8;
      const uint64_t g = (uint64_t)grid[i0] | (uint64_t)grid[i1] << 32;
      iq_put8(q + 32 * ib + 8 * l, iq_apply_signs(g, kIqSignMask[b.signs[4 * ib + l]]));
    }
  }
  return fp16_to_fp32(b.d);
}

// 8 g + 1 per byte (g in -1..1 as int8 bytes), or 8 g - 1 where the shift is
// negative: -9..9. Eight bytes at once: 8 g is the word shifted by 3 with each
// byte's spill into its neighbour masked off; + 1 is an OR (the low 3 bits
// are 0); - 1 adds 0xFF to every byte with no carry between bytes (low 7 bits
// added, the top bit by XOR).
inline uint64_t iq1_values(uint64_t g, bool neg) {
  constexpr uint64_t kTop = 0x8080808080808080ull;
  const uint64_t g8 = (g << 3) & 0xF8F8F8F8F8F8F8F8ull;
  if (!neg) return g8 | 0x0101010101010101ull;
  return ((g8 & ~kTop) + ~kTop) ^ (~g8 & kTop);
}

inline float iq_decode(const block_iq1_s& b, int8_t* q, int8_t* sc) {
  const uint64_t* grid = iq1s_grid();
  for (int ib = 0; ib < 8; ++ib) {
    uint16_t qh;
    std::memcpy(&qh, &b.qh[ib], 2);
    sc[2 * ib] = sc[2 * ib + 1] = (int8_t)(2 * ((qh >> 12) & 7) + 1);
    const bool neg = (qh & 0x8000) != 0;
    for (int l = 0; l < 4; ++l)
      iq_put8(q + 32 * ib + 8 * l, iq1_values(grid[b.qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8], neg));
  }
  return fp16_to_fp32(b.d) * 0.125f;
}

inline float iq_decode(const block_iq1_m& b, int8_t* q, int8_t* sc) {
  const uint64_t* grid = iq1s_grid();
  uint16_t w[4];
  std::memcpy(w, b.scales, 8);
  const uint16_t dbits = iq1_m_scale_bits(b);
  for (int ib = 0; ib < 8; ++ib) {
    sc[2 * ib] = (int8_t)(2 * ((w[ib / 2] >> (6 * (ib % 2))) & 7) + 1);
    sc[2 * ib + 1] = (int8_t)(2 * ((w[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1);
    for (int l = 0; l < 4; ++l) {
      const int h = b.qh[2 * ib + l / 2] >> (4 * (l % 2));
      iq_put8(q + 32 * ib + 8 * l, iq1_values(grid[b.qs[4 * ib + l] | (h & 7) << 8], (h & 8) != 0));
    }
  }
  return fp16_to_fp32(dbits) * 0.125f;
}

inline float iq_decode(const block_tq1_0& b, int8_t* q, int8_t* sc) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  auto trit = [](uint8_t v, int n) { return (int)(((uint16_t)(uint8_t)(v * kPow3[n]) * 3) >> 8) - 1; };
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) q[32 * n + m] = (int8_t)trit(b.qs[m], n);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) q[160 + 16 * n + m] = (int8_t)trit(b.qs[32 + m], n);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) q[240 + 4 * n + j] = (int8_t)trit(b.qh[j], n);
  for (int k = 0; k < 16; ++k) sc[k] = 1;
  return fp16_to_fp32(b.d);
}

inline float iq_decode(const block_tq2_0& b, int8_t* q, int8_t* sc) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int m = 0; m < 32; ++m) q[128 * h + 32 * k + m] = (int8_t)(((b.qs[32 * h + m] >> (2 * k)) & 3) - 1);
  for (int k = 0; k < 16; ++k) sc[k] = 1;
  return fp16_to_fp32(b.d);
}

// The IQDx16 layout (n > 1): one super-block of 16 rows decoded, for the
// packed K-family tiles (x86/packed_kq.inc, PolIqDx16), built per group of
// 16 rows in scratch at each matmul (the stored blocks stay as they are):
//   uint8_t q[16 sub-blocks j][4 vectors i][16 rows r][4]  q + 64 (2..126) of
//           elements 16 j + 4 i .. + 3 of row r   (bytes 0 .. 4095)
//   int8_t  sc[16 j][16 r]                         (bytes 4096 .. 4351)
//   float   d[16 r]                                (bytes 4352 .. 4415)
inline constexpr size_t kIqDx16SbBytes = 4416, kIqDx16Sc = 4096, kIqDx16D = 4352;

// Row r of an IQDx16 super-block from the stored block b.
template <class Blk>
inline void iq_dx16_put(const Blk& b, uint8_t* sb, int r) {
  alignas(64) int8_t q[256];
  int8_t sc[16];
  const float d = iq_decode(b, q, sc);
  for (int k = 0; k < 64; ++k) {  // k = 4 j + i: elements 4k .. 4k + 3
    uint32_t v;
    std::memcpy(&v, q + 4 * k, 4);
    v = ((v & 0x7F7F7F7Fu) + 0x40404040u) ^ (v & 0x80808080u);  // + 64 per byte, no carries (|q| <= 62)
    std::memcpy(sb + 64 * k + 4 * r, &v, 4);
  }
  for (int j = 0; j < 16; ++j) sb[kIqDx16Sc + 16 * j + r] = (uint8_t)sc[j];
  std::memcpy(sb + kIqDx16D + 4 * r, &d, 4);
}

}  // namespace serval::kernels::detail
