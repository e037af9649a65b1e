// `nomic-bert`: nomic-embed-text (v1, v1.5).
//   keys: the common ones (rope.freq_base), attention.layer_norm_epsilon,
//         attention.causal (must be false), pooling_type (default mean)
//   tensors: token_embd, token_types, token_embd_norm (weight, bias), per
//            layer attn_qkv (fused: Q, K, V rows), attn_output,
//            attn_output_norm, ffn_up, ffn_gate, ffn_down, layer_output_norm
//   layout: model_config.h EncoderRecipe with RoPE (NEOX) and SwiGLU
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.enc.rope = true;
  c.enc.gated = true;
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  return read_encoder_hparams(r, c);
}

}  // namespace

extern const Family kNomicBertFamily{"nomic-bert", read_config, load_encoder};

}  // namespace serval
