// Scalar reference conversions between float rows and the GGUF element types:
// dequantize, quantize and a reference dot product. Always correct, never fast;
// the SIMD/GPU kernels are tested against these.
//
// Block layouts: tensor/quant_blocks.h. A "row" is n consecutive elements; n
// must be a multiple of the type's block size (asserted). Row bytes are
// row_size(t, n) (tensor/dtype.h).
//
// Free functions with no state: thread-safe; buffers are owned by the caller and
// must not overlap.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace serval::ref {

// True for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K,
// IQ4_NL, IQ4_XS, MXFP4, the lattice types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S and the ternary TQ1_0, TQ2_0.
bool can_dequantize(DType t);

// dst[0..n) = the exact values the format encodes (F16 scales widened exactly,
// products rounded as ggml rounds them: float arithmetic, one product per
// scale factor). Requires can_dequantize(t).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Same set as can_dequantize(): every readable type is also written.
bool can_quantize(DType t);

// Writes row_size(t, n) bytes at dst. Requires can_quantize(t).
// Every block is searched for the scales (and mins) that minimize a weighted
// squared error, then labelled against the scales exactly as stored; on the
// mini model's weights the result is at least as close to the source as
// llama.cpp's quantizer for every type those files contain (Q8_0, Q6_K, Q5_K,
// Q4_K, Q4_0, IQ4_NL, Q3_K, Q2_K, and with its imatrix the lattice types
// IQ1_S .. IQ3_S; tests/kernels/quant_gguf_test.cpp). The lattice types
// (kernels/ref/quantize_iq.cpp) search their codebooks: slow (tens of
// microseconds per block) and, for IQ1/IQ2, meant to be used with an imatrix.
// imatrix: optional per-column importance weights (length n, >= 0), e.g. the
// mean squared activation of each input column; used by every type except
// Q8_0, F16, BF16 and F32. nullptr = none.
// F16 scales saturate at +-65504, so inputs beyond ~1e6 are clamped, never
// turned into inf/NaN. Non-finite inputs are a caller error: results for them
// are unspecified (but never out of bounds).
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* imatrix = nullptr);

// sum_i dequant(row)[i] * x[i], accumulated in double, returned as float.
// Requires can_dequantize(t).
float dot_row(DType t, const void* row, const float* x, int64_t n);

}  // namespace serval::ref
