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
  std::vector<float> ffn_norm;        // [dim]
  Matrix w_gate, w_up, w_down;        // [ffn, dim] x2, [dim, ffn]
  std::vector<float> post_ffn_norm;   // [dim] (recipe post_ffn_norm); else empty
};

struct ModelWeights {
  Matrix token_embd;                 // [n_vocab, dim]
  std::vector<float> output_norm;    // [dim]
  Matrix output;                     // [n_vocab, dim]; token_embd when tied
  bool tied_output = false;
  std::vector<float> rope_factors;   // [rope_dim / 2] or empty: divides each pair's frequency
                                     // (Llama 3 rope_freqs, Phi-3 LongRoPE factors)
  std::vector<LayerWeights> layers;
};

}  // namespace serval
