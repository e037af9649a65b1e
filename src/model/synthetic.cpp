#include "model/synthetic.h"

#include <cmath>
#include <cstring>

#include "common/fp16.h"
#include "common/splitmix.h"
#include "gguf/gguf_writer.h"
#include "kernels/ref/quants.h"

namespace serval {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048},
      {"llama-160m", 768, 12, 12, 12, 3072, 2048},
      {"llama-7b", 4096, 32, 32, 32, 11008, 4096},
      {"tiny", 256, 2, 4, 2, 512, 512},
      {"qwen3-0.6b", 1024, 28, 16, 8, 3072, 40960, 128, 0, "qwen3"},
      {"gemma3-1b", 1152, 26, 4, 1, 6912, 32768, 256, 512, "gemma3"},
      {"qwen3moe-30b-a3b", 2048, 48, 32, 4, 6144, 40960, 128, 0, "qwen3moe", 128, 8, 768},
      {"qwen3moe-tiny", 256, 2, 4, 2, 512, 512, 64, 0, "qwen3moe", 16, 4, 128},
      {"bert-base", 768, 12, 12, 12, 3072, 512, 0, 0, "bert"},
      {"bert-tiny", 128, 2, 4, 4, 512, 128, 0, 0, "bert"},
      {"nomic-embed", 768, 12, 12, 12, 3072, 2048, 0, 0, "nomic-bert"},
  };
  return shapes;
}

const std::vector<std::string>& synth_archs() {
  static const std::vector<std::string> archs = {"llama",  "qwen2", "qwen3", "qwen3moe",  "gemma2",
                                                 "gemma3", "phi3",  "bert",  "nomic-bert"};
  return archs;
}

