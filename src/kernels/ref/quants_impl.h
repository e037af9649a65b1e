// Internal to kernels/ref: per-type row converters behind the one dispatch
// switch in quants.cpp. Not a public API; call serval::ref::dequantize_row /
// quantize_row instead. nb = number of blocks in the row.
#pragma once

#include <cstdint>

#include "tensor/quant_blocks.h"

namespace serval::ref::detail {

// dequantize.cpp
void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb);
void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb);
void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb);
void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb);
void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb);
void dequantize_iq4_nl(const block_iq4_nl* x, float* y, int64_t nb);
void dequantize_mxfp4(const block_mxfp4* x, float* y, int64_t nb);
void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb);
void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb);
void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb);
void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb);
void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb);
void dequantize_iq4_xs(const block_iq4_xs* x, float* y, int64_t nb);

// dequantize_iq.cpp
void dequantize_iq2_xxs(const block_iq2_xxs* x, float* y, int64_t nb);
void dequantize_iq2_xs(const block_iq2_xs* x, float* y, int64_t nb);
void dequantize_iq2_s(const block_iq2_s* x, float* y, int64_t nb);
void dequantize_iq3_xxs(const block_iq3_xxs* x, float* y, int64_t nb);
void dequantize_iq3_s(const block_iq3_s* x, float* y, int64_t nb);
void dequantize_iq1_s(const block_iq1_s* x, float* y, int64_t nb);
void dequantize_iq1_m(const block_iq1_m* x, float* y, int64_t nb);
void dequantize_tq1_0(const block_tq1_0* x, float* y, int64_t nb);
void dequantize_tq2_0(const block_tq2_0* x, float* y, int64_t nb);
// Trit n (0..4) of a TQ1_0 byte, 0..2.
int tq1_trit(uint8_t q, int n);

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block.
void unpack_scale_min_k4(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m);
// Unpacks the 16 six-bit (biased by 32) scales of a q3_K block, as signed values.
void unpack_scales_q3_K(const uint8_t* scales, int8_t* out);

// quantize_legacy.cpp (imatrix: per-element weights for the row, or nullptr)
void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb, const float* imatrix);
void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb, const float* imatrix);
void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb, const float* imatrix);
void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb, const float* imatrix);
void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb);
void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t nb, const float* imatrix);
void quantize_mxfp4(const float* x, block_mxfp4* y, int64_t nb, const float* imatrix);

// quantize_k.cpp
void quantize_q2_K(const float* x, block_q2_K* y, int64_t nb, const float* imatrix);
void quantize_q3_K(const float* x, block_q3_K* y, int64_t nb, const float* imatrix);
void quantize_q4_K(const float* x, block_q4_K* y, int64_t nb, const float* imatrix);
void quantize_q5_K(const float* x, block_q5_K* y, int64_t nb, const float* imatrix);
void quantize_q6_K(const float* x, block_q6_K* y, int64_t nb, const float* imatrix);
void quantize_iq4_xs(const float* x, block_iq4_xs* y, int64_t nb, const float* imatrix);

// quantize_iq.cpp
void quantize_iq2_xxs(const float* x, block_iq2_xxs* y, int64_t nb, const float* imatrix);
void quantize_iq2_xs(const float* x, block_iq2_xs* y, int64_t nb, const float* imatrix);
void quantize_iq2_s(const float* x, block_iq2_s* y, int64_t nb, const float* imatrix);
void quantize_iq3_xxs(const float* x, block_iq3_xxs* y, int64_t nb, const float* imatrix);
void quantize_iq3_s(const float* x, block_iq3_s* y, int64_t nb, const float* imatrix);
void quantize_iq1_s(const float* x, block_iq1_s* y, int64_t nb, const float* imatrix);
void quantize_iq1_m(const float* x, block_iq1_m* y, int64_t nb, const float* imatrix);
void quantize_tq1_0(const float* x, block_tq1_0* y, int64_t nb, const float* imatrix);
void quantize_tq2_0(const float* x, block_tq2_0* y, int64_t nb, const float* imatrix);

}  // namespace serval::ref::detail
