// A loaded model: the GGUF file (mapped), its validated config and views of its
// weights. Big matrices stay in the mapping in their stored type (no copy);
// small vectors (norms, biases) are widened to F32 at load.
//
// Immutable after load(): safe to share between threads. Move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "kernels/matmul.h"
#include "model/model_config.h"

namespace serval {

// A 2-D weight matrix as GGUF stores it: `rows` rows of `cols` elements of
// `type`, row-major, each row row_size(type, cols) bytes. Points into the mapping.
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
  std::vector<float> attn_norm;      // [dim]
  Matrix wq, wk, wv, wo;             // [q_dim, dim], [kv_dim, dim] x2, [dim, q_dim]
  std::vector<float> bq, bk, bv;     // [q_dim], [kv_dim], [kv_dim]; empty when absent
  std::vector<float> ffn_norm;       // [dim]
  Matrix w_gate, w_up, w_down;       // [ffn, dim] x2, [dim, ffn]
};

struct ModelWeights {
  Matrix token_embd;                 // [n_vocab, dim]
  std::vector<float> output_norm;    // [dim]
  Matrix output;                     // [n_vocab, dim]; token_embd when tied
  bool tied_output = false;
  std::vector<LayerWeights> layers;
};

class Model {
 public:
  // Maps, validates config and every tensor's shape and type. Errors name the
  // tensor and the expected vs actual shape. Matrices of a packable type
  // (kernels::PackedMatrix::packable) are repacked unless the environment sets
  // SERVAL_PACK_WEIGHTS=0 (for A/B benchmarks).
  static Expected<std::unique_ptr<Model>> load(const std::string& path);
  static Expected<std::unique_ptr<Model>> from_file(gguf::GgufFile file);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const gguf::GgufFile& file() const { return file_; }

 private:
  Model(gguf::GgufFile f) : file_(std::move(f)) {}
  Status load_weights();
  void pack_weights();

  gguf::GgufFile file_;
  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace serval
