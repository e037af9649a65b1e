#include "kernels/packed_kq.h"

#include <cstddef>
#include <cstring>

#include "kernels/kernel_table.h"
#include "tensor/quant_blocks.h"

namespace serval::kernels::detail {
namespace {

static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 &&
              sizeof(block_q6_K) == 210 && sizeof(block_iq4_xs) == 136);
constexpr size_t kQ4Sc = 2048, kQ4Mn = 2176, kQ4D = 2304, kQ4Dmin = 2336;
constexpr size_t kQ5Qh = 2048, kQ5Shift = 512;  // Q5_K: qh, then Q4_K's fields 512 bytes later
constexpr size_t kQ6Qh = 2048, kQ6Sc = 3072, kQ6D = 3328;
constexpr size_t kXsSc = 2048, kXsD = 2176;
constexpr size_t kQ3Hm = 1024, kQ3Sc = 1536, kQ3D = 1792;
constexpr size_t kQ2Sm = 1024, kQ2D = 1280, kQ2Dmin = 1312;

// Q3_K's 12 scale bytes <-> 16 six-bit scales, biased by 32 (quant_blocks.h).
void q3_scales_unpack(const uint8_t* s, int8_t out[16]) {
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = (int8_t)((lo | (hi << 4)) - 32);
  }
}
void q3_scales_pack(const int8_t in[16], uint8_t* s) {
  std::memset(s, 0, 12);
  for (int i = 0; i < 16; ++i) {
    const int v = in[i] + 32;
    s[i < 8 ? i : i - 8] |= (uint8_t)((v & 0x0F) << (i < 8 ? 0 : 4));
    s[8 + i % 4] |= (uint8_t)(((v >> 4) & 3) << (2 * (i / 4)));
  }
}

// Q4_K's 12 scale bytes <-> 8 six-bit scales and mins (llama.cpp's get_scale_min_k4).
void k4_unpack(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
    mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}
void k4_pack(const uint8_t sc[8], const uint8_t mn[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = (uint8_t)((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
}

// Q6_K's ql/qh <-> q[256] in 0..63 (element 128h + 32r + l: see ref/dequantize.cpp).
void q6_unpack(const block_q6_K& b, uint8_t q[256]) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l)
      for (int r = 0; r < 4; ++r) {
        const uint8_t low = b.ql[64 * h + l + 32 * (r % 2)];
        q[128 * h + 32 * r + l] = (uint8_t)((r < 2 ? low & 15 : low >> 4) | (((b.qh[32 * h + l] >> (2 * r)) & 3) << 4));
      }
}
void q6_pack(const uint8_t q[256], block_q6_K& b) {
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l)
      for (int r = 0; r < 4; ++r) {
        const uint8_t v = q[128 * h + 32 * r + l];
        b.ql[64 * h + l + 32 * (r % 2)] |= (uint8_t)((v & 15) << (r < 2 ? 0 : 4));
        b.qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * r));
      }
}

// Packed Q6_K: element 64p + 32hi + 4i + j of row l is nibble hi of ql vector
// 8p + i (byte 4l + j), its high bits in slot 2 (i % 2) + hi of qh vector 4p + i / 2.
size_t q6_ql(int e, int l) { return (size_t)64 * (8 * (e / 64) + (e % 32) / 4) + 4 * l + e % 4; }
size_t q6_qh(int e, int l) { return kQ6Qh + (size_t)64 * (4 * (e / 64) + (e % 32) / 8) + 4 * l + e % 4; }
int q6_slot(int e) { return 2 * (((e % 32) / 4) % 2) + (e % 64) / 32; }

}  // namespace

size_t kx16_sb_bytes(DType t) {
  switch (t) {
    case DType::q2_k: return kQ2Kx16SbBytes;
    case DType::q3_k: return kQ3Kx16SbBytes;
    case DType::q4_k: return kQ4Kx16SbBytes;
    case DType::q5_k: return kQ5Kx16SbBytes;
    case DType::q6_k: return kQ6Kx16SbBytes;
    case DType::iq4_xs: return kIq4XsX16SbBytes;
    default: return 0;
  }
}

