#include "kernels/act_quant.h"

#include <emmintrin.h>

#include <cmath>
#include <cstring>

namespace serval::kernels::detail {
namespace {

// Round to nearest, ties to even (cvtss2si under the default MXCSR), exactly as
// the SIMD conversions round.
inline int round_even(float v) { return _mm_cvtss_si32(_mm_set_ss(v)); }

// Quantizes n elements of x with one scale; returns d.
float quantize_block(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
  }
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    std::memset(q, 0, (size_t)n);
    return 0.0f;
  }
  const float id = 127.0f / amax;
  for (int j = 0; j < n; ++j) q[j] = (int8_t)round_even(x[j] * id);
  return amax / 127.0f;
}

}  // namespace

void quantize_act_q8_32(const float* x, int64_t cols, int offset, uint8_t* dst) {
  const int64_t nb = cols / 32;
  for (int64_t bp = 0; bp < (nb + 1) / 2; ++bp) {
    uint8_t* unit = dst + bp * kActQ8_32PairBytes;
    auto* qs = reinterpret_cast<int8_t*>(unit);
    int32_t corr[16];
    float d[16];
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * bp + h;
      float db = 0.0f;
      if (b < nb) db = act_scale_q8_32(quantize_block(x + b * 32, 32, qs + 32 * h));
      else std::memset(qs + 32 * h, 0, 32);
      for (int k = 0; k < 8; ++k) {
        const int8_t* g = qs + 32 * h + 4 * k;
        corr[8 * h + k] = -offset * ((int32_t)g[0] + g[1] + g[2] + g[3]);
        d[8 * h + k] = db;
      }
    }
    std::memcpy(unit + 64, corr, sizeof corr);
    std::memcpy(unit + 128, d, sizeof d);
  }
}

void quantize_act_q8_0p(const float* x, int64_t cols, int offset, uint8_t* dst) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    uint8_t* unit = dst + b * kActQ8_0PBlockBytes;
    auto* qs = reinterpret_cast<int8_t*>(unit);
    const float d = act_scale_q8_32(quantize_block(x + b * 32, 32, qs));
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += qs[j];
    const int32_t corr = -offset * sum;
    std::memcpy(unit + 32, &corr, 4);
    std::memcpy(unit + 36, &d, 4);
  }
}

void quantize_act_q8_k(const float* x, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / 256;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* unit = dst + b * kActQ8_KBlockBytes;
    auto* qs = reinterpret_cast<int8_t*>(unit);
    const float d = quantize_block(x + b * 256, 256, qs);
    int16_t s16[16], s32[8];
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += qs[16 * j + l];
      s16[j] = (int16_t)s;
    }
    for (int j = 0; j < 8; ++j) s32[j] = (int16_t)(s16[2 * j] + s16[2 * j + 1]);
    std::memcpy(unit + 256, s16, sizeof s16);
    std::memcpy(unit + 288, s32, sizeof s32);
    std::memcpy(unit + 304, &d, sizeof d);
    std::memset(unit + 308, 0, 12);
  }
}

}  // namespace serval::kernels::detail
