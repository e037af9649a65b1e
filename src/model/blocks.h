// Building blocks the forward passes share (batch_forward.cpp and
// reference_forward.cpp run the same block recipe, model_config.h): small
// per-token operations over F32 rows. Header-only free functions; thread-safe.
#pragma once

#include <cstdint>

#include "kernels/ref/ops.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval::blocks {

// RMSNorm of each of n_heads heads of x [n_heads, head_dim] with weight w [head_dim], in place.
inline void head_rmsnorm(float* x, int64_t n_heads, int64_t head_dim, const float* w, float eps) {
  for (int64_t h = 0; h < n_heads; ++h) ref::rmsnorm(x + h * head_dim, x + h * head_dim, w, head_dim, eps);
}

// out = act(gate) * up over n elements, the recipe's activation.
inline void gated_act(FfnActivation act, float* out, const float* gate, const float* up, int64_t n) {
  if (act == FfnActivation::gelu_tanh) ref::geglu(out, gate, up, n);
  else ref::swiglu(out, gate, up, n);
}

// The RoPE of layer il: the sliding-window variant for local layers, with the
// model's frequency factors (if any) attached.
inline ref::RopeSpec layer_rope(const ModelConfig& c, const ModelWeights& w, int64_t il) {
  ref::RopeSpec r = c.is_swa(il) ? c.rope_swa : c.rope;
  r.freq_factors = w.rope_factors.empty() ? nullptr : w.rope_factors.data();
  return r;
}

// Does any layer use the sliding-window RoPE variant with a different table
// than the full layers'? (Then the forward computes both tables per token.)
inline bool rope_differs(const ref::RopeSpec& a, const ref::RopeSpec& b) {
  return a.freq_base != b.freq_base || a.freq_scale != b.freq_scale || a.ext_factor != b.ext_factor ||
         a.attn_factor != b.attn_factor || a.beta_fast != b.beta_fast || a.beta_slow != b.beta_slow ||
         a.n_ctx_orig != b.n_ctx_orig || a.rope_dim != b.rope_dim;
}

}  // namespace serval::blocks
