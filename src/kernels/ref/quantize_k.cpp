// Reference quantizers of the K-quants (256-element super-blocks): Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K. Layouts: tensor/quant_blocks.h.
//
// Three steps per super-block:
//  1. each sub-block gets its own float scale (and min) from a weighted grid
//     search (quant_search.h);
//  2. the sub-block scales (and mins) are themselves quantized to 4/6/8 bits
//     against an F16 super-scale, weighting each by how much the sub-block's
//     error depends on it (sum w L^2 for a scale, sum w for a min);
//  3. every element is relabelled against the scales exactly as stored.
#include <cmath>
#include <cstring>

#include "common/fp16.h"
#include "kernels/ref/quant_search.h"
#include "kernels/ref/quants_impl.h"

namespace serval::ref::detail {
namespace {

// sum w L^2 and sum w over one sub-block: the sensitivities of its squared
// error to its scale and to its min.
float scale_importance(const float* w, const uint8_t* L, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += (double)w[i] * L[i] * L[i];
  return (float)s;
}
float scale_importance(const float* w, const int8_t* L, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += (double)w[i] * L[i] * L[i];
  return (float)s;
}
float min_importance(const float* w, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += w[i];
  return (float)s;
}

// Packs 8 six-bit scales and mins the way unpack_scale_min_k4 reads them:
// bytes 0-3: scale j (6 bits) | bits 4-5 of scale j+4 in the top 2 bits;
// bytes 4-7: min j | bits 4-5 of min j+4; bytes 8-11: low nibbles of scale
// j+4 (low) and min j+4 (high).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = (uint8_t)((ls[j] & 63) | ((ls[j + 4] >> 4) << 6));
    s[j + 4] = (uint8_t)((lm[j] & 63) | ((lm[j + 4] >> 4) << 6));
    s[j + 8] = (uint8_t)((ls[j + 4] & 0x0F) | ((lm[j + 4] & 0x0F) << 4));
  }
}

// Q4_K and Q5_K share everything but the code width (nmax 15 / 31).
// Writes d, dmin, the packed scales and the 256 codes L.
void quantize_k_affine32(const float* x, const float* imatrix, int nmax, float rmin, int nstep,
                         uint16_t* dh, uint16_t* dminh, uint8_t* packed_scales, uint8_t* L) {
  float w[QK_K];
  super_block_weights(x, imatrix, DefaultWeights::rms_plus_abs, 32, w);
  float scales[8], mins[8], imp_s[8], imp_m[8];
  for (int j = 0; j < 8; ++j) {
    const Affine a = search_affine(32, nmax, x + 32 * j, w + 32 * j, L + 32 * j,
                                   /*allow_positive_offset=*/false, rmin, 0.1f, nstep);
    scales[j] = a.scale;
    mins[j] = -a.offset;
    imp_s[j] = scale_importance(w + 32 * j, L + 32 * j, 32);
    imp_m[j] = min_importance(w + 32 * j, 32);
  }
  uint8_t ls[8], lm[8];
  const float d = quantize_scales_unsigned(8, 63, scales, imp_s, ls);
  const float dmin = quantize_scales_unsigned(8, 63, mins, imp_m, lm);
  *dh = fp16_scale_bits(d);
  *dminh = fp16_scale_bits(dmin);
  pack_scale_min_k4(ls, lm, packed_scales);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * (float)ls[j];  // the products dequantization forms
    const float ml = dmin * (float)lm[j];
    const float id = dl != 0 ? 1.0f / dl : 0.0f;
    for (int i = 32 * j; i < 32 * j + 32; ++i) L[i] = (uint8_t)(dl != 0 ? round_clamp((x[i] + ml) * id, 0, nmax) : 0);
  }
}

}  // namespace

void quantize_q4_K(const float* x, block_q4_K* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    uint8_t L[QK_K];
    quantize_k_affine32(x, imatrix ? imatrix + b * QK_K : nullptr, 15, -1.0f, 20, &y[b].d, &y[b].dmin,
                        y[b].scales, L);
    // byte qs[32p + l]: element 64p + l (low nibble), 64p + 32 + l (high nibble)
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) y[b].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
  }
}

