// `gemma3`: Gemma 3 text models.
//   keys: the common ones, attention.sliding_window (required),
//         rope.freq_base_swa (local layers' base, default 10000; their RoPE is
//         never scaled), rope.scaling.* for the global layers
//   tensors: the gemma2 set plus per layer attn_q_norm, attn_k_norm [head_dim]
//   block: embeddings x sqrt(dim); RMSNorm; per-head Q/K RMSNorm; RoPE (NEOX,
//          local or global base); queries scaled by 1/sqrt(head_dim) (27B,
//          62 layers: 1/sqrt(dim/heads)); post-attention norm; GeGLU (tanh);
//          post-FFN norm; 5 sliding-window layers then 1 global, repeating
#include <cmath>

#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.qk_norm = true;
  c.block.post_attn_norm = c.block.post_ffn_norm = true;
  c.block.act = FfnActivation::gelu_tanh;
  c.embd_scale = std::sqrt((float)c.dim);
  if (!r.has("attention.sliding_window"))
    return not_found("metadata key '" + r.prefix() + "attention.sliding_window' is missing");
  c.rope_swa = c.rope;
  c.rope_swa.freq_base = 10000.0f;
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.freq_base_swa", 1.0, 1e12, &c.rope_swa.freq_base));
  c.rope_swa.freq_scale = 1.0f;
  c.rope_swa.ext_factor = 0.0f;
  c.attn_scale = c.n_layers == 62 ? 1.0f / std::sqrt((float)(c.dim / c.n_heads)) : 1.0f / std::sqrt((float)c.head_dim);
  set_swa_period(c, 6);
  return {};
}

}  // namespace

extern const Family kGemma3Family{"gemma3", read_config};

}  // namespace serval
