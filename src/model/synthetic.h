// Synthetic models: GGUF files of any supported family (llama, qwen2, qwen3,
// qwen3moe, gemma2, gemma3, phi3, and the encoders bert and nomic-bert) with seeded random weights at real model shapes,
// carrying the tokenizer of a vocab-only GGUF, with the keys and tensor names
// llama.cpp's converter writes for that family. They are the benchmark models
// of the kernels/engine issues (and load in llama.cpp too). The weights are
// N(0, 0.02) like a fresh init (norms are 1), so the compute is real even
// though the text is noise.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "gguf/gguf_reader.h"
#include "tensor/dtype.h"

namespace serval {

struct SynthShape {
  std::string name;
  int64_t dim, n_layers, n_heads, n_kv_heads, ffn_dim, n_ctx;
  int64_t head_dim = 0;        // 0: dim / n_heads
  int64_t sliding_window = 0;  // for families with sliding-window layers; 0: the family's default
  std::string arch = "llama";  // the family the shape is of (the default of --arch)
  int64_t n_expert = 0, n_expert_used = 0, expert_ffn_dim = 0;  // mixture of experts (qwen3moe, gpt-oss)
};

// Known shapes: "tinyllama-1.1b", "llama-160m", "llama-7b", "tiny" (a test-size
// model), "qwen3-0.6b", "gemma3-1b" (26 layers, 5 local : 1 global, window 512),
// "qwen3moe-30b-a3b" (48 layers, 128 experts of 768, 8 used) and
// "qwen3moe-tiny" (16 experts, 4 used: a test-size MoE), and encoders:
// "bert-base" (768 wide, 12 layers, 512 positions), "bert-tiny" (a test-size
// bert) and "nomic-embed" (nomic-bert, 768 wide, 12 layers).
const std::vector<SynthShape>& synth_shapes();
Expected<SynthShape> find_synth_shape(const std::string& name);

// The families write_synthetic_model can write.
const std::vector<std::string>& synth_archs();

struct SynthOptions {
  SynthOptions() = default;
  SynthOptions(SynthShape s, DType t, uint64_t sd = 42) : shape(std::move(s)), type(t), seed(sd) {}

  SynthShape shape;
  DType type = DType::f16;  // type of the 2-D weight matrices (norms stay F32)
  uint64_t seed = 42;
  // With type q4_k: llama.cpp's Q4_K_M mix instead (Q6_K for output.weight and
  // for attn_v / ffn_down of the layers its use_more_bits() picks).
  bool q4_k_m = false;
  std::string arch;  // the family to write (synth_archs()); empty: the shape's own
  // Encoders: pooling_type "mean" (default), "cls" or "rank" (bert: adds
  // the classification head cls / cls.output of a reranker).
  std::string pooling;
};

// Writes the model to `out_path`, taking every `tokenizer.*` key of `vocab`.
// Errors: unsupported type (cannot quantize), row length not a multiple of the
// type's block size, vocab without tokenizer.ggml.tokens, I/O failure.
Status write_synthetic_model(const SynthOptions& opt, const gguf::GgufFile& vocab, const std::string& out_path,
                             ThreadPool* pool = nullptr);

// A random LoRA adapter (llama.cpp's GGUF adapter format, model/lora.h) for
// the base model file `base`: for each of its matrices named by `targets`
// (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, output),
// lora_a [rank, cols] ~ N(0, 1/sqrt(cols)) and lora_b [rows, rank] ~ N(0, std_b)
// (not zero as at a fine-tune's start, so the adapter changes the output).
struct SynthLoraOptions {
  int64_t rank = 16;
  float alpha = 32.0f;
  float std_b = 0.02f;
  std::vector<std::string> targets = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  DType type = DType::f32;  // f32 or f16
  uint64_t seed = 7;
};
Status write_synthetic_lora(const SynthLoraOptions& opt, const gguf::GgufFile& base, const std::string& out_path);

}  // namespace serval