Expected<SynthShape> find_synth_shape(const std::string& name) {
  std::string known;
  for (const auto& s : synth_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  return invalid_argument("unknown shape '" + name + "' (known: " + known + ")");
}

namespace {

// Fills `n` values ~ N(0, std) from the stream of (seed, tensor_id, row).
void gaussian_row(uint64_t seed, uint64_t tensor_id, uint64_t row, float std_dev, float* out, int64_t n) {
  uint64_t s = seed ^ (tensor_id * 0x9e3779b97f4a7c15ull) ^ (row * 0xc2b2ae3d27d4eb4full);
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = ((double)(splitmix64_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double u2 = (double)(splitmix64_next(s) >> 11) * (1.0 / 9007199254740992.0);
    const double r = std::sqrt(-2.0 * std::log(u1)) * std_dev;
    out[i] = (float)(r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = (float)(r * std::sin(2.0 * M_PI * u2));
  }
}

// llama.cpp's general.file_type (LLAMA_FTYPE_*) for a uniform weight type.
uint32_t file_type_of(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::q4_0: return 2;
    case DType::q4_1: return 3;
    case DType::q8_0: return 7;
    case DType::q5_0: return 8;
    case DType::q5_1: return 9;
    case DType::q2_k: return 10;
    case DType::q3_k: return 12;  // Q3_K_M
    case DType::q4_k: return 15;  // Q4_K_M
    case DType::q5_k: return 17;  // Q5_K_M
    case DType::q6_k: return 18;
    case DType::iq4_nl: return 25;
    case DType::bf16: return 32;
    default: return 0;
  }
}

// The checks and keys every synthetic file shares: a type serval can write,
// rows that are whole blocks of it, the vocab's size; then general.* and the
// shape's common keys, with every tokenizer.* key of the vocab.
Status check_synth(const SynthShape& s, DType type, std::initializer_list<int64_t> row_lengths) {
  if (!ref::can_quantize(type)) return unsupported("cannot write weights of type " + std::string(dtype_name(type)));
  auto tr = dtype_traits(type);
  for (int64_t cols : row_lengths)
    if (cols % tr->block_size != 0)
      return invalid_argument("shape '" + s.name + "': row length " + std::to_string(cols) +
                              " is not a multiple of the " + std::string(tr->name) + " block size " +
                              std::to_string(tr->block_size));
  return {};
}

Expected<int64_t> vocab_size(const gguf::GgufFile& vocab) {
  auto tokens = vocab.get_array("tokenizer.ggml.tokens", gguf::ValueType::string);
  if (!tokens.ok()) return tokens.status().with_context("vocab file");
  const int64_t n_vocab = (int64_t)(*tokens)->items.size();
  if (n_vocab < 1) return invalid_file("vocab file: tokenizer.ggml.tokens is empty");
  return n_vocab;
}

void add_common_keys(gguf::GgufWriter& w, const SynthShape& s, const std::string& arch, DType type,
                     const gguf::GgufFile& vocab) {
  const std::string p = arch + ".";
  w.add("general.architecture", arch);
  w.add("general.name", "serval-synthetic-" + s.name + (arch == s.arch ? "" : "-" + arch));
  w.add("general.file_type", file_type_of(type));
  w.add("general.quantization_version", uint32_t{2});
  w.add(p + "context_length", (uint32_t)s.n_ctx);
  w.add(p + "embedding_length", (uint32_t)s.dim);
  w.add(p + "block_count", (uint32_t)s.n_layers);
  w.add(p + "feed_forward_length", (uint32_t)s.ffn_dim);
  w.add(p + "attention.head_count", (uint32_t)s.n_heads);
  for (const auto& kv : vocab.metadata())
    if (kv.key.rfind("tokenizer.", 0) == 0) w.add(kv.key, kv.value);
}

// Adds seeded N(0, 0.02) matrices to a writer, quantized row by row (rows in
// parallel); each tensor draws from its own stream (its order of addition).
class MatrixWriter {
 public:
  MatrixWriter(gguf::GgufWriter& w, uint64_t seed, ThreadPool* pool) : w_(w), seed_(seed), pool_(pool) {}
  // A [rows, cols] matrix; n_mat > 0: a 3-D stack of n_mat of them (expert tensors).
  void matrix(const std::string& name, int64_t rows, int64_t cols, DType type, int64_t n_mat = 0) {
    const uint64_t id = next_id();
    std::vector<int64_t> dims = {cols, rows};
    if (n_mat > 0) {
      dims.push_back(n_mat);
      rows *= n_mat;
    }
    ThreadPool* pool = pool_;
    const uint64_t seed = seed_;
    w_.add_tensor(name, dims, type, [=](uint8_t* dst, uint64_t) {
      const size_t rs = row_size(type, cols);
      auto work = [&](int64_t b, int64_t e) {
        std::vector<float> buf((size_t)cols);
        for (int64_t r = b; r < e; ++r) {
          gaussian_row(seed, id, (uint64_t)r, 0.02f, buf.data(), cols);
          ref::quantize_row(type, buf.data(), dst + (size_t)r * rs, cols);
        }
      };
      if (pool) pool->parallel_for(rows, work, 8);
      else work(0, rows);
    });
  }
  // The id of the next tensor (callers that add tensors of their own keep the streams in step).
  uint64_t next_id() { return ++tensor_id_; }
  uint64_t seed() const { return seed_; }

 private:
  gguf::GgufWriter& w_;
  uint64_t seed_;
  ThreadPool* pool_;
  uint64_t tensor_id_ = 0;
};

// Encoders (bert, nomic-bert): the tensors llama.cpp's converter writes.
// Norm weights are 1 + N(0, 0.1) and biases N(0, 0.02), so a forward that
// skips one shows.
Status write_synthetic_encoder(const SynthOptions& opt, const std::string& arch, const gguf::GgufFile& vocab,
                               const std::string& out_path, ThreadPool* pool) {
  const SynthShape& s = opt.shape;
  const bool bert = arch == "bert";
  if (s.n_kv_heads != s.n_heads || s.n_expert > 0 || (s.head_dim > 0 && s.head_dim * s.n_heads != s.dim))
    return invalid_argument("shape '" + s.name + "' is not an encoder shape (heads = KV heads, no experts)");
  uint32_t pooling = 1;  // mean
  if (opt.pooling == "cls") pooling = 2;
  else if (opt.pooling == "rank") pooling = 4;
  else if (!opt.pooling.empty() && opt.pooling != "mean")
    return invalid_argument("--pooling: expected mean, cls or rank, got '" + opt.pooling + "'");
  if (pooling == 4 && !bert) return invalid_argument("--pooling rank: only the bert family has a classification head");
  SERVAL_RETURN_IF_ERROR(check_synth(s, opt.type, {s.dim, s.ffn_dim}));
  auto n_vocab = vocab_size(vocab);
  if (!n_vocab.ok()) return n_vocab.status();

  gguf::GgufWriter w;
  const std::string p = arch + ".";
  add_common_keys(w, s, arch, opt.type, vocab);
  w.add(p + "attention.layer_norm_epsilon", 1e-12f);
  w.add(p + "attention.causal", false);
  w.add(p + "pooling_type", pooling);
  if (!bert) w.add(p + "rope.freq_base", 1000.0f);

  MatrixWriter mw(w, opt.seed, pool);
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, DType type) {
    mw.matrix(name, rows, cols, type);
  };
  // F32 vector of mean + N(0, sd).
  auto vec = [&](const std::string& name, int64_t n, float mean, float sd) {
    const uint64_t id = mw.next_id(), seed = mw.seed();
    w.add_tensor(name, {n}, DType::f32, [=](uint8_t* dst, uint64_t) {
      std::vector<float> buf((size_t)n);
      gaussian_row(seed, id, 0, sd, buf.data(), n);
      for (float& x : buf) x += mean;
      std::memcpy(dst, buf.data(), (size_t)n * sizeof(float));
    });
  };
  auto norm = [&](const std::string& name) {
    vec(name + ".weight", s.dim, 1.0f, 0.1f);
    vec(name + ".bias", s.dim, 0.0f, 0.02f);
  };
  const DType type = opt.type;
  const int64_t dim = s.dim, ff = s.ffn_dim;
  matrix("token_embd.weight", *n_vocab, dim, type);
  matrix("token_types.weight", 2, dim, DType::f32);
  if (bert) matrix("position_embd.weight", s.n_ctx, dim, type);
  norm("token_embd_norm");
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    if (bert) {
      for (const char* t : {"attn_q", "attn_k", "attn_v"}) {
        matrix(b + t + ".weight", dim, dim, type);
        vec(b + t + ".bias", dim, 0.0f, 0.02f);
      }
    } else {
      matrix(b + "attn_qkv.weight", 3 * dim, dim, type);
    }
    matrix(b + "attn_output.weight", dim, dim, type);
    if (bert) vec(b + "attn_output.bias", dim, 0.0f, 0.02f);
    norm(b + "attn_output_norm");
    matrix(b + "ffn_up.weight", ff, dim, type);
    if (!bert) matrix(b + "ffn_gate.weight", ff, dim, type);
    matrix(b + "ffn_down.weight", dim, ff, type);
    if (bert) {
      vec(b + "ffn_up.bias", ff, 0.0f, 0.02f);
      vec(b + "ffn_down.bias", dim, 0.0f, 0.02f);
    }
    norm(b + "layer_output_norm");
  }
  if (pooling == 4) {
    matrix("cls.weight", dim, dim, DType::f32);
    vec("cls.bias", dim, 0.0f, 0.02f);
    matrix("cls.output.weight", 1, dim, DType::f32);
    vec("cls.output.bias", 1, 0.0f, 0.02f);
  }
  return w.write_file(out_path);
}

}  // namespace