void quantize_q5_K(const float* x, block_q5_K* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    uint8_t L[QK_K];
    quantize_k_affine32(x, imatrix ? imatrix + b * QK_K : nullptr, 31, -0.5f, 15, &y[b].d, &y[b].dmin,
                        y[b].scales, L);
    // as Q4_K for the low nibbles; bit 4 of element 64p + l -> bit 2p of qh[l],
    // of element 64p + 32 + l -> bit 2p + 1 of qh[l]
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int p = 0; p < 4; ++p) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = L[64 * p + l], hi = L[64 * p + 32 + l];
        y[b].qs[32 * p + l] = (uint8_t)((lo & 0x0F) | ((hi & 0x0F) << 4));
        y[b].qh[l] |= (uint8_t)(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
      }
    }
  }
}

void quantize_q6_K(const float* x, block_q6_K* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    float w[QK_K];
    super_block_weights(x, imatrix ? imatrix + b * QK_K : nullptr, DefaultWeights::square, 16, w);
    int8_t L[QK_K];
    float scales[16], imp[16];
    for (int j = 0; j < 16; ++j) {
      scales[j] = search_symmetric(16, 32, x + 16 * j, w + 16 * j, L + 16 * j, 9);
      imp[j] = scale_importance(w + 16 * j, L + 16 * j, 16);
    }
    const float d = quantize_scales_signed(16, 128, 127, scales, imp, y[b].scales);
    y[b].d = fp16_scale_bits(d);
    uint8_t q[QK_K];  // codes 0..63
    for (int j = 0; j < 16; ++j) {
      const float dl = d * (float)y[b].scales[j];
      const float id = dl != 0 ? 1.0f / dl : 0.0f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) q[i] = (uint8_t)(round_clamp(x[i] * id, -32, 31) + 32);
    }
    // half h, l < 32, r < 4: element 128h + 32r + l -> nibble r / 2 of
    // ql[64h + l + 32 (r % 2)], high bits -> bits 2r..2r+1 of qh[32h + l]
    std::memset(y[b].ql, 0, sizeof(y[b].ql));
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        for (int r = 0; r < 4; ++r) {
          const uint8_t c = q[128 * h + 32 * r + l];
          y[b].ql[64 * h + l + 32 * (r % 2)] |= (uint8_t)((c & 0x0F) << (4 * (r / 2)));
          y[b].qh[32 * h + l] |= (uint8_t)((c >> 4) << (2 * r));
        }
      }
    }
  }
}

void quantize_q3_K(const float* x, block_q3_K* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    float w[QK_K];
    super_block_weights(x, imatrix ? imatrix + b * QK_K : nullptr, DefaultWeights::mean_square_plus_square, 16, w);
    int8_t L[QK_K];
    float scales[16], imp[16];
    for (int j = 0; j < 16; ++j) {
      scales[j] = search_symmetric(16, 4, x + 16 * j, w + 16 * j, L + 16 * j, 9);
      imp[j] = scale_importance(w + 16 * j, L + 16 * j, 16);
    }
    int8_t sc[16];
    const float d = quantize_scales_signed(16, 32, 31, scales, imp, sc);
    y[b].d = fp16_scale_bits(d);
    // 6-bit biased scales: low nibble of scale i in byte i (i < 8, low) or byte
    // i - 8 (high nibble); bits 4-5 in byte 8 + i % 4 at bit 2 (i / 4).
    std::memset(y[b].scales, 0, sizeof(y[b].scales));
    for (int i = 0; i < 16; ++i) {
      const int u = sc[i] + 32;
      if (i < 8) y[b].scales[i] |= (uint8_t)(u & 0x0F);
      else y[b].scales[i - 8] |= (uint8_t)((u & 0x0F) << 4);
      y[b].scales[8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
    }
    // codes 0..7: low 2 bits at bits 2k of qs[32h + l], bit 2 at bit 4h + k of
    // hmask[l], for element 128h + 32k + l
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    std::memset(y[b].hmask, 0, sizeof(y[b].hmask));
    for (int j = 0; j < 16; ++j) {
      const float dl = d * (float)sc[j];
      const float id = dl != 0 ? 1.0f / dl : 0.0f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const int c = round_clamp(x[i] * id, -4, 3) + 4;
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        y[b].qs[32 * h + l] |= (uint8_t)((c & 3) << (2 * k));
        if (c & 4) y[b].hmask[l] |= (uint8_t)(1u << (4 * h + k));
      }
    }
  }
}