void kx16_put(DType t, uint8_t* sb16, int l, const uint8_t* blk) {
  if (t == DType::q4_k || t == DType::q5_k) {
    // Q5_K is Q4_K's fields (d, dmin, scales, qs) with qh between scales and qs.
    block_q4_K b;
    block_q5_K b5;
    size_t at = 0;
    if (t == DType::q5_k) {
      std::memcpy(&b5, blk, sizeof b5);
      std::memcpy(&b, &b5, offsetof(block_q4_K, qs));  // d, dmin, scales
      std::memcpy(b.qs, b5.qs, sizeof b.qs);
      for (int v = 0; v < 8; ++v) std::memcpy(sb16 + kQ5Qh + 64 * v + 4 * l, b5.qh + 4 * v, 4);
      at = kQ5Shift;
    } else {
      std::memcpy(&b, blk, sizeof b);
    }
    for (int v = 0; v < 32; ++v) std::memcpy(sb16 + 64 * v + 4 * l, b.qs + 4 * v, 4);
    uint8_t sc[8], mn[8];
    k4_unpack(b.scales, sc, mn);
    for (int j = 0; j < 8; ++j) {
      sb16[at + kQ4Sc + 16 * j + l] = sc[j];
      sb16[at + kQ4Mn + 16 * j + l] = mn[j];
    }
    std::memcpy(sb16 + at + kQ4D + 2 * l, &b.d, 2);
    std::memcpy(sb16 + at + kQ4Dmin + 2 * l, &b.dmin, 2);
    return;
  }
  if (t == DType::q2_k) {
    block_q2_K b;
    std::memcpy(&b, blk, sizeof b);
    for (int v = 0; v < 16; ++v) std::memcpy(sb16 + 64 * v + 4 * l, b.qs + 4 * v, 4);
    for (int k = 0; k < 16; ++k) sb16[kQ2Sm + 16 * k + l] = b.scales[k];
    std::memcpy(sb16 + kQ2D + 2 * l, &b.d, 2);
    std::memcpy(sb16 + kQ2Dmin + 2 * l, &b.dmin, 2);
    return;
  }
  if (t == DType::q3_k) {
    block_q3_K b;
    std::memcpy(&b, blk, sizeof b);
    for (int v = 0; v < 16; ++v) std::memcpy(sb16 + 64 * v + 4 * l, b.qs + 4 * v, 4);
    for (int v = 0; v < 8; ++v) std::memcpy(sb16 + kQ3Hm + 64 * v + 4 * l, b.hmask + 4 * v, 4);
    int8_t sc[16];
    q3_scales_unpack(b.scales, sc);
    for (int k = 0; k < 16; ++k) sb16[kQ3Sc + 16 * k + l] = (uint8_t)sc[k];
    std::memcpy(sb16 + kQ3D + 2 * l, &b.d, 2);
    return;
  }
  if (t == DType::iq4_xs) {
    block_iq4_xs b;
    std::memcpy(&b, blk, sizeof b);
    for (int j = 0; j < 8; ++j) {
      for (int k = 0; k < 4; ++k) std::memcpy(sb16 + 64 * (4 * j + k) + 4 * l, b.qs + 16 * j + 4 * k, 4);
      const int ls = ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
      sb16[kXsSc + 16 * j + l] = (uint8_t)(int8_t)(ls - 32);
    }
    std::memcpy(sb16 + kXsD + 2 * l, &b.d, 2);
    return;
  }
  block_q6_K b;
  std::memcpy(&b, blk, sizeof b);
  uint8_t q[256];
  q6_unpack(b, q);
  for (int e = 0; e < 256; ++e) {
    const int hi = (e % 64) / 32;
    sb16[q6_ql(e, l)] |= (uint8_t)((q[e] & 15) << (4 * hi));
    sb16[q6_qh(e, l)] |= (uint8_t)((q[e] >> 4) << (2 * q6_slot(e)));
  }
  for (int k = 0; k < 16; ++k) sb16[kQ6Sc + 16 * k + l] = (uint8_t)b.scales[k];
  std::memcpy(sb16 + kQ6D + 2 * l, &b.d, 2);
}

