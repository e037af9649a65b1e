// The one dispatch point of the reference row conversions (quants.h).
#include "kernels/ref/quants.h"

#include <algorithm>
#include <cstring>

#include "common/fp16.h"
#include "common/status.h"
#include "kernels/ref/quants_impl.h"

namespace serval::ref {
namespace {

// Elements per block of t, after checking that n is a whole number of blocks.
int64_t blocks_in_row(DType t, int64_t n) {
  const auto tr = dtype_traits(t);
  SERVAL_ASSERT(tr.has_value());
  SERVAL_ASSERT(n >= 0 && n % tr->block_size == 0);
  return n / tr->block_size;
}

}  // namespace

bool can_dequantize(DType t) {
  switch (t) {
    case DType::f32: case DType::f16: case DType::bf16:
    case DType::q4_0: case DType::q4_1: case DType::q5_0: case DType::q5_1: case DType::q8_0:
    case DType::q2_k: case DType::q3_k: case DType::q4_k: case DType::q5_k: case DType::q6_k:
    case DType::iq4_nl: case DType::iq4_xs: case DType::mxfp4:
    case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s:
    case DType::iq1_s: case DType::iq1_m: case DType::tq1_0: case DType::tq2_0:
      return true;
    default:
      return false;
  }
}

bool can_quantize(DType t) { return can_dequantize(t); }

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  using namespace detail;
  const int64_t nb = blocks_in_row(t, n);
  switch (t) {
    case DType::f32: std::memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    case DType::q4_0: dequantize_q4_0(static_cast<const block_q4_0*>(src), dst, nb); return;
    case DType::q4_1: dequantize_q4_1(static_cast<const block_q4_1*>(src), dst, nb); return;
    case DType::q5_0: dequantize_q5_0(static_cast<const block_q5_0*>(src), dst, nb); return;
    case DType::q5_1: dequantize_q5_1(static_cast<const block_q5_1*>(src), dst, nb); return;
    case DType::q8_0: dequantize_q8_0(static_cast<const block_q8_0*>(src), dst, nb); return;
    case DType::iq4_nl: dequantize_iq4_nl(static_cast<const block_iq4_nl*>(src), dst, nb); return;
    case DType::mxfp4: dequantize_mxfp4(static_cast<const block_mxfp4*>(src), dst, nb); return;
    case DType::q2_k: dequantize_q2_K(static_cast<const block_q2_K*>(src), dst, nb); return;
    case DType::q3_k: dequantize_q3_K(static_cast<const block_q3_K*>(src), dst, nb); return;
    case DType::q4_k: dequantize_q4_K(static_cast<const block_q4_K*>(src), dst, nb); return;
    case DType::q5_k: dequantize_q5_K(static_cast<const block_q5_K*>(src), dst, nb); return;
    case DType::q6_k: dequantize_q6_K(static_cast<const block_q6_K*>(src), dst, nb); return;
    case DType::iq4_xs: dequantize_iq4_xs(static_cast<const block_iq4_xs*>(src), dst, nb); return;
    case DType::iq2_xxs: dequantize_iq2_xxs(static_cast<const block_iq2_xxs*>(src), dst, nb); return;
    case DType::iq2_xs: dequantize_iq2_xs(static_cast<const block_iq2_xs*>(src), dst, nb); return;
    case DType::iq2_s: dequantize_iq2_s(static_cast<const block_iq2_s*>(src), dst, nb); return;
    case DType::iq3_xxs: dequantize_iq3_xxs(static_cast<const block_iq3_xxs*>(src), dst, nb); return;
    case DType::iq3_s: dequantize_iq3_s(static_cast<const block_iq3_s*>(src), dst, nb); return;
    case DType::iq1_s: dequantize_iq1_s(static_cast<const block_iq1_s*>(src), dst, nb); return;
    case DType::iq1_m: dequantize_iq1_m(static_cast<const block_iq1_m*>(src), dst, nb); return;
    case DType::tq1_0: dequantize_tq1_0(static_cast<const block_tq1_0*>(src), dst, nb); return;
    case DType::tq2_0: dequantize_tq2_0(static_cast<const block_tq2_0*>(src), dst, nb); return;
    default: SERVAL_ASSERT(!"dequantize_row: unsupported type (check can_dequantize)");
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* imatrix) {
  using namespace detail;
  const int64_t nb = blocks_in_row(t, n);
  switch (t) {
    case DType::f32: std::memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::q4_0: quantize_q4_0(src, static_cast<block_q4_0*>(dst), nb, imatrix); return;
    case DType::q4_1: quantize_q4_1(src, static_cast<block_q4_1*>(dst), nb, imatrix); return;
    case DType::q5_0: quantize_q5_0(src, static_cast<block_q5_0*>(dst), nb, imatrix); return;
    case DType::q5_1: quantize_q5_1(src, static_cast<block_q5_1*>(dst), nb, imatrix); return;
    case DType::q8_0: quantize_q8_0(src, static_cast<block_q8_0*>(dst), nb); return;
    case DType::iq4_nl: quantize_iq4_nl(src, static_cast<block_iq4_nl*>(dst), nb, imatrix); return;
    case DType::mxfp4: quantize_mxfp4(src, static_cast<block_mxfp4*>(dst), nb, imatrix); return;
    case DType::q2_k: quantize_q2_K(src, static_cast<block_q2_K*>(dst), nb, imatrix); return;
    case DType::q3_k: quantize_q3_K(src, static_cast<block_q3_K*>(dst), nb, imatrix); return;
    case DType::q4_k: quantize_q4_K(src, static_cast<block_q4_K*>(dst), nb, imatrix); return;
    case DType::q5_k: quantize_q5_K(src, static_cast<block_q5_K*>(dst), nb, imatrix); return;
    case DType::q6_k: quantize_q6_K(src, static_cast<block_q6_K*>(dst), nb, imatrix); return;
    case DType::iq4_xs: quantize_iq4_xs(src, static_cast<block_iq4_xs*>(dst), nb, imatrix); return;
    case DType::iq2_xxs: quantize_iq2_xxs(src, static_cast<block_iq2_xxs*>(dst), nb, imatrix); return;
    case DType::iq2_xs: quantize_iq2_xs(src, static_cast<block_iq2_xs*>(dst), nb, imatrix); return;
    case DType::iq2_s: quantize_iq2_s(src, static_cast<block_iq2_s*>(dst), nb, imatrix); return;
    case DType::iq3_xxs: quantize_iq3_xxs(src, static_cast<block_iq3_xxs*>(dst), nb, imatrix); return;
    case DType::iq3_s: quantize_iq3_s(src, static_cast<block_iq3_s*>(dst), nb, imatrix); return;
    case DType::iq1_s: quantize_iq1_s(src, static_cast<block_iq1_s*>(dst), nb, imatrix); return;
    case DType::iq1_m: quantize_iq1_m(src, static_cast<block_iq1_m*>(dst), nb, imatrix); return;
    case DType::tq1_0: quantize_tq1_0(src, static_cast<block_tq1_0*>(dst), nb, imatrix); return;
    case DType::tq2_0: quantize_tq2_0(src, static_cast<block_tq2_0*>(dst), nb, imatrix); return;
    default: SERVAL_ASSERT(!"quantize_row: unsupported type (check can_quantize)");
  }
}

float dot_row(DType t, const void* row, const float* x, int64_t n) {
  const auto tr = dtype_traits(t);
  SERVAL_ASSERT(tr.has_value() && can_dequantize(t));
  const int64_t bs = tr->block_size;
  const int64_t nb = blocks_in_row(t, n);
  // Dequantize a chunk of whole blocks at a time (256 elements covers one block
  // of every supported type).
  constexpr int64_t kChunk = 256;
  const int64_t blocks_per_chunk = bs >= kChunk ? 1 : kChunk / bs;
  float buf[kChunk];
  const auto* src = static_cast<const uint8_t*>(row);
  double sum = 0;
  for (int64_t b = 0; b < nb; b += blocks_per_chunk) {
    const int64_t cnt = std::min(blocks_per_chunk, nb - b);
    dequantize_row(t, src + b * tr->type_size, buf, cnt * bs);
    const float* xb = x + b * bs;
    for (int64_t i = 0; i < cnt * bs; ++i) sum += (double)buf[i] * xb[i];
  }
  return (float)sum;
}

}  // namespace serval::ref
