// Scalar reference kernels of the forward pass (everything but the weight
// formats, which are in quants.h). Plain free functions over raw pointers; the
// caller owns all buffers. Thread-safe (no state). SIMD/GPU versions, when they
// come, keep these signatures and are tested against them.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace serval::ref {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n. out may alias x.
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);

// y[r] = dot(W[r, :], x) for r < rows, W a row-major [rows, cols] matrix of
// type t (each row row_size(t, cols) bytes, as GGUF stores a [cols, rows] tensor).
void matvec(DType t, const void* w, int64_t rows, int64_t cols, const float* x, float* y);

enum class RopeLayout {
  adjacent,  // pairs (2i, 2i+1): GGUF's layout for `llama` (ggml ROPE_TYPE_NORM)
  neox,      // pairs (i, i + rope_dim/2): qwen2 and other neox-style models
};

// Rotates the first rope_dim dims of each of n_heads heads of x [n_heads, head_dim]
// by position pos: pair i turns by pos * base^(-2i/rope_dim).
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float freq_base,
          RopeLayout layout);

// In-place softmax of x[0..n).
void softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i].
void swiglu(float* out, const float* gate, const float* up, int64_t n);

}  // namespace serval::ref
