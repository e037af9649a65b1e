#include "model/model_config.h"

#include "model/family.h"

namespace serval {

Status HparamReader::get_int(const std::string& key, int64_t lo, int64_t hi, int64_t def, int64_t* out) const {
  read_.insert(key);
  const std::string k = prefix_ + key;
  auto v = f_.get_int(k);
  if (!v.ok()) {
    if (v.status().code() == StatusCode::not_found && def >= 0) {
      *out = def;
      return {};
    }
    return v.status();
  }
  if (*v < lo || *v > hi)
    return invalid_file("metadata key '" + k + "': expected a value in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(*v));
  *out = *v;
  return {};
}

Status HparamReader::get_float(const std::string& key, double lo, double hi, float* out) const {
  read_.insert(key);
  const std::string k = prefix_ + key;
  auto v = f_.get_float(k);
  if (!v.ok()) return v.status().code() == StatusCode::not_found ? Status{} : v.status();
  if (!(*v >= lo && *v <= hi))
    return invalid_file("metadata key '" + k + "': expected a value in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(*v));
  *out = (float)*v;
  return {};
}

Status HparamReader::get_bool(const std::string& key, bool* out) const {
  read_.insert(key);
  auto v = f_.get_bool(prefix_ + key);
  if (!v.ok()) return v.status().code() == StatusCode::not_found ? Status{} : v.status();
  *out = *v;
  return {};
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::none: return "none";
    case Pooling::mean: return "mean";
    case Pooling::cls: return "cls";
    case Pooling::last: return "last";
    case Pooling::rank: return "rank";
  }
  return "none";
}

Status HparamReader::get_string(const std::string& key, std::string* out) const {
  read_.insert(key);
  auto v = f_.get_string(prefix_ + key);
  if (!v.ok()) return v.status().code() == StatusCode::not_found ? Status{} : v.status();
  *out = *v;
  return {};
}

bool HparamReader::has(const std::string& key) const {
  return f_.get_int(prefix_ + key).ok() || f_.get_float(prefix_ + key).ok() || f_.get_string(prefix_ + key).ok();
}

Status read_common_hparams(const HparamReader& r, ModelConfig& c) {
  const std::string& p = r.prefix();
  SERVAL_RETURN_IF_ERROR(r.get_int("embedding_length", 1, 1 << 16, -1, &c.dim));
  SERVAL_RETURN_IF_ERROR(r.get_int("block_count", 1, 1024, -1, &c.n_layers));
  SERVAL_RETURN_IF_ERROR(r.get_int("attention.head_count", 1, 1024, -1, &c.n_heads));
  SERVAL_RETURN_IF_ERROR(r.get_int("attention.head_count_kv", 1, c.n_heads, c.n_heads, &c.n_kv_heads));
  SERVAL_RETURN_IF_ERROR(r.get_int("feed_forward_length", 1, 1 << 20, -1, &c.ffn_dim));
  SERVAL_RETURN_IF_ERROR(r.get_int("context_length", 1, 1 << 24, 2048, &c.n_ctx_train));
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_file("metadata key '" + p + "attention.head_count_kv': " + std::to_string(c.n_kv_heads) +
                        " does not divide head_count " + std::to_string(c.n_heads));
  const int64_t def_head = c.dim % c.n_heads == 0 ? c.dim / c.n_heads : -1;
  SERVAL_RETURN_IF_ERROR(r.get_int("attention.key_length", 2, 1 << 12, def_head, &c.head_dim));
  int64_t v_len = c.head_dim;
  SERVAL_RETURN_IF_ERROR(r.get_int("attention.value_length", 2, 1 << 12, c.head_dim, &v_len));
  if (v_len != c.head_dim)
    return unsupported("metadata key '" + p + "attention.value_length' = " + std::to_string(v_len) +
                       " differs from key_length " + std::to_string(c.head_dim));
  if (c.head_dim % 2 != 0)
    return invalid_file("head dimension must be even, got " + std::to_string(c.head_dim));
  SERVAL_RETURN_IF_ERROR(r.get_int("rope.dimension_count", 2, c.head_dim, c.head_dim, &c.rope_dim));
  if (c.rope_dim % 2 != 0)
    return invalid_file("metadata key '" + p + "rope.dimension_count': expected an even value, got " +
                        std::to_string(c.rope_dim));
  SERVAL_RETURN_IF_ERROR(r.get_float("attention.layer_norm_rms_epsilon", 0.0, 1.0, &c.rms_eps));

  // RoPE and its scaling (llama.cpp's llama_hparams): rope.freq_base,
  // rope.scaling.{type,factor,original_context_length,attn_factor} and the
  // YaRN keys; the older rope.scale_linear key stands for a linear factor.
  ref::RopeSpec& rs = c.rope;
  rs.rope_dim = c.rope_dim;
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.freq_base", 1.0, 1e12, &rs.freq_base));
  std::string scaling = "linear";
  SERVAL_RETURN_IF_ERROR(r.get_string("rope.scaling.type", &scaling));
  if (scaling != "none" && scaling != "linear" && scaling != "yarn" && scaling != "longrope")
    return unsupported("metadata key '" + p + "rope.scaling.type' = '" + scaling +
                       "' is not supported (supported: none, linear, yarn, longrope)");
  float factor = 0.0f;
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.factor", 0.0, 1e6, &factor));
  if (factor == 0.0f) SERVAL_RETURN_IF_ERROR(r.get_float("rope.scale_linear", 0.0, 1e6, &factor));
  rs.freq_scale = (factor == 0.0f || scaling == "none") ? 1.0f : 1.0f / factor;
  int64_t n_ctx_orig = c.n_ctx_train;
  SERVAL_RETURN_IF_ERROR(r.get_int("rope.scaling.original_context_length", 1, 1 << 24, c.n_ctx_train, &n_ctx_orig));
  rs.n_ctx_orig = n_ctx_orig;
  rs.ext_factor = scaling == "yarn" ? 1.0f : 0.0f;
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.yarn_ext_factor", -1.0, 1e3, &rs.ext_factor));
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.yarn_attn_factor", 0.0, 1e3, &rs.attn_factor));
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.yarn_beta_fast", 0.0, 1e4, &rs.beta_fast));
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.yarn_beta_slow", 0.0, 1e4, &rs.beta_slow));
  float attn_factor = 1.0f;
  SERVAL_RETURN_IF_ERROR(r.get_float("rope.scaling.attn_factor", 0.0, 1e3, &attn_factor));
  rs.attn_factor *= attn_factor;
  c.rope_swa = rs;  // sliding-window layers use the same RoPE unless the family says otherwise

  // Pooling (embedding models): llama.cpp's numbering; -1 (unspecified) reads as none.
  int64_t pooling = (int64_t)c.pooling;
  if (auto pv = r.file().get_int(p + "pooling_type"); pv.ok() && *pv == -1) pooling = 0;
  else SERVAL_RETURN_IF_ERROR(r.get_int("pooling_type", 0, 4, pooling, &pooling));
  c.pooling = (Pooling)pooling;

  // Sliding window: a family that has one sets layer_swa from its pattern.
  int64_t window = 0;
  SERVAL_RETURN_IF_ERROR(r.get_int("attention.sliding_window", 0, 1 << 24, 0, &window));
  c.sliding_window = (int32_t)window;
  return {};
}

Expected<ModelConfig> read_model_config(const gguf::GgufFile& f) {
  auto arch_name = f.get_string("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  const Family* fam = find_family(*arch_name);
  if (!fam) {
    std::string names;
    for (const Family* x : families()) names += (names.empty() ? "" : ", ") + std::string(x->name);
    return unsupported("unsupported architecture '" + *arch_name + "' (supported: " + names + ")");
  }
  ModelConfig c;
  c.family = fam;
  c.arch = *arch_name;
  HparamReader r(f, c.arch);
  SERVAL_RETURN_IF_ERROR(read_common_hparams(r, c));
  SERVAL_RETURN_IF_ERROR(fam->read_config(r, c));
  // Keys that change the math in the llama.cpp families that use them: a
  // family that does not read one refuses a file that sets it (to a value
  // other than the neutral one) rather than run different math silently.
  struct MathKey {
    const char* key;
    double neutral;
  };
  static const MathKey kMathKeys[] = {
      {"logit_scale", 1.0},           {"embedding_scale", 1.0},         {"residual_scale", 1.0},
      {"attention.scale", 0.0},       {"attention.clamp_kqv", 0.0},     {"attn_logit_softcapping", 0.0},
      {"final_logit_softcapping", 0.0}, {"rope.scaling.yarn_log_multiplier", 0.0},
      {"attention.temperature_length", 0.0}, {"attention.causal", 1.0},
  };
  for (const MathKey& mk : kMathKeys) {
    if (r.was_read(mk.key)) continue;
    const std::string k = r.prefix() + mk.key;
    double v = mk.neutral;
    if (auto fv = f.get_float(k); fv.ok()) v = *fv;
    else if (auto bv = f.get_bool(k); bv.ok()) v = *bv ? 1.0 : 0.0;
    else continue;
    if (v != mk.neutral)
      return unsupported("metadata key '" + k + "' = " + std::to_string(v) + " is not applied by the '" + c.arch +
                         "' family: refusing to run a model whose math would differ from the file's");
  }
  if (c.pooling == Pooling::rank && !c.encoder)
    return unsupported("metadata key '" + r.prefix() + "pooling_type' = rank: rerankers of the '" + c.arch +
                       "' family are not supported (only bert-family rerankers with a classification head)");
  // A window the family does not use: llama.cpp ignores it too (Mistral 7B v0.1).
  if (c.sliding_window > 0 && !c.has_swa())
    c.warnings.push_back("metadata key '" + r.prefix() + "attention.sliding_window' = " +
                         std::to_string(c.sliding_window) + " is not used by the '" + c.arch +
                         "' family (llama.cpp ignores it as well): every layer attends to the whole context");
  if (!c.layer_swa.empty() && (int64_t)c.layer_swa.size() != c.n_layers)
    return invalid_file("sliding-window layer pattern has " + std::to_string(c.layer_swa.size()) + " entries for " +
                        std::to_string(c.n_layers) + " layers");
  if (c.has_swa() && c.sliding_window < 1)
    return invalid_file("metadata key '" + r.prefix() + "attention.sliding_window': expected >= 1 for a model with " +
                        "sliding-window layers, got " + std::to_string(c.sliding_window));
  return c;
}

}  // namespace serval
