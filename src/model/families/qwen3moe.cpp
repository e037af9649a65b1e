// `qwen3moe`: Qwen 3 mixture-of-experts (Qwen3-30B-A3B, Qwen3-235B-A22B).
//   keys: the common ones, expert_count, expert_used_count,
//         expert_feed_forward_length
//   tensors: the qwen3 attention set (q/k norms); per layer ffn_norm,
//            ffn_gate_inp [n_expert, dim], ffn_{gate,up}_exps
//            [n_expert, expert_ffn, dim], ffn_down_exps [n_expert, dim, expert_ffn]
//   block: qwen3's attention; FFN: softmax router, top-k experts, their
//          probabilities renormalized to sum 1, SwiGLU experts
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.rope.layout = c.rope_swa.layout = ref::RopeLayout::neox;
  c.block.qk_norm = true;
  SERVAL_RETURN_IF_ERROR(read_moe_hparams(r, c));
  c.block.gating = MoeGating::softmax;
  c.block.moe_norm_weights = true;
  return {};
}

}  // namespace

extern const Family kQwen3MoeFamily{"qwen3moe", read_config};

}  // namespace serval