void kx16_get(DType t, const uint8_t* sb16, int l, uint8_t* blk) {
  if (t == DType::q4_k || t == DType::q5_k) {
    const size_t at = t == DType::q5_k ? kQ5Shift : 0;
    block_q4_K b;
    for (int v = 0; v < 32; ++v) std::memcpy(b.qs + 4 * v, sb16 + 64 * v + 4 * l, 4);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = sb16[at + kQ4Sc + 16 * j + l];
      mn[j] = sb16[at + kQ4Mn + 16 * j + l];
    }
    k4_pack(sc, mn, b.scales);
    std::memcpy(&b.d, sb16 + at + kQ4D + 2 * l, 2);
    std::memcpy(&b.dmin, sb16 + at + kQ4Dmin + 2 * l, 2);
    if (t == DType::q4_k) {
      std::memcpy(blk, &b, sizeof b);
      return;
    }
    block_q5_K b5;
    std::memcpy(&b5, &b, offsetof(block_q4_K, qs));
    std::memcpy(b5.qs, b.qs, sizeof b5.qs);
    for (int v = 0; v < 8; ++v) std::memcpy(b5.qh + 4 * v, sb16 + kQ5Qh + 64 * v + 4 * l, 4);
    std::memcpy(blk, &b5, sizeof b5);
    return;
  }
  if (t == DType::q2_k) {
    block_q2_K b;
    for (int v = 0; v < 16; ++v) std::memcpy(b.qs + 4 * v, sb16 + 64 * v + 4 * l, 4);
    for (int k = 0; k < 16; ++k) b.scales[k] = sb16[kQ2Sm + 16 * k + l];
    std::memcpy(&b.d, sb16 + kQ2D + 2 * l, 2);
    std::memcpy(&b.dmin, sb16 + kQ2Dmin + 2 * l, 2);
    std::memcpy(blk, &b, sizeof b);
    return;
  }
  if (t == DType::q3_k) {
    block_q3_K b;
    for (int v = 0; v < 16; ++v) std::memcpy(b.qs + 4 * v, sb16 + 64 * v + 4 * l, 4);
    for (int v = 0; v < 8; ++v) std::memcpy(b.hmask + 4 * v, sb16 + kQ3Hm + 64 * v + 4 * l, 4);
    int8_t sc[16];
    for (int k = 0; k < 16; ++k) sc[k] = (int8_t)sb16[kQ3Sc + 16 * k + l];
    q3_scales_pack(sc, b.scales);
    std::memcpy(&b.d, sb16 + kQ3D + 2 * l, 2);
    std::memcpy(blk, &b, sizeof b);
    return;
  }
  if (t == DType::iq4_xs) {
    block_iq4_xs b{};
    for (int j = 0; j < 8; ++j) {
      for (int k = 0; k < 4; ++k) std::memcpy(b.qs + 16 * j + 4 * k, sb16 + 64 * (4 * j + k) + 4 * l, 4);
      const int ls = (int8_t)sb16[kXsSc + 16 * j + l] + 32;
      b.scales_l[j / 2] |= (uint8_t)((ls & 0xF) << (4 * (j % 2)));
      b.scales_h |= (uint16_t)((ls >> 4) << (2 * j));
    }
    std::memcpy(&b.d, sb16 + kXsD + 2 * l, 2);
    std::memcpy(blk, &b, sizeof b);
    return;
  }
  block_q6_K b;
  uint8_t q[256];
  for (int e = 0; e < 256; ++e) {
    const int hi = (e % 64) / 32;
    q[e] = (uint8_t)(((sb16[q6_ql(e, l)] >> (4 * hi)) & 15) | (((sb16[q6_qh(e, l)] >> (2 * q6_slot(e))) & 3) << 4));
  }
  q6_pack(q, b);
  for (int k = 0; k < 16; ++k) b.scales[k] = (int8_t)sb16[kQ6Sc + 16 * k + l];
  std::memcpy(&b.d, sb16 + kQ6D + 2 * l, 2);
  std::memcpy(blk, &b, sizeof b);
}

}  // namespace serval::kernels::detail