Status write_synthetic_model(const SynthOptions& opt, const gguf::GgufFile& vocab, const std::string& out_path,
                             ThreadPool* pool) {
  const SynthShape& s = opt.shape;
  const std::string arch = opt.arch.empty() ? s.arch : opt.arch;
  bool known = false;
  for (const std::string& a : synth_archs()) known |= a == arch;
  if (!known) {
    std::string names;
    for (const std::string& a : synth_archs()) names += (names.empty() ? "" : ", ") + a;
    return invalid_argument("unknown architecture '" + arch + "' (known: " + names + ")");
  }
  if (arch == "bert" || arch == "nomic-bert") return write_synthetic_encoder(opt, arch, vocab, out_path, pool);
  if (!opt.pooling.empty()) return invalid_argument("--pooling: only the encoder families (bert, nomic-bert) take it");
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool moe = arch == "qwen3moe";
  if (moe && (s.n_expert < 1 || s.n_expert_used < 1 || s.expert_ffn_dim < 1))
    return invalid_argument("shape '" + s.name + "' has no experts: the qwen3moe family needs a MoE shape");
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.dim / s.n_heads;
  const int64_t q_dim = s.n_heads * head_dim, kv_dim = s.n_kv_heads * head_dim;
  if (opt.q4_k_m && opt.type != DType::q4_k) return invalid_argument("the Q4_K_M mix needs type q4_k");
  SERVAL_RETURN_IF_ERROR(check_synth(s, opt.type, {s.dim, moe ? s.expert_ffn_dim : s.ffn_dim, q_dim}));
  auto n_vocab_or = vocab_size(vocab);
  if (!n_vocab_or.ok()) return n_vocab_or.status();
  const int64_t n_vocab = *n_vocab_or;

  gguf::GgufWriter w;
  const std::string p = arch + ".";
  add_common_keys(w, s, arch, opt.type, vocab);
  w.add(p + "attention.head_count_kv", (uint32_t)s.n_kv_heads);
  if (head_dim != s.dim / s.n_heads || s.dim % s.n_heads != 0) {
    w.add(p + "attention.key_length", (uint32_t)head_dim);
    w.add(p + "attention.value_length", (uint32_t)head_dim);
  }
  w.add(p + "rope.dimension_count", (uint32_t)head_dim);
  w.add(p + "attention.layer_norm_rms_epsilon", gemma || arch == "qwen3" || moe ? 1e-6f : 1e-5f);
  if (arch == "gemma3") {
    w.add(p + "rope.freq_base", 1000000.0f);
    w.add(p + "rope.freq_base_swa", 10000.0f);
    w.add(p + "attention.sliding_window", (uint32_t)(s.sliding_window > 0 ? s.sliding_window : 512));
  } else if (arch == "gemma2") {
    w.add(p + "rope.freq_base", 10000.0f);
    w.add(p + "attention.sliding_window", (uint32_t)(s.sliding_window > 0 ? s.sliding_window : 4096));
    w.add(p + "attn_logit_softcapping", 50.0f);
    w.add(p + "final_logit_softcapping", 30.0f);
  } else if (arch == "phi3") {
    w.add(p + "rope.freq_base", 10000.0f);
    w.add(p + "attention.sliding_window", (uint32_t)s.sliding_window);  // 0: none (Phi-4)
    w.add(p + "rope.scaling.original_context_length", (uint32_t)s.n_ctx);
  } else {
    w.add(p + "rope.freq_base", arch == "qwen3" || moe || arch == "qwen2" ? 1000000.0f : 10000.0f);
  }
  if (moe) {
    w.add(p + "expert_count", (uint32_t)s.n_expert);
    w.add(p + "expert_used_count", (uint32_t)s.n_expert_used);
    w.add(p + "expert_feed_forward_length", (uint32_t)s.expert_ffn_dim);
  }
  w.add(p + "vocab_size", (uint32_t)n_vocab);

  MatrixWriter mw(w, opt.seed, pool);
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, DType type, int64_t n_mat = 0) {
    mw.matrix(name, rows, cols, type, n_mat);
  };
  auto ones = [&](const std::string& name, int64_t n) {
    w.add_tensor(name, {n}, DType::f32, [=](uint8_t* dst, uint64_t bytes) {
      const float one = 1.0f;
      for (uint64_t i = 0; i < bytes; i += 4) std::memcpy(dst + i, &one, 4);
    });
  };
  auto zeros = [&](const std::string& name, int64_t n) {
    w.add_tensor(name, {n}, DType::f32, [](uint8_t* dst, uint64_t bytes) { std::memset(dst, 0, bytes); });
  };
  const DType type = opt.type, more = opt.q4_k_m ? DType::q6_k : opt.type;
  // llama.cpp's use_more_bits(i, n) (llama-quant.cpp): Q4_K_M's Q6_K layers.
  const int64_t n = s.n_layers;
  auto more_bits = [n](int64_t i) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  matrix("token_embd.weight", n_vocab, s.dim, type);
  ones("output_norm.weight", s.dim);
  if (!gemma) matrix("output.weight", n_vocab, s.dim, more);  // gemma ties the output to the embedding
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const DType tv = more_bits(i) ? more : type;
    ones(b + "attn_norm.weight", s.dim);
    if (arch == "phi3") {
      matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, s.dim, type);
    } else {
      matrix(b + "attn_q.weight", q_dim, s.dim, type);
      matrix(b + "attn_k.weight", kv_dim, s.dim, type);
      matrix(b + "attn_v.weight", kv_dim, s.dim, tv);
    }
    if (arch == "qwen2") {
      zeros(b + "attn_q.bias", q_dim);
      zeros(b + "attn_k.bias", kv_dim);
      zeros(b + "attn_v.bias", kv_dim);
    }
    if (arch == "qwen3" || moe || arch == "gemma3") {
      ones(b + "attn_q_norm.weight", head_dim);
      ones(b + "attn_k_norm.weight", head_dim);
    }
    matrix(b + "attn_output.weight", s.dim, q_dim, type);
    if (gemma) ones(b + "post_attention_norm.weight", s.dim);
    ones(b + "ffn_norm.weight", s.dim);
    if (moe) {
      matrix(b + "ffn_gate_inp.weight", s.n_expert, s.dim, DType::f32);  // the router stays F32
      matrix(b + "ffn_gate_exps.weight", s.expert_ffn_dim, s.dim, type, s.n_expert);
      matrix(b + "ffn_up_exps.weight", s.expert_ffn_dim, s.dim, type, s.n_expert);
      matrix(b + "ffn_down_exps.weight", s.dim, s.expert_ffn_dim, tv, s.n_expert);
    } else if (arch == "phi3") {
      matrix(b + "ffn_up.weight", 2 * s.ffn_dim, s.dim, type);  // gate rows, then up rows
    } else {
      matrix(b + "ffn_gate.weight", s.ffn_dim, s.dim, type);
      matrix(b + "ffn_up.weight", s.ffn_dim, s.dim, type);
    }
    if (!moe) matrix(b + "ffn_down.weight", s.dim, s.ffn_dim, tv);
    if (gemma) ones(b + "post_ffw_norm.weight", s.dim);
  }
  return w.write_file(out_path);
}

