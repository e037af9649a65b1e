// Scalar dequantization of the lattice-codebook (IQ1/IQ2/IQ3) and ternary
// (TQ1_0/TQ2_0) formats. Layouts: tensor/quant_blocks.h; codebooks:
// tensor/iq_grids.h. The float arithmetic is ggml's, in its order (the
// sub-block scale first, then times the grid value, the sign applied last),
// so results are bit-identical to ggml's dequantize_row_*.
#include <cstring>

#include "common/fp16.h"
#include "kernels/ref/quants_impl.h"
#include "tensor/iq_grids.h"

namespace serval::ref::detail {
namespace {

inline uint8_t grid_byte(uint64_t g, int j) { return (uint8_t)(g >> (8 * j)); }

// y[0..8) = db * grid value j, negated where sign bit j is set.
inline void put_group8(float* y, float db, uint64_t g, uint8_t signs) {
  for (int j = 0; j < 8; ++j) {
    const float v = db * (float)grid_byte(g, j);
    y[j] = (signs >> j & 1) ? -v : v;
  }
}

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void dequantize_iq2_xxs(const block_iq2_xxs* x, float* y, int64_t nb) {
  const uint64_t* grid = iq2xxs_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const uint32_t a = load_u32(x[i].qs + 4 * ib), b = load_u32(x[i].qs + 4 * ib + 2);
      const float db = d * (0.5f + (float)(b >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) put_group8(y, db, grid[(a >> (8 * l)) & 255], iq_sign_byte(b >> (7 * l)));
    }
  }
}

void dequantize_iq2_xs(const block_iq2_xs* x, float* y, int64_t nb) {
  const uint64_t* grid = iq2xs_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float db[2] = {d * (0.5f + (float)(x[i].scales[ib] & 15)) * 0.25f,
                           d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = x[i].qs[4 * ib + l];
        put_group8(y, db[l / 2], grid[q & 511], iq_sign_byte(q >> 9));
      }
    }
  }
}

void dequantize_iq2_s(const block_iq2_s* x, float* y, int64_t nb) {
  const uint64_t* grid = iq2s_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* signs = x[i].qs + QK_K / 8;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float db[2] = {d * (0.5f + (float)(x[i].scales[ib] & 15)) * 0.25f,
                           d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const int idx = x[i].qs[4 * ib + l] | ((x[i].qh[ib] >> (2 * l)) & 3) << 8;
        put_group8(y, db[l / 2], grid[idx], signs[4 * ib + l]);
      }
    }
  }
}

void dequantize_iq3_xxs(const block_iq3_xxs* x, float* y, int64_t nb) {
  const uint32_t* grid = iq3xxs_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const uint32_t w = load_u32(x[i].qs + QK_K / 4 + 4 * ib);
      const float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint64_t g = (uint64_t)grid[qs[8 * ib + 2 * l]] | (uint64_t)grid[qs[8 * ib + 2 * l + 1]] << 32;
        put_group8(y, db, g, iq_sign_byte(w >> (7 * l)));
      }
    }
  }
}

void dequantize_iq3_s(const block_iq3_s* x, float* y, int64_t nb) {
  const uint32_t* grid = iq3s_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float db = d * (float)(1 + 2 * ((x[i].scales[ib / 2] >> (4 * (ib % 2))) & 15));
      const uint8_t* qs = x[i].qs + 8 * ib;
      const int qh = x[i].qh[ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const int i0 = qs[2 * l] | ((qh >> (2 * l)) & 1) << 8;
        const int i1 = qs[2 * l + 1] | ((qh >> (2 * l + 1)) & 1) << 8;
        put_group8(y, db, (uint64_t)grid[i0] | (uint64_t)grid[i1] << 32, x[i].signs[4 * ib + l]);
      }
    }
  }
}

void dequantize_iq1_s(const block_iq1_s* x, float* y, int64_t nb) {
  const uint64_t* grid = iq1s_grid();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const uint16_t qh = load_u16(&x[i].qh[ib]);
      const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) ? -0.125f : 0.125f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint64_t g = grid[x[i].qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
        for (int j = 0; j < 8; ++j) y[j] = dl * ((float)(int8_t)grid_byte(g, j) + delta);
      }
    }
  }
}

void dequantize_iq1_m(const block_iq1_m* x, float* y, int64_t nb) {
  const uint64_t* grid = iq1s_grid();
  for (int64_t i = 0; i < nb; ++i) {
    uint16_t w[4];
    std::memcpy(w, x[i].scales, 8);
    const float d = fp16_to_fp32(iq1_m_scale_bits(x[i]));
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float dl[2] = {d * (float)(2 * ((w[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                           d * (float)(2 * ((w[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
      for (int l = 0; l < 4; ++l, y += 8) {
        const int h = x[i].qh[2 * ib + l / 2] >> (4 * (l % 2));
        const uint64_t g = grid[x[i].qs[4 * ib + l] | (h & 7) << 8];
        const float delta = (h & 8) ? -0.125f : 0.125f;
        for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * ((float)(int8_t)grid_byte(g, j) + delta);
      }
    }
  }
}

int tq1_trit(uint8_t q, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t v = (uint8_t)(q * kPow3[n]);
  return ((uint16_t)v * 3) >> 8;
}

void dequantize_tq1_0(const block_tq1_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_fp32(x[i].d);
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 32; ++m) y[32 * n + m] = (float)(tq1_trit(x[i].qs[m], n) - 1) * d;
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 16; ++m) y[160 + 16 * n + m] = (float)(tq1_trit(x[i].qs[32 + m], n) - 1) * d;
    for (int n = 0; n < 4; ++n)
      for (int j = 0; j < 4; ++j) y[240 + 4 * n + j] = (float)(tq1_trit(x[i].qh[j], n) - 1) * d;
  }
}

void dequantize_tq2_0(const block_tq2_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_fp32(x[i].d);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 32; ++m) y[128 * h + 32 * k + m] = (float)(((x[i].qs[32 * h + m] >> (2 * k)) & 3) - 1) * d;
  }
}

}  // namespace serval::ref::detail
