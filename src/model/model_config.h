// Hyper-parameters of a decoder-only transformer, read from GGUF metadata
// (`<arch>.embedding_length`, ...), validated, with the architecture's traits.
// Plain value; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "kernels/ref/ops.h"

namespace serval {

// What distinguishes the supported llama.cpp-style families.
struct ArchTraits {
  std::string name;        // general.architecture: "llama", "qwen2"
  ref::RopeLayout rope;    // adjacent (llama) or neox (qwen2)
  bool qkv_bias;           // qwen2: Q/K/V projections carry a bias
};

// The traits of `arch`; unsupported for an architecture serval cannot run.
Expected<ArchTraits> arch_traits(const std::string& arch);

struct ModelConfig {
  ArchTraits arch;
  int64_t n_vocab = 0;     // rows of token_embd
  int64_t dim = 0;         // embedding_length
  int64_t n_layers = 0;    // block_count
  int64_t n_heads = 0;     // attention.head_count
  int64_t n_kv_heads = 0;  // attention.head_count_kv (GQA); defaults to n_heads
  int64_t head_dim = 0;    // attention.key_length; defaults to dim / n_heads
  int64_t rope_dim = 0;    // rope.dimension_count; defaults to head_dim
  int64_t ffn_dim = 0;     // feed_forward_length
  int64_t n_ctx_train = 0; // context_length
  float rms_eps = 1e-5f;   // attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;  // rope.freq_base

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads and range-checks the hyper-parameters (n_vocab is filled in from the
// token embedding by the weight loader). Errors name the key and the value.
Expected<ModelConfig> read_model_config(const gguf::GgufFile& f);

}  // namespace serval
