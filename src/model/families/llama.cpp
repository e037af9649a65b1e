// `llama`: Llama 1/2/3.x, Mistral and Ministral (same architecture key), and
// every other model llama.cpp's converter writes as `llama`.
//   keys: the common ones (model_config.h), incl. rope.scaling.{type,factor,
//         original_context_length} (linear, YaRN)
//   tensors: token_embd, output_norm, output (optional: tied), rope_freqs
//            (optional, [rope_dim/2]: Llama 3.1+ frequency factors), per layer
//            attn_norm, attn_{q,k,v,output}, ffn_norm, ffn_{gate,up,down}
//   block: RMSNorm, RoPE (adjacent pairs), SwiGLU
//   with experts (Mixtral): expert_count, expert_used_count and
//   ffn_gate_inp, ffn_{gate,up,down}_exps instead of the dense FFN; softmax
//   router, top-k, renormalized weights
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::adjacent;
  int64_t n_expert = 0;
  SERVAL_RETURN_IF_ERROR(r.get_int("expert_count", 0, kMaxExperts, 0, &n_expert));
  if (n_expert > 0) {
    SERVAL_RETURN_IF_ERROR(read_moe_hparams(r, c));
    c.block.gating = MoeGating::softmax;
    c.block.moe_norm_weights = true;
  }
  return {};
}

Status load_tensors(TensorLoader& ld, const ModelConfig& c, ModelWeights& w) {
  SERVAL_RETURN_IF_ERROR(load_standard(ld, c, w));
  // Llama 3.1+: the converter turns rope_scaling {factor, low/high_freq_factor,
  // original_max_position_embeddings} into one factor per frequency.
  return ld.vec("rope_freqs.weight", c.rope_dim / 2, &w.rope_factors, /*optional=*/true);
}

}  // namespace

extern const Family kLlamaFamily{"llama", read_config, load_tensors};

}  // namespace serval
