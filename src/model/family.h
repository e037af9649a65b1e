// A model family: what `general.architecture` names. Each family is one file
// in model/families/ that declares
//   - its hyper-parameter keys (read_config, after the keys all families share),
//     and its block recipe (model_config.h: which shared building blocks its
//     layers are made of), sliding-window pattern and RoPE variants;
//   - its tensors, with their shapes (load_tensors, through a TensorLoader that
//     checks each shape and type and records which tensors were used: a tensor
//     no family code asked for is an error, so nothing that changes the math
//     is ignored silently).
// The forward passes (batch_forward.h, reference_forward.h) run any recipe;
// adding a family touches neither them nor the engine, scheduler or server:
// write the file and list it in families/registry.cpp.
//
// Families are immutable statics; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "model/tensor_loader.h"
#include "model/weights.h"

namespace serval {

struct Family {
  const char* name;  // general.architecture
  // Reads the family's own keys into c (read_common_hparams has run) and sets
  // c.block, the sliding-window pattern and the RoPE layout.
  Status (*read_config)(const HparamReader& r, ModelConfig& c);
  // Loads every tensor of the family into w through ld (shapes checked);
  // null: load_standard (the llama tensor set plus what the recipe asks for).
  Status (*load_tensors)(TensorLoader& ld, const ModelConfig& c, ModelWeights& w) = nullptr;
};

// The family of `arch`, or null.
const Family* find_family(const std::string& arch);
// Every registered family, in registry order.
const std::vector<const Family*>& families();

// Shared pieces of load_tensors.
// token_embd, output_norm and output (tied to token_embd when absent); with
// n_vocab from token_embd's rows.
Status load_embeddings(TensorLoader& ld, const ModelConfig& c, ModelWeights& w);
// attn_norm, attn_q/k/v (or fused attn_qkv, split into views), attn_output,
// the recipe's biases, q/k norms and post-attention norm.
Status load_attention(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l);
// ffn_norm, ffn_gate/ffn_up (or ffn_up holding gate rows then up rows, when
// ffn_gate is absent and fused_up_gate), ffn_down, the recipe's post-FFN norm.
Status load_ffn(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l, bool fused_up_gate = false);
// The mixture-of-experts FFN: the norm (`norm_name`: ffn_norm, or gpt-oss's
// post_attention_norm), ffn_gate_inp (the router) and ffn_{gate,up,down}_exps,
// with the recipe's biases.
Status load_moe_ffn(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l,
                    const std::string& norm_name = "ffn_norm");
// load_embeddings, then load_attention and load_ffn (load_moe_ffn with the
// recipe's moe) for every layer.
Status load_standard(TensorLoader& ld, const ModelConfig& c, ModelWeights& w, bool fused_up_gate = false);
// Reads expert_count (1..kMaxExperts), expert_used_count (1..expert_count) and
// expert_feed_forward_length (default feed_forward_length) and sets recipe moe.
constexpr int64_t kMaxExperts = 1024;
Status read_moe_hparams(const HparamReader& r, ModelConfig& c);

// Encoders (bert, nomic-bert): marks c an encoder, reads
// attention.layer_norm_epsilon and attention.causal (true is refused), and
// defaults the pooling to mean when the file names none.
Status read_encoder_hparams(const HparamReader& r, ModelConfig& c);
// The encoder tensors of model_config.h's EncoderRecipe (c.enc says which):
// embeddings, token type 0, positions, the embedding norm, every layer, and
// the optional classification head (required by rank pooling).
Status load_encoder(TensorLoader& ld, const ModelConfig& c, ModelWeights& w);

// Sets c.layer_swa: layer il is a sliding-window layer unless (il + 1) % period == 0
// (gemma3, period 6: 5 local then 1 global; gemma2, period 2: even layers local).
void set_swa_period(ModelConfig& c, int64_t period);
void set_swa_all(ModelConfig& c);

}  // namespace serval
