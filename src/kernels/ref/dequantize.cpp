// Scalar dequantization of every supported block format. The bit layouts are
// documented on the structs in tensor/quant_blocks.h; the arithmetic below is
// float, in the order ggml evaluates it (scale products first, then the quant),
// so results are bit-identical to ggml's reference dequantization.
#include <cstring>

#include "common/fp16.h"
#include "kernels/ref/quants_impl.h"

namespace serval::ref::detail {
namespace {

inline uint32_t load_u32le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian host
  return v;
}

}  // namespace

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK4_0) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = (float)((x[b].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK4_1) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = (float)(x[b].qs[j] & 0x0F) * d + m;
      y[j + QK4_1 / 2] = (float)(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK5_0) {
    const float d = fp16_to_fp32(x[b].d);
    const uint32_t qh = load_u32le(x[b].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int hi0 = (int)((qh >> j) & 1) << 4;
      const int hi1 = (int)((qh >> (j + 16)) & 1) << 4;
      y[j] = (float)(((x[b].qs[j] & 0x0F) | hi0) - 16) * d;
      y[j + QK5_0 / 2] = (float)(((x[b].qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK5_1) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    const uint32_t qh = load_u32le(x[b].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int hi0 = (int)((qh >> j) & 1) << 4;
      const int hi1 = (int)((qh >> (j + 16)) & 1) << 4;
      y[j] = (float)((x[b].qs[j] & 0x0F) | hi0) * d + m;
      y[j + QK5_1 / 2] = (float)((x[b].qs[j] >> 4) | hi1) * d + m;
    }
  }
}

void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK8_0) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = (float)x[b].qs[j] * d;
  }
}

void dequantize_iq4_nl(const block_iq4_nl* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK4_NL) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * (float)kIq4nlValues[x[b].qs[j] & 0x0F];
      y[j + QK4_NL / 2] = d * (float)kIq4nlValues[x[b].qs[j] >> 4];
    }
  }
}

void dequantize_mxfp4(const block_mxfp4* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += 32) {
    const float d = mxfp4_scale(x[b].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * (float)kMxfp4Values[x[b].qs[j] & 0x0F];
      y[j + 16] = d * (float)kMxfp4Values[x[b].qs[j] >> 4];
    }
  }
}

// q2_K: element 128h + 32k + l (h < 2, k < 4, l < 32) is bits [2k, 2k+2) of
// qs[32h + l]; its sub-block (of 16) is 8h + 2k + l / 16.
void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = x[b].qs + 32 * h;
      for (int k = 0; k < 4; ++k) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[b].scales[8 * h + 2 * k + half];
          const float dl = d * (float)(sc & 0x0F);
          const float ml = dmin * (float)(sc >> 4);
          for (int l = 16 * half; l < 16 * half + 16; ++l)
            y[128 * h + 32 * k + l] = dl * (float)((q[l] >> (2 * k)) & 3) - ml;
        }
      }
    }
  }
}

void unpack_scales_q3_K(const uint8_t* s, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

// q3_K: low 2 bits as q2_K; the high bit of element 128h + 32k + l is bit
// 4h + k of hmask[l]. A clear high bit means the value is (low bits) - 4.
void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK_K) {
    const float d = fp16_to_fp32(x[b].d);
    int8_t sc[16];
    unpack_scales_q3_K(x[b].scales, sc);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = x[b].qs + 32 * h;
      for (int k = 0; k < 4; ++k) {
        const uint8_t hbit = (uint8_t)(1u << (4 * h + k));
        for (int half = 0; half < 2; ++half) {
          const float dl = d * (float)sc[8 * h + 2 * k + half];
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int v = ((q[l] >> (2 * k)) & 3) - ((x[b].hmask[l] & hbit) ? 0 : 4);
            y[128 * h + 32 * k + l] = dl * (float)v;
          }
        }
      }
    }
  }
}

void unpack_scale_min_k4(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// q4_K: byte qs[32p + l] holds element 64p + l (low nibble, sub-block 2p) and
// 64p + 32 + l (high nibble, sub-block 2p + 1).
void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int p = 0; p < 4; ++p) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(x[b].scales, 2 * p, &sc0, &m0);
      unpack_scale_min_k4(x[b].scales, 2 * p + 1, &sc1, &m1);
      const float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
      const uint8_t* q = x[b].qs + 32 * p;
      for (int l = 0; l < 32; ++l) {
        y[64 * p + l] = d0 * (float)(q[l] & 0x0F) - mn0;
        y[64 * p + 32 + l] = d1 * (float)(q[l] >> 4) - mn1;
      }
    }
  }
}

// q5_K: as q4_K plus a fifth bit: bit 2p of qh[l] for element 64p + l and bit
// 2p + 1 for element 64p + 32 + l.
void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int p = 0; p < 4; ++p) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(x[b].scales, 2 * p, &sc0, &m0);
      unpack_scale_min_k4(x[b].scales, 2 * p + 1, &sc1, &m1);
      const float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
      const uint8_t* q = x[b].qs + 32 * p;
      for (int l = 0; l < 32; ++l) {
        const int lo = (q[l] & 0x0F) | (((x[b].qh[l] >> (2 * p)) & 1) << 4);
        const int hi = (q[l] >> 4) | (((x[b].qh[l] >> (2 * p + 1)) & 1) << 4);
        y[64 * p + l] = d0 * (float)lo - mn0;
        y[64 * p + 32 + l] = d1 * (float)hi - mn1;
      }
    }
  }
}

// q6_K: in half h, for l < 32 and r < 4 the element 128h + 32r + l takes
// nibble (r / 2) of ql[64h + l + 32 (r % 2)], bits [2r, 2r+2) of qh[32h + l]
// as its high bits, and scale scales[8h + 2r + l / 16].
void dequantize_iq4_xs(const block_iq4_xs* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK_K / 32; ++j, y += 32) {
      const int ls = ((x[b].scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | (((x[b].scales_h >> (2 * j)) & 3) << 4);
      const float dl = d * (float)(ls - 32);
      const uint8_t* qs = x[b].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * (float)kIq4nlValues[qs[l] & 0x0F];
        y[l + 16] = dl * (float)kIq4nlValues[qs[l] >> 4];
      }
    }
  }
}

void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, y += QK_K) {
    const float d = fp16_to_fp32(x[b].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        for (int r = 0; r < 4; ++r) {
          const uint8_t lowbyte = ql[l + 32 * (r % 2)];
          const int lo = (r < 2) ? (lowbyte & 0x0F) : (lowbyte >> 4);
          const int q = (lo | (((qh[l] >> (2 * r)) & 3) << 4)) - 32;
          y[128 * h + 32 * r + l] = d * (float)sc[l / 16 + 2 * r] * (float)q;
        }
      }
    }
  }
}

}  // namespace serval::ref::detail
