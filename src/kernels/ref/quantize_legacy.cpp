// Reference quantizers of the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0 and IQ4_NL. Layouts: tensor/quant_blocks.h.
//
// Each block is quantized in two steps: a scale search (quant_search.h) that
// picks the grid minimizing the weighted squared error, then a final labelling
// against the scale exactly as stored (F16-rounded), which is the per-element
// optimum for that scale.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/fp16.h"
#include "kernels/ref/quant_search.h"
#include "kernels/ref/quants_impl.h"

namespace serval::ref::detail {
namespace {

// Importance weights of one group of n. With an imatrix: imatrix[i] *
// sqrt(sigma2 + x[i]^2), sigma2 = mean square of the group, so that both the
// column's importance and the element's own size count. Without one:
// sigma2 + x[i]^2, a blend of plain squared error and ggml's x^2 emphasis on
// the large elements; on the mini model weights it is at least as good as
// llama.cpp's quantizers under both measures (tests/kernels/quant_gguf_test.cpp).
void group_weights(const float* x, const float* imatrix, int n, float* w) {
  double s2 = 0;
  for (int i = 0; i < n; ++i) s2 += (double)x[i] * x[i];
  const float sigma2 = (float)(s2 / n);
  for (int i = 0; i < n; ++i) {
    const float e = sigma2 + x[i] * x[i];
    w[i] = imatrix ? imatrix[i] * std::sqrt(e) : e;
  }
}

// Writes 32 4-bit codes: element j in the low nibble of qs[j], j + 16 in the high.
void pack_nibbles32(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
}

// 32 five-bit codes: low nibbles as pack_nibbles32, bit 4 of element i -> bit i
// of the little-endian 32-bit qh.
void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh) {
  pack_nibbles32(L, qs);
  uint32_t h = 0;
  for (int i = 0; i < 32; ++i) h |= (uint32_t)((L[i] >> 4) & 1) << i;
  std::memcpy(qh, &h, 4);
}

// Symmetric formats (Q4_0, Q5_0): x ~= d * (code - nmax), code in [0, 2 nmax).
uint16_t quantize_symmetric32(const float* x, const float* imatrix, int nmax, uint8_t* codes) {
  float w[32];
  group_weights(x, imatrix, 32, w);
  int8_t L[32];
  const float d = search_symmetric(32, nmax, x, w, L, 9);
  const uint16_t dh = fp16_scale_bits(d);
  const float ds = fp16_to_fp32(dh);
  const float id = ds != 0 ? 1.0f / ds : 0.0f;
  for (int i = 0; i < 32; ++i) codes[i] = (uint8_t)(round_clamp(x[i] * id, -nmax, nmax - 1) + nmax);
  return dh;
}

// Affine formats (Q4_1, Q5_1): x ~= d * code + m, code in [0, nmax].
void quantize_affine32(const float* x, const float* imatrix, int nmax, float rmin, int nstep,
                       uint16_t* dh, uint16_t* mh, uint8_t* codes) {
  float w[32];
  group_weights(x, imatrix, 32, w);
  uint8_t L[32];
  const Affine a = search_affine(32, nmax, x, w, L, /*allow_positive_offset=*/true, rmin, 0.1f, nstep);
  *dh = fp16_scale_bits(a.scale);
  *mh = fp16_scale_bits(a.offset);
  const float ds = fp16_to_fp32(*dh), ms = fp16_to_fp32(*mh);
  const float id = ds != 0 ? 1.0f / ds : 0.0f;
  for (int i = 0; i < 32; ++i) codes[i] = (uint8_t)round_clamp((x[i] - ms) * id, 0, nmax);
}

}  // namespace

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK4_0) {
    uint8_t codes[32];
    y[b].d = quantize_symmetric32(x, imatrix ? imatrix + b * QK4_0 : nullptr, 8, codes);
    pack_nibbles32(codes, y[b].qs);
  }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK5_0) {
    uint8_t codes[32];
    y[b].d = quantize_symmetric32(x, imatrix ? imatrix + b * QK5_0 : nullptr, 16, codes);
    pack_q5(codes, y[b].qs, y[b].qh);
  }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK4_1) {
    uint8_t codes[32];
    quantize_affine32(x, imatrix ? imatrix + b * QK4_1 : nullptr, 15, -1.0f, 20, &y[b].d, &y[b].m, codes);
    pack_nibbles32(codes, y[b].qs);
  }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK5_1) {
    uint8_t codes[32];
    quantize_affine32(x, imatrix ? imatrix + b * QK5_1 : nullptr, 31, -0.5f, 15, &y[b].d, &y[b].m, codes);
    pack_q5(codes, y[b].qs, y[b].qh);
  }
}

