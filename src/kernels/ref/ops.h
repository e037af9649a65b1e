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

// LayerNorm: out[i] = (x[i] - mean(x)) / sqrt(var(x) + eps) * w[i] + b[i],
// i < n (ggml_norm then the weight and bias; BERT). out may alias x.
void layernorm(float* out, const float* x, const float* w, const float* b, int64_t n, float eps);

// y[r] = dot(W[r, :], x) for r < rows, W a row-major [rows, cols] matrix of
// type t (each row row_size(t, cols) bytes, as GGUF stores a [cols, rows] tensor).
void matvec(DType t, const void* w, int64_t rows, int64_t cols, const float* x, float* y);

enum class RopeLayout {
  adjacent,  // pairs (2i, 2i+1): GGUF's layout for `llama` (ggml ROPE_TYPE_NORM)
  neox,      // pairs (i, i + rope_dim/2): qwen2 and other neox-style models
};

// How a family rotates query and key heads (ggml's rope_ext, which wrote the
// GGUF files): pair i of the first rope_dim dims turns by
//   theta_extrap = pos * freq_base^(-2i/rope_dim) / freq_factors[i]
//   theta        = freq_scale * theta_extrap, and with YaRN (ext_factor != 0)
//                  mixed back towards theta_extrap on the ramp between the
//                  correction dims of beta_fast/beta_slow over n_ctx_orig,
//                  with the magnitude scaled by 1 + 0.1 ln(1 / freq_scale);
// cos and sin are multiplied by attn_factor.
struct RopeSpec {
  RopeLayout layout = RopeLayout::adjacent;
  int64_t rope_dim = 0;                  // dims rotated per head (even, <= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;               // 1 / rope.scaling.factor (linear and YaRN scaling)
  const float* freq_factors = nullptr;   // [rope_dim / 2] or null: Llama 3 rope_freqs, Phi-3 LongRoPE factors
  float ext_factor = 0.0f;               // YaRN: 1; else 0
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;                // rope.scaling.original_context_length (YaRN)
};

// cs[2i], cs[2i + 1] = cos, sin of pair i (i < rope_dim / 2) at position pos.
void rope_cos_sin(const RopeSpec& r, int64_t pos, float* cs);
// Rotates each of n_heads heads of x [n_heads, head_dim] by the angles of cs.
void rope_apply(float* x, int64_t n_heads, int64_t head_dim, const RopeSpec& r, const float* cs);

// Plain RoPE (no scaling): rope_cos_sin + rope_apply.
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float freq_base,
          RopeLayout layout);

// In-place softmax of x[0..n).
void softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i].
void swiglu(float* out, const float* gate, const float* up, int64_t n);
// x[i] = gelu(x[i]), GELU in its tanh form (ggml_gelu; BERT's FFN), in place.
void gelu(float* x, int64_t n);
// out[i] = gelu(gate[i]) * up[i], GELU in its tanh form (ggml_gelu; Gemma).
void geglu(float* out, const float* gate, const float* up, int64_t n);
// x[i] = cap * tanh(x[i] / cap), i < n (Gemma 2's logit soft-capping).
void softcap(float* x, int64_t n, float cap);

}  // namespace serval::ref