void quantize_q2_K(const float* x, block_q2_K* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    float w[QK_K];
    super_block_weights(x, imatrix ? imatrix + b * QK_K : nullptr, DefaultWeights::abs, 16, w);
    uint8_t L[QK_K];
    float scales[16], mins[16], imp_s[16], imp_m[16];
    for (int j = 0; j < 16; ++j) {
      const Affine a = search_affine(16, 3, x + 16 * j, w + 16 * j, L + 16 * j,
                                     /*allow_positive_offset=*/false, -0.5f, 0.1f, 15);
      scales[j] = a.scale;
      mins[j] = -a.offset;
      imp_s[j] = scale_importance(w + 16 * j, L + 16 * j, 16);
      imp_m[j] = min_importance(w + 16 * j, 16);
    }
    uint8_t ls[16], lm[16];
    const float d = quantize_scales_unsigned(16, 15, scales, imp_s, ls);
    const float dmin = quantize_scales_unsigned(16, 15, mins, imp_m, lm);
    y[b].d = fp16_scale_bits(d);
    y[b].dmin = fp16_scale_bits(dmin);
    for (int j = 0; j < 16; ++j) y[b].scales[j] = (uint8_t)(ls[j] | (lm[j] << 4));
    // element 128h + 32k + l -> bits 2k of qs[32h + l]
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int j = 0; j < 16; ++j) {
      const float dl = d * (float)ls[j];
      const float ml = dmin * (float)lm[j];
      const float id = dl != 0 ? 1.0f / dl : 0.0f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const int c = dl != 0 ? round_clamp((x[i] + ml) * id, 0, 3) : 0;
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        y[b].qs[32 * h + l] |= (uint8_t)(c << (2 * k));
      }
    }
  }
}

// IQ4_XS: each sub-block of 32 gets its scale from IQ4_NL's codebook search;
// the 8 scales are quantized to 6 bits (ls - 32 in -32..31) against the F16
// super-scale, weighted by sum w v^2 of their codes; then every element takes
// the nearest code for its sub-block's stored scale.
void quantize_iq4_xs(const float* x, block_iq4_xs* y, int64_t nb, const float* imatrix) {
  static const Codebook16 cb(kIq4nlValues);
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    float w[QK_K];
    super_block_weights(x, imatrix ? imatrix + b * QK_K : nullptr, DefaultWeights::mean_square_plus_square, 32, w);
    uint8_t L[QK_K];
    float scales[8], imp[8];
    for (int j = 0; j < 8; ++j) {
      scales[j] = search_codebook(32, cb, x + 32 * j, w + 32 * j, L + 32 * j, 7);
      double s = 0;
      for (int i = 32 * j; i < 32 * j + 32; ++i) s += (double)w[i] * kIq4nlValues[L[i]] * kIq4nlValues[L[i]];
      imp[j] = (float)s;
    }
    int8_t sc[8];
    const float d = quantize_scales_signed(8, 32, 31, scales, imp, sc);
    y[b].d = fp16_scale_bits(d);
    const float ds = fp16_to_fp32(y[b].d);
    uint16_t sh = 0;
    std::memset(y[b].scales_l, 0, sizeof(y[b].scales_l));
    for (int j = 0; j < 8; ++j) {
      const int u = sc[j] + 32;
      y[b].scales_l[j / 2] |= (uint8_t)((u & 0x0F) << (4 * (j % 2)));
      sh |= (uint16_t)(((u >> 4) & 3) << (2 * j));
      const float dl = ds * (float)sc[j];
      const float id = dl != 0 ? 1.0f / dl : 0.0f;
      for (int i = 32 * j; i < 32 * j + 32; ++i) L[i] = (uint8_t)cb.nearest(x[i] * id);
      for (int l = 0; l < 16; ++l)
        y[b].qs[16 * j + l] = (uint8_t)((L[32 * j + l] & 0x0F) | ((L[32 * j + 16 + l] & 0x0F) << 4));
    }
    y[b].scales_h = sh;
  }
}

}  // namespace serval::ref::detail
