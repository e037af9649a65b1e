// Dispatch of attention_tile(), the KV row codecs and the scalar reference
// tile (a plain two-pass softmax per query and head). No SIMD code here.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp16.h"
#include "kernels/attention_isa.h"
#include "kernels/matmul.h"
#include "kernels/ref/quants.h"
#include "tensor/quant_blocks.h"

namespace serval::kernels {
namespace {

// llama.cpp's quantize_row_q4_0_ref: d = (the signed value of largest
// magnitude) / -8, codes round(x / d) + 8 clamped to 15. Cheap enough for the
// per-token KV write (the weight quantizer searches scales).
void store_q4_0(const float* x, int64_t n, block_q4_0* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        mx = x[i];
      }
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int i = 0; i < 16; ++i) {
      const int lo = std::min(15, (int)(x[i] * id + 8.5f));
      const int hi = std::min(15, (int)(x[i + 16] * id + 8.5f));
      y[b].qs[i] = (uint8_t)(std::max(lo, 0) | (std::max(hi, 0) << 4));
    }
  }
}

void attention_tile_ref(const AttentionTile& t) {
  const int32_t group = t.n_heads / t.n_kv_heads, hd = t.head_dim;
  const size_t koff = kv_row_bytes(t.k.type, (int64_t)t.kv_head * hd);
  const size_t voff = kv_row_bytes(t.v.type, (int64_t)t.kv_head * hd);
  thread_local std::vector<float> s, krow, vrow;
  const int64_t n_max = t.p0 + t.m;
  if ((int64_t)s.size() < n_max) s.resize((size_t)n_max);
  krow.resize((size_t)hd);
  vrow.resize((size_t)hd);
  auto row = [](const KvView& kv, int64_t p, size_t off) {
    return kv.blocks[p / kv.block_size] + (size_t)(p % kv.block_size) * kv.row_bytes + off;
  };
  for (int32_t i = 0; i < t.m; ++i) {
    const int64_t n_ctx = t.p0 + i + 1;
    const int64_t lo = t.window > 0 ? std::max<int64_t>(0, n_ctx - t.window) : 0;
    for (int32_t h = 0; h < group; ++h) {
      const int32_t qh = t.kv_head * group + h;
      const float* q = t.q + i * t.q_stride + (int64_t)qh * hd;
      float mx = -INFINITY;
      for (int64_t p = lo; p < n_ctx; ++p) {
        kv_load_row(t.k.type, row(t.k, p, koff), hd, krow.data());
        float sc = dot_f32(q, krow.data(), hd) * t.scale;
        if (t.softcap > 0.0f) sc = t.softcap * std::tanh(sc / t.softcap);
        s[(size_t)p] = sc;
        mx = std::max(mx, s[(size_t)p]);
      }
      if (t.sinks) mx = std::max(mx, t.sinks[qh]);
      double sum = t.sinks ? std::exp((double)t.sinks[qh] - mx) : 0.0;
      for (int64_t p = lo; p < n_ctx; ++p) {
        s[(size_t)p] = std::exp(s[(size_t)p] - mx);
        sum += s[(size_t)p];
      }
      const float inv = (float)(1.0 / sum);
      float* o = t.out + i * t.out_stride + (int64_t)qh * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t p = lo; p < n_ctx; ++p) {
        kv_load_row(t.v.type, row(t.v, p, voff), hd, vrow.data());
        const float w = s[(size_t)p] * inv;
        for (int32_t d = 0; d < hd; ++d) o[d] += w * vrow[(size_t)d];
      }
    }
  }
}

}  // namespace

void kv_store_row(KvType t, const float* x, int64_t n, uint8_t* dst) {
  switch (t) {
    case KvType::f32: std::memcpy(dst, x, (size_t)n * 4); return;
    case KvType::f16: {
      // Every token's K and V rows of every layer: F16C at the SIMD levels
      // (the same bits as the scalar codec; dst is 2-byte aligned, the cache's
      // rows of F16 elements).
      auto* h = reinterpret_cast<uint16_t*>(dst);
      switch (active_isa()) {
        case Isa::ref:
          for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
          return;
        case Isa::avx2:
        case Isa::avx2vnni: return detail::f16_store_avx2()(x, n, h);
        case Isa::avx512:
        case Isa::avx512vnni: return detail::f16_store_avx512()(x, n, h);
      }
      return;
    }
    case KvType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case KvType::q8_0: ref::quantize_row(DType::q8_0, x, dst, n); return;
    case KvType::q4_0: store_q4_0(x, n, reinterpret_cast<block_q4_0*>(dst)); return;
    case KvType::fp8:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp8_e4m3(x[i]);
      return;
  }
}

void kv_load_row(KvType t, const uint8_t* src, int64_t n, float* dst) {
  switch (t) {
    case KvType::f32: std::memcpy(dst, src, (size_t)n * 4); return;
    case KvType::f16: ref::dequantize_row(DType::f16, src, dst, n); return;
    case KvType::bf16: ref::dequantize_row(DType::bf16, src, dst, n); return;
    case KvType::q8_0: ref::dequantize_row(DType::q8_0, src, dst, n); return;
    case KvType::q4_0: ref::dequantize_row(DType::q4_0, src, dst, n); return;
    case KvType::fp8:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_fp32(src[i]);
      return;
  }
}

void attention_tile(const AttentionTile& t) {
  switch (active_isa()) {
    case Isa::ref: return attention_tile_ref(t);
    case Isa::avx2:
    case Isa::avx2vnni: return detail::attention_tile_avx2()(t);
    case Isa::avx512:
    case Isa::avx512vnni: return detail::attention_tile_avx512()(t);
  }
}

}  // namespace serval::kernels