Status write_synthetic_lora(const SynthLoraOptions& opt, const gguf::GgufFile& base, const std::string& out_path) {
  if (opt.rank < 1 || opt.rank > 4096) return invalid_argument("LoRA rank must be in [1, 4096]");
  if (opt.type != DType::f32 && opt.type != DType::f16) return invalid_argument("LoRA tensors are written in f32 or f16");
  if (!(opt.alpha >= 0.0f) || !(opt.std_b >= 0.0f)) return invalid_argument("LoRA alpha and std must be >= 0");
  auto arch = base.get_string("general.architecture");
  if (!arch.ok()) return invalid_argument("the base file has no general.architecture");
  gguf::GgufWriter w;
  w.add("general.architecture", *arch);
  w.add("general.type", std::string("adapter"));
  w.add("adapter.type", std::string("lora"));
  w.add("adapter.lora.alpha", opt.alpha);
  w.add("general.name", std::string("serval synthetic LoRA"));
  uint64_t id = 1;
  for (const gguf::TensorInfo& t : base.tensors()) {
    bool want = false;
    for (const std::string& tg : opt.targets) {
      const std::string suffix = "." + tg + ".weight";
      if (tg == "output" ? t.name == "output.weight"
                         : t.name.rfind("blk.", 0) == 0 && t.name.size() > suffix.size() &&
                               t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        want = true;
    }
    if (!want || t.dims.size() != 2) continue;
    const int64_t cols = t.dims[0], rows = t.dims[1], r = opt.rank;
    const DType type = opt.type;
    const uint64_t seed = opt.seed, ida = id++, idb = id++;
    const float std_a = 1.0f / std::sqrt((float)cols), std_b = opt.std_b;
    auto fill = [type, seed](uint64_t tid, int64_t nrows, int64_t ncols, float sd) {
      return [=](uint8_t* dst, uint64_t) {
        std::vector<float> row((size_t)ncols);
        for (int64_t j = 0; j < nrows; ++j) {
          gaussian_row(seed, tid, (uint64_t)j, sd, row.data(), ncols);
          if (type == DType::f32) {
            std::memcpy(dst + (size_t)j * ncols * 4, row.data(), (size_t)ncols * 4);
          } else {
            auto* h = reinterpret_cast<uint16_t*>(dst) + (size_t)j * ncols;
            for (int64_t i = 0; i < ncols; ++i) h[i] = fp32_to_fp16(row[(size_t)i]);
          }
        }
      };
    };
    w.add_tensor(t.name + ".lora_a", {cols, r}, type, fill(ida, r, cols, std_a));
    w.add_tensor(t.name + ".lora_b", {r, rows}, type, fill(idb, rows, r, std_b));
  }
  if (id == 1) return invalid_argument("the base file has none of the target matrices");
  return w.write_file(out_path);
}

}  // namespace serval