// Q8_0: d = max|x| / 127 (the 8-bit grid is fine enough that a search gains
// nothing measurable), codes rounded against the stored d.
void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += QK8_0) {
    float amax = 0;
    for (int i = 0; i < QK8_0; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    y[b].d = fp16_scale_bits(amax / 127.0f);
    const float ds = fp16_to_fp32(y[b].d);
    const float id = ds != 0 ? 1.0f / ds : 0.0f;
    for (int i = 0; i < QK8_0; ++i) y[b].qs[i] = (int8_t)round_clamp(x[i] * id, -127, 127);
  }
}

// IQ4_NL: d searched against the non-linear codebook (both ends of it, with
// 15 stretches each), then every element takes the nearest code for the stored d.
void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t nb, const float* imatrix) {
  static const Codebook16 cb(kIq4nlValues);
  for (int64_t b = 0; b < nb; ++b, x += QK4_NL) {
    float w[32];
    group_weights(x, imatrix ? imatrix + b * QK4_NL : nullptr, 32, w);
    uint8_t L[32];
    const float d = search_codebook(32, cb, x, w, L, 7);
    y[b].d = fp16_scale_bits(d);
    const float ds = fp16_to_fp32(y[b].d);
    if (ds != 0) {
      const float id = 1.0f / ds;
      for (int i = 0; i < 32; ++i) L[i] = (uint8_t)cb.nearest(x[i] * id);
    }
    pack_nibbles32(L, y[b].qs);
  }
}

// MXFP4: the exponent that puts the block's largest magnitude at the top of
// the codebook (e = floor(log2 amax) - 2 + 127, as ggml's reference), or one
// above it when that gives a smaller (importance-weighted) squared error;
// every element takes the nearest code (ties: the lower index).
void quantize_mxfp4(const float* x, block_mxfp4* y, int64_t nb, const float* imatrix) {
  auto nearest = [](float v) {
    int best = 0;
    float err = std::fabs(v - (float)kMxfp4Values[0]);
    for (int i = 1; i < 16; ++i) {
      const float d = std::fabs(v - (float)kMxfp4Values[i]);
      if (d < err) err = d, best = i;
    }
    return best;
  };
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float w[32];
    group_weights(x, imatrix ? imatrix + b * 32 : nullptr, 32, w);
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    uint8_t best_e = 0, L[32] = {};
    if (amax > 0 && std::isfinite(amax)) {
      const int e0 = std::clamp((int)std::floor(std::log2(amax)) - 2 + 127, 0, 254);
      double best_err = INFINITY;
      for (int e = e0; e <= e0 + 1; ++e) {
        const float d = mxfp4_scale((uint8_t)e), id = 1.0f / d;
        uint8_t l[32];
        double err = 0;
        for (int i = 0; i < 32; ++i) {
          l[i] = (uint8_t)nearest(x[i] * id);
          const double r = x[i] - d * (float)kMxfp4Values[l[i]];
          err += w[i] * r * r;
        }
        if (err < best_err) {
          best_err = err;
          best_e = (uint8_t)e;
          std::memcpy(L, l, 32);
        }
      }
    }
    y[b].e = best_e;
    for (int j = 0; j < 16; ++j) y[b].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
  }
}

}  // namespace serval::ref::detail
