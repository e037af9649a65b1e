// Hyper-parameters of a decoder-only transformer, read from GGUF metadata by
// the model's family (model/family.h, model/families/*.cpp), validated, with
// the block recipe that tells the forward passes which shared building blocks
// the family's layers are made of. Plain value; thread-compatible.
#pragma once

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "kernels/ref/ops.h"

namespace serval {

struct Family;

enum class FfnActivation {
  silu,        // SwiGLU: silu(gate) * up (llama, qwen, phi3, nomic-bert)
  gelu_tanh,   // GeGLU: gelu_tanh(gate) * up (gemma)
  swiglu_oai,  // gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
};

// How an embedding is pooled from a sequence's final hidden states
// (`<arch>.pooling_type`, llama.cpp's llama_pooling_type numbering).
enum class Pooling {
  none = 0,  // no pooled output: the model generates (decoders without the key)
  mean = 1,  // the mean of every token's state
  cls = 2,   // the first token's state ([CLS])
  last = 3,  // the last token's state (decoder embedding models, e.g. Qwen3-Embedding)
  rank = 4,  // the first token's state through the classification head (cls, tanh, cls.output): a reranker's score
};
const char* pooling_name(Pooling p);

// How a mixture-of-experts layer weighs the experts it picks (top-k by the
// router's logits in both: softmax is monotonic).
enum class MoeGating {
  softmax,          // softmax over all experts, the top-k's probabilities (renormalized with moe_norm_weights)
  softmax_of_topk,  // softmax over the top-k logits alone (gpt-oss)
};

// Which building blocks a layer is made of, in this order:
//   x = x * embd_scale                                  (once, after the embedding lookup)
//   h = rmsnorm(x, attn_norm)
//   q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)        (fused QKV tensors are split at load)
//   q, k = rmsnorm per head (attn_q_norm, attn_k_norm)  (qk_norm)
//   q, k = rope(q, k)                                   (the layer's RopeSpec)
//   a = attention(q * attn_scale, K, V)                 (sliding window, soft-capping)
//   a = a Wo;  a = rmsnorm(a, post_attn_norm)           (post_attn_norm)
//   x = x + a
//   h = rmsnorm(x, ffn_norm); f = act(h Wgate) * (h Wup) Wdown;  f = rmsnorm(f, post_ffn_norm)
//   x = x + f
// and at the end logits = rmsnorm(x, output_norm) Wout, soft-capped by final_softcap.
struct BlockRecipe {
  bool qkv_bias = false;        // attn_{q,k,v}.bias (qwen2)
  bool qk_norm = false;         // attn_{q,k}_norm.weight [head_dim] (qwen3, gemma3)
  bool post_attn_norm = false;  // post_attention_norm.weight (gemma2/3)
  bool post_ffn_norm = false;   // post_ffw_norm.weight (gemma2/3)
  bool attn_out_bias = false;   // attn_output.bias (gpt-oss)
  bool attn_sinks = false;      // attn_sinks.weight, one logit per head in the softmax's denominator (gpt-oss)
  FfnActivation act = FfnActivation::silu;
  // Mixture of experts instead of the dense FFN: the router (ffn_gate_inp)
  // picks n_expert_used of n_expert experts per token; their outputs are
  // summed with the gating weights.
  bool moe = false;
  MoeGating gating = MoeGating::softmax;
  bool moe_norm_weights = true;  // softmax gating: divide the top-k probabilities by their sum
  bool moe_biases = false;       // ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias (gpt-oss)
};

// The layer layout of BERT-style encoders (bert, nomic-bert), which the
// decoder recipe above does not describe: post-LayerNorm with biases and
// attention over the whole input (no causal mask, no KV cache):
//   x = LayerNorm(token_embd[t] + token_types[0] (+ position_embd[pos]), token_embd_norm)
//   per layer:
//     q, k, v = x Wq + bq, x Wk + bk, x Wv + bv   (or fused attn_qkv, biases optional)
//     q, k = rope(q, k)                          (rope: nomic-bert)
//     a = attention(q / sqrt(head_dim), K, V) Wo (+ bo)   over every token of the input
//     x = LayerNorm(x + a, attn_output_norm)
//     f = gelu(x Wup + bup) Wdown + bdown        (gated: silu(x Wgate) * (x Wup), then Wdown)
//     x = LayerNorm(x + f, layer_output_norm)
// The output is x (no final norm); pooling and the classification head follow.
struct EncoderRecipe {
  bool abs_pos = false;  // position_embd [n_ctx_train, dim] (bert)
  bool rope = false;     // rotary positions on q, k (nomic-bert, NEOX layout)
  bool gated = false;    // ffn_gate (SwiGLU, nomic-bert) instead of GELU on ffn_up (bert)
};

// This process's part of a tensor-parallel split (model/tensor_parallel.h):
// rank `rank` of `size`; size 1 is the whole model.
struct TensorParallel {
  int32_t rank = 0;
  int32_t size = 1;
};

struct ModelConfig {
  const Family* family = nullptr;  // never null after read: the family of general.architecture
  std::string arch;                // general.architecture
  BlockRecipe block;
  // Encoders (bert, nomic-bert) run the encoder layout instead of the block
  // recipe and never generate: they only embed (model/embed_forward.h).
  bool encoder = false;
  EncoderRecipe enc;
  Pooling pooling = Pooling::none;  // <arch>.pooling_type (decoders: none unless the file sets it)
  float norm_eps = 1e-12f;          // attention.layer_norm_epsilon (encoders' LayerNorm)

