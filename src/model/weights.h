// The weights of a loaded model: views into the GGUF mapping for the big
// matrices (in their stored type, repacked for the SIMD kernels at load) and
// F32 copies of the small vectors (norms, biases, RoPE factors). Plain
// structs; immutable after load, safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/matmul.h"
#include "tensor/dtype.h"

namespace serval {

// A 2-D weight matrix as GGUF stores it: `rows` rows of `cols` elements of
// `type`, row-major, each row row_size(type, cols) bytes. Points into the mapping
// (a fused tensor, e.g. phi3's attn_qkv, is split into views of its row ranges).
// `packed`, when set, is the same matrix repacked for the SIMD kernels
// (kernels::PackedMatrix); the batched forward multiplies with it, the
// reference forward always reads `data`.
struct Matrix {
  DType type = DType::f32;
  int64_t rows = 0;  // output features (ggml ne[1])
  int64_t cols = 0;  // input features (ggml ne[0])
  const uint8_t* data = nullptr;
  std::shared_ptr<const kernels::PackedMatrix> packed;
};

struct LayerWeights {
  std::vector<float> attn_norm;       // [dim]
  Matrix wq, wk, wv, wo;              // [q_dim, dim], [kv_dim, dim] x2, [dim, q_dim]
  std::vector<float> bq, bk, bv;      // [q_dim], [kv_dim], [kv_dim]; empty when absent
  std::vector<float> q_norm, k_norm;  // [head_dim] each (recipe qk_norm); else empty
  std::vector<float> post_attn_norm;  // [dim] (recipe post_attn_norm); else empty
  std::vector<float> bo;              // [dim] attn_output.bias (recipe attn_out_bias); else empty
  std::vector<float> sinks;           // [n_heads] attn_sinks (recipe attn_sinks); else empty
  std::vector<float> ffn_norm;        // [dim]
  Matrix w_gate, w_up, w_down;        // [ffn, dim] x2, [dim, ffn]; dense FFN only
  std::vector<float> post_ffn_norm;   // [dim] (recipe post_ffn_norm); else empty
  // Mixture of experts (recipe moe): the router and each expert's matrices,
  // views of the 3-D ffn_{gate,up,down}_exps tensors (expert e's slice).
  Matrix router;                                // [n_expert, dim] ffn_gate_inp
  std::vector<float> router_bias;               // [n_expert] or empty
  std::vector<Matrix> exp_gate, exp_up, exp_down;  // [n_expert] x [expert_ffn, dim] / [dim, expert_ffn]
  std::vector<float> exp_gate_b, exp_up_b, exp_down_b;  // [n_expert * expert_ffn] x2, [n_expert * dim]; or empty
  // Encoders (model_config.h EncoderRecipe): the post-attention and output
  // LayerNorms (weight, bias) and the FFN biases (bert); w_gate only when gated.
  std::vector<float> attn_out_norm, attn_out_norm_b, layer_out_norm, layer_out_norm_b;  // [dim] each
  std::vector<float> b_up, b_down;  // [ffn], [dim]; empty when absent
};

struct ModelWeights {
  Matrix token_embd;                 // [n_vocab, dim]
  std::vector<float> output_norm;    // [dim]
  Matrix output;                     // [n_vocab, dim]; token_embd when tied
  bool tied_output = false;
  std::vector<float> rope_factors;   // [rope_dim / 2] or empty: divides each pair's frequency
                                     // (Llama 3 rope_freqs, Phi-3 LongRoPE factors)
  std::vector<LayerWeights> layers;
  // Encoders: token type 0's embedding (every token is "sentence A", as in
  // llama.cpp), absolute position embeddings (bert), the embedding LayerNorm,
  // and the classification head of rerankers (rank pooling).
  std::vector<float> token_type0;          // [dim]
  Matrix pos_embd;                         // [n_ctx_train, dim]; absent without EncoderRecipe::abs_pos
  std::vector<float> embd_norm, embd_norm_b;  // [dim]
  Matrix cls;                              // [dim, dim] cls.weight; absent without a head
  std::vector<float> cls_b;                // [dim]
  Matrix cls_out;                          // [n_cls_out, dim] cls.output.weight; optional
  std::vector<float> cls_out_b;            // [n_cls_out]
};

}  // namespace serval
