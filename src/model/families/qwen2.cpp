// `qwen2`: Qwen 1.5 / 2 / 2.5.
//   keys: the common ones
//   tensors: the llama set (output optional: tied) plus attn_{q,k,v}.bias
//   block: RMSNorm, Q/K/V biases, RoPE (NEOX halves), SwiGLU
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader&, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.qkv_bias = true;
  return {};
}

}  // namespace

extern const Family kQwen2Family{"qwen2", read_config};

}  // namespace serval
