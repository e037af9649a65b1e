// `gemma2`: Gemma 2.
//   keys: the common ones, attention.sliding_window (default 4096),
//         attn_logit_softcapping (default 50), final_logit_softcapping (default 30)
//   tensors: token_embd (tied output), output_norm, per layer attn_norm,
//            attn_{q,k,v,output}, post_attention_norm, ffn_norm,
//            ffn_{gate,up,down}, post_ffw_norm (norm weights as the converter
//            stores them: 1 + w)
//   block: embeddings x sqrt(dim); RMSNorm; RoPE (NEOX); queries scaled by
//          1/sqrt(head_dim) (27B, 46 layers: 1/sqrt(dim/heads), llama.cpp's
//          reading of query_pre_attn_scalar); attention scores soft-capped;
//          post-attention norm; GeGLU (tanh); post-FFN norm; even layers
//          attend in a sliding window; final logits soft-capped
#include <cmath>

#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.post_attn_norm = c.block.post_ffn_norm = true;
  c.block.act = FfnActivation::gelu_tanh;
  c.embd_scale = std::sqrt((float)c.dim);
  if (c.sliding_window == 0) c.sliding_window = 4096;
  c.attn_softcap = 50.0f;
  c.final_softcap = 30.0f;
  SERVAL_RETURN_IF_ERROR(r.get_float("attn_logit_softcapping", 0.0, 1e6, &c.attn_softcap));
  SERVAL_RETURN_IF_ERROR(r.get_float("final_logit_softcapping", 0.0, 1e6, &c.final_softcap));
  c.attn_scale = c.n_layers == 46 ? 1.0f / std::sqrt((float)(c.dim / c.n_heads)) : 1.0f / std::sqrt((float)c.head_dim);
  set_swa_period(c, 2);
  return {};
}

}  // namespace

extern const Family kGemma2Family{"gemma2", read_config};

}  // namespace serval
