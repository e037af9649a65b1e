// Building blocks the forward passes share (batch_forward.cpp and
// reference_forward.cpp run the same block recipe, model_config.h): small
// per-token operations over F32 rows. Header-only free functions; thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/activation.h"
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
  switch (act) {
    case FfnActivation::gelu_tanh: ref::geglu(out, gate, up, n); return;
    case FfnActivation::swiglu_oai:
      // gpt-oss (ggml_swiglu_oai): alpha 1.702, limit 7.
      for (int64_t i = 0; i < n; ++i) {
        const float g = std::min(gate[i], 7.0f), u = std::max(-7.0f, std::min(up[i], 7.0f));
        out[i] = g / (1.0f + std::exp(-1.702f * g)) * (u + 1.0f);
      }
      return;
    case FfnActivation::silu: ref::swiglu(out, gate, up, n); return;
  }
}

// gated_act with SwiGLU's exp in the vectorized form (kernels::silu_mul,
// within about 4e-7 of |gate * up| of the reference): the batched forward's;
// the reference forward keeps gated_act's std::exp.
inline void gated_act_fast(FfnActivation act, float* out, const float* gate, const float* up, int64_t n) {
  if (act == FfnActivation::silu) return kernels::silu_mul(out, gate, up, n);
  gated_act(act, out, gate, up, n);
}

// The experts a token routes to and their weights, from the router's logits
// [n_expert] (bias added): ids[k], weights[k] for k < n_used, the k-th largest
// logit first (ties: the lower expert id), so the sum of the experts' outputs
// runs in a fixed order.
inline void route(const ModelConfig& c, const float* logits, int32_t* ids, float* weights) {
  const int64_t ne = c.n_expert, k_used = c.n_expert_used;
  for (int64_t k = 0; k < k_used; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < (int32_t)ne; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= ids[j] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    ids[k] = best;
  }
  if (c.block.gating == MoeGating::softmax_of_topk) {
    // softmax over the chosen logits (the first is the largest)
    double sum = 0;
    for (int64_t k = 0; k < k_used; ++k) sum += std::exp((double)logits[ids[k]] - logits[ids[0]]);
    for (int64_t k = 0; k < k_used; ++k) weights[k] = (float)(std::exp((double)logits[ids[k]] - logits[ids[0]]) / sum);
    return;
  }
  // softmax over every expert, the chosen ones' probabilities
  const float mx = logits[ids[0]];
  double z = 0;
  for (int64_t e = 0; e < ne; ++e) z += std::exp((double)logits[e] - mx);
  double sel = 0;
  for (int64_t k = 0; k < k_used; ++k) {
    weights[k] = (float)(std::exp((double)logits[ids[k]] - mx) / z);
    sel += weights[k];
  }
  if (c.block.moe_norm_weights)
    for (int64_t k = 0; k < k_used; ++k) weights[k] = (float)(weights[k] / sel);
}

// The RoPE of full-attention layers (swa false) or of sliding-window layers,
// with the model's frequency factors (if any) attached.
inline ref::RopeSpec rope_of(const ModelConfig& c, const ModelWeights& w, bool swa) {
  ref::RopeSpec r = swa ? c.rope_swa : c.rope;
  r.freq_factors = w.rope_factors.empty() ? nullptr : w.rope_factors.data();
  return r;
}
inline ref::RopeSpec layer_rope(const ModelConfig& c, const ModelWeights& w, int64_t il) {
  return rope_of(c, w, c.is_swa(il));
}

// Does any layer use the sliding-window RoPE variant with a different table
// than the full layers'? (Then the forward computes both tables per token.)
inline bool rope_differs(const ref::RopeSpec& a, const ref::RopeSpec& b) {
  return a.freq_base != b.freq_base || a.freq_scale != b.freq_scale || a.ext_factor != b.ext_factor ||
         a.attn_factor != b.attn_factor || a.beta_fast != b.beta_fast || a.beta_slow != b.beta_slow ||
         a.n_ctx_orig != b.n_ctx_orig || a.rope_dim != b.rope_dim;
}

}  // namespace serval::blocks
