// `qwen3`: Qwen 3 dense models (and decoder embedding models built on them).
//   keys: the common ones; attention.key_length / value_length give head_dim
//         when it differs from embedding_length / head_count
//   tensors: the llama set (output optional: tied) plus per layer
//            attn_q_norm, attn_k_norm [head_dim]
//   block: RMSNorm, per-head RMSNorm of Q and K before RoPE (NEOX), SwiGLU
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader&, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.qk_norm = true;
  return {};
}

}  // namespace

extern const Family kQwen3Family{"qwen3", read_config};

}  // namespace serval
