#include "model/model_config.h"

namespace serval {

Expected<ArchTraits> arch_traits(const std::string& arch) {
  if (arch == "llama") return ArchTraits{arch, ref::RopeLayout::adjacent, false};
  if (arch == "qwen2") return ArchTraits{arch, ref::RopeLayout::neox, true};
  return unsupported("unsupported architecture '" + arch + "' (supported: llama, qwen2)");
}

namespace {

// Reads an integer key into [lo, hi]; `def` (if >= 0) when the key is absent.
Status read_int(const gguf::GgufFile& f, const std::string& key, int64_t lo, int64_t hi, int64_t def, int64_t* out) {
  auto v = f.get_int(key);
  if (!v.ok()) {
    if (v.status().code() == StatusCode::not_found && def >= 0) {
      *out = def;
      return {};
    }
    return v.status();
  }
  if (*v < lo || *v > hi)
    return invalid_file("metadata key '" + key + "': expected a value in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(*v));
  *out = *v;
  return {};
}

Status read_float(const gguf::GgufFile& f, const std::string& key, double lo, double hi, float* out) {
  auto v = f.get_float(key);
  if (!v.ok()) return v.status().code() == StatusCode::not_found ? Status{} : v.status();
  if (!(*v >= lo && *v <= hi))
    return invalid_file("metadata key '" + key + "': expected a value in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(*v));
  *out = (float)*v;
  return {};
}

}  // namespace

Expected<ModelConfig> read_model_config(const gguf::GgufFile& f) {
  auto arch_name = f.get_string("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  auto traits = arch_traits(*arch_name);
  if (!traits.ok()) return traits.status();
  ModelConfig c;
  c.arch = *traits;
  const std::string p = c.arch.name + ".";
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "embedding_length", 1, 1 << 16, -1, &c.dim));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "block_count", 1, 1024, -1, &c.n_layers));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "attention.head_count", 1, 1024, -1, &c.n_heads));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "attention.head_count_kv", 1, c.n_heads, c.n_heads, &c.n_kv_heads));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "feed_forward_length", 1, 1 << 20, -1, &c.ffn_dim));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "context_length", 1, 1 << 24, 2048, &c.n_ctx_train));
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_file("metadata key '" + p + "attention.head_count_kv': " + std::to_string(c.n_kv_heads) +
                        " does not divide head_count " + std::to_string(c.n_heads));
  const int64_t def_head = c.dim % c.n_heads == 0 ? c.dim / c.n_heads : -1;
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "attention.key_length", 2, 1 << 12, def_head, &c.head_dim));
  int64_t v_len = c.head_dim;
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "attention.value_length", 2, 1 << 12, c.head_dim, &v_len));
  if (v_len != c.head_dim)
    return unsupported("metadata key '" + p + "attention.value_length' = " + std::to_string(v_len) +
                       " differs from key_length " + std::to_string(c.head_dim));
  if (c.head_dim % 2 != 0)
    return invalid_file("head dimension must be even, got " + std::to_string(c.head_dim));
  SERVAL_RETURN_IF_ERROR(read_int(f, p + "rope.dimension_count", 2, c.head_dim, c.head_dim, &c.rope_dim));
  if (c.rope_dim % 2 != 0)
    return invalid_file("metadata key '" + p + "rope.dimension_count': expected an even value, got " +
                        std::to_string(c.rope_dim));
  SERVAL_RETURN_IF_ERROR(read_float(f, p + "attention.layer_norm_rms_epsilon", 0.0, 1.0, &c.rms_eps));
  SERVAL_RETURN_IF_ERROR(read_float(f, p + "rope.freq_base", 1.0, 1e12, &c.rope_freq_base));
  return c;
}

}  // namespace serval