  int64_t n_vocab = 0;     // rows of token_embd
  int64_t dim = 0;         // embedding_length
  int64_t n_layers = 0;    // block_count
  int64_t n_heads = 0;     // attention.head_count
  int64_t n_kv_heads = 0;  // attention.head_count_kv (GQA); defaults to n_heads
  int64_t head_dim = 0;    // attention.key_length; defaults to dim / n_heads
  int64_t rope_dim = 0;    // rope.dimension_count; defaults to head_dim
  int64_t ffn_dim = 0;     // feed_forward_length
  int64_t n_expert = 0;        // expert_count (recipe moe)
  int64_t n_expert_used = 0;   // expert_used_count
  int64_t expert_ffn_dim = 0;  // expert_feed_forward_length (default feed_forward_length)
  int64_t n_ctx_train = 0; // context_length
  float rms_eps = 1e-5f;   // attention.layer_norm_rms_epsilon

  // RoPE of full-attention layers and of sliding-window layers (the
  // freq_factors pointer is left null here: the factors are a tensor, in
  // ModelWeights::rope_factors, and the forward passes point at them).
  ref::RopeSpec rope;
  ref::RopeSpec rope_swa;

  float embd_scale = 1.0f;     // gemma: sqrt(dim)
  float attn_scale = 0.0f;     // query scale; 0 = 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;   // attn_logit_softcapping (gemma2); 0 = none
  float final_softcap = 0.0f;  // final_logit_softcapping (gemma2); 0 = none

  // Sliding-window attention: layer il attends to the last `sliding_window`
  // positions (itself included) when layer_swa[il]; all positions otherwise.
  int32_t sliding_window = 0;
  std::vector<uint8_t> layer_swa;  // [n_layers]; empty = no sliding-window layer

  // Metadata the family does not apply but that does not change its math as
  // llama.cpp runs it (one line each; Model::warnings() carries them).
  std::vector<std::string> warnings;

  // A tensor-parallel shard counts its own heads and FFN columns in n_heads,
  // n_kv_heads and ffn_dim (model/tensor_parallel.h).
  TensorParallel tp;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  bool is_swa(int64_t il) const { return !layer_swa.empty() && layer_swa[(size_t)il] != 0; }
  int32_t window(int64_t il) const { return is_swa(il) ? sliding_window : 0; }
  bool has_swa() const {
    for (uint8_t s : layer_swa)
      if (s) return true;
    return false;
  }
  float query_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt((float)head_dim); }
};

// Reads GGUF metadata for a family: `<arch>.<key>` lookups, range-checked,
// with errors that name the key and the value.
class HparamReader {
 public:
  HparamReader(const gguf::GgufFile& f, std::string arch) : f_(f), prefix_(std::move(arch) + ".") {}

  // Integer `<arch>.key` into [lo, hi]; `def` when the key is absent and
  // def >= 0, else a missing key is an error.
  Status get_int(const std::string& key, int64_t lo, int64_t hi, int64_t def, int64_t* out) const;
  // Boolean `<arch>.key`; left unchanged when absent.
  Status get_bool(const std::string& key, bool* out) const;
  // Float `<arch>.key` into [lo, hi]; left unchanged when absent.
  Status get_float(const std::string& key, double lo, double hi, float* out) const;
  // String `<arch>.key`; left unchanged when absent.
  Status get_string(const std::string& key, std::string* out) const;
  bool has(const std::string& key) const;
  // Was `<arch>.key` read through get_*? (Keys a family reads are applied.)
  bool was_read(const std::string& key) const { return read_.count(key) != 0; }
  const gguf::GgufFile& file() const { return f_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const gguf::GgufFile& f_;
  std::string prefix_;
  mutable std::set<std::string> read_;
};

// The hyper-parameters every family shares (embedding_length, block_count,
// head counts, head size, rope dimension/base/scaling, rms eps, context,
// pooling_type),
// into c. Families call it first, then read their own keys.
Status read_common_hparams(const HparamReader& r, ModelConfig& c);

// Finds the family of general.architecture, reads and range-checks the
// hyper-parameters (n_vocab is filled in from the token embedding by the
// weight loader). Errors name the key and the value; an architecture without a
// family gets "unsupported architecture 'X' (supported: ...)".
Expected<ModelConfig> read_model_config(const gguf::GgufFile& f);

}  // namespace serval
