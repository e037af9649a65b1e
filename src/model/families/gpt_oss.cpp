// `gpt-oss`: OpenAI's gpt-oss-20b / -120b.
//   keys: the common ones (rope.scaling.* YaRN), attention.sliding_window,
//         expert_count, expert_used_count, expert_feed_forward_length
//   tensors: token_embd, output_norm, output; per layer attn_norm,
//            attn_{q,k,v,output} with biases, attn_sinks [n_heads],
//            post_attention_norm (the FFN's input norm), ffn_gate_inp with
//            bias, ffn_{gate,up,down}_exps with biases
//   block: RMSNorm; Q/K/V/O biases; NEOX RoPE (YaRN); attention with one sink
//          logit per head; even layers in a sliding window; FFN: top-k of the
//          router's logits, softmax over those k, experts with the clamped
//          SwiGLU (alpha 1.702, limit 7, up + 1)
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.qkv_bias = true;
  c.block.attn_out_bias = true;
  c.block.attn_sinks = true;
  c.block.act = FfnActivation::swiglu_oai;
  SERVAL_RETURN_IF_ERROR(read_moe_hparams(r, c));
  c.block.gating = MoeGating::softmax_of_topk;
  c.block.moe_norm_weights = false;
  c.block.moe_biases = true;
  if (!r.has("attention.sliding_window"))
    return not_found("metadata key '" + r.prefix() + "attention.sliding_window' is missing");
  set_swa_period(c, 2);  // even layers local
  return {};
}

Status load_tensors(TensorLoader& ld, const ModelConfig& c, ModelWeights& w) {
  SERVAL_RETURN_IF_ERROR(load_embeddings(ld, c, w));
  w.layers.resize((size_t)c.n_layers);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    SERVAL_RETURN_IF_ERROR(load_attention(ld, c, il, w.layers[(size_t)il]));
    SERVAL_RETURN_IF_ERROR(load_moe_ffn(ld, c, il, w.layers[(size_t)il], "post_attention_norm"));
  }
  return {};
}

}  // namespace

extern const Family kGptOssFamily{"gpt-oss", read_config, load_tensors};

}  // namespace serval
