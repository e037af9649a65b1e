// `phi3`: Phi-3, Phi-3.5 and Phi-4(-mini) dense models.
//   keys: the common ones, attention.sliding_window (0: none; every layer
//         attends in the window otherwise), rope.scaling.original_context_length
//         and rope.scaling.attn_factor (LongRoPE)
//   tensors: token_embd, output_norm, output, rope_factors_long /
//            rope_factors_short (optional, [rope_dim/2]: LongRoPE), per layer
//            attn_norm, attn_qkv (fused: Q, K, V rows) or attn_{q,k,v},
//            attn_output, ffn_norm, ffn_up (fused: gate rows, then up rows),
//            ffn_down
//   block: RMSNorm, RoPE (NEOX), SwiGLU
// LongRoPE: like llama.cpp, the long factors apply when the model's context
// (context_length) exceeds the original one, else the short factors.
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader&, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  if (c.sliding_window > 0) set_swa_all(c);
  return {};
}

Status load_tensors(TensorLoader& ld, const ModelConfig& c, ModelWeights& w) {
  SERVAL_RETURN_IF_ERROR(load_standard(ld, c, w, /*fused_up_gate=*/true));
  const bool want_long = c.n_ctx_train > c.rope.n_ctx_orig;
  std::vector<float> long_f, short_f;
  SERVAL_RETURN_IF_ERROR(ld.vec("rope_factors_long.weight", c.rope_dim / 2, &long_f, /*optional=*/true));
  SERVAL_RETURN_IF_ERROR(ld.vec("rope_factors_short.weight", c.rope_dim / 2, &short_f, /*optional=*/true));
  w.rope_factors = want_long && !long_f.empty() ? long_f : short_f;
  return {};
}

}  // namespace

extern const Family kPhi3Family{"phi3", read_config, load_tensors};

}  // namespace serval
