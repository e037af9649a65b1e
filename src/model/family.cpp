#include "model/family.h"

#include "kernels/ref/quants.h"

namespace serval {

Status load_embeddings(TensorLoader& ld, const ModelConfig& c_in, ModelWeights& w) {
  const gguf::GgufFile& f = ld.file();
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) return not_found("tensor 'token_embd.weight' is missing");
  if (emb->dims.size() != 2 || emb->dims[0] != c_in.dim)
    return invalid_file("tensor 'token_embd.weight': expected shape [" + std::to_string(c_in.dim) +
                        ", n_vocab], got " + shape_str(emb->dims));
  const int64_t n_vocab = emb->dims[1];
  if (n_vocab < 1 || n_vocab > (1 << 24))
    return invalid_file("tensor 'token_embd.weight': n_vocab " + std::to_string(n_vocab) + " out of range");
  SERVAL_RETURN_IF_ERROR(ld.matrix("token_embd.weight", n_vocab, c_in.dim, &w.token_embd));
  SERVAL_RETURN_IF_ERROR(ld.vec("output_norm.weight", c_in.dim, &w.output_norm));
  SERVAL_RETURN_IF_ERROR(ld.matrix("output.weight", n_vocab, c_in.dim, &w.output, /*optional=*/true));
  if (!w.output.data) {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  return {};
}

namespace {

// Rows [r0, r0 + rows) of m as a matrix of their own.
Matrix row_view(const Matrix& m, int64_t r0, int64_t rows) {
  Matrix v = m;
  v.rows = rows;
  v.data = m.data + (size_t)r0 * row_size(m.type, m.cols);
  return v;
}

}  // namespace

Status load_attention(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l) {
  const std::string p = "blk." + std::to_string(il) + ".";
  const BlockRecipe& b = c.block;
  SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_norm.weight", c.dim, &l.attn_norm));
  if (ld.has(p + "attn_qkv.weight")) {
    // Fused QKV (phi3): Q rows, then K rows, then V rows.
    Matrix qkv;
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_qkv.weight", c.q_dim() + 2 * c.kv_dim(), c.dim, &qkv));
    l.wq = row_view(qkv, 0, c.q_dim());
    l.wk = row_view(qkv, c.q_dim(), c.kv_dim());
    l.wv = row_view(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
  } else {
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_q.weight", c.q_dim(), c.dim, &l.wq));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_k.weight", c.kv_dim(), c.dim, &l.wk));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_v.weight", c.kv_dim(), c.dim, &l.wv));
  }
  SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_output.weight", c.dim, c.q_dim(), &l.wo));
  // Biases: required by a recipe that has them; a file that carries them for a
  // family without gets the unused-tensor error (they would change the math).
  if (b.qkv_bias) {
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_q.bias", c.q_dim(), &l.bq));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_k.bias", c.kv_dim(), &l.bk));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_v.bias", c.kv_dim(), &l.bv));
  }
  if (b.qk_norm) {
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_q_norm.weight", c.head_dim, &l.q_norm));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_k_norm.weight", c.head_dim, &l.k_norm));
  }
  if (b.post_attn_norm) SERVAL_RETURN_IF_ERROR(ld.vec(p + "post_attention_norm.weight", c.dim, &l.post_attn_norm));
  if (b.attn_out_bias) SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_output.bias", c.dim, &l.bo));
  if (b.attn_sinks) SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_sinks.weight", c.n_heads, &l.sinks));
  return {};
}

Status read_moe_hparams(const HparamReader& r, ModelConfig& c) {
  SERVAL_RETURN_IF_ERROR(r.get_int("expert_count", 1, kMaxExperts, -1, &c.n_expert));
  SERVAL_RETURN_IF_ERROR(r.get_int("expert_used_count", 1, c.n_expert, -1, &c.n_expert_used));
  SERVAL_RETURN_IF_ERROR(r.get_int("expert_feed_forward_length", 1, 1 << 20, c.ffn_dim, &c.expert_ffn_dim));
  c.block.moe = true;
  return {};
}

Status load_moe_ffn(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l, const std::string& norm_name) {
  const std::string p = "blk." + std::to_string(il) + ".";
  const int64_t ne = c.n_expert, ff = c.expert_ffn_dim;
  SERVAL_RETURN_IF_ERROR(ld.vec(p + norm_name + ".weight", c.dim, &l.ffn_norm));
  SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_gate_inp.weight", ne, c.dim, &l.router));
  SERVAL_RETURN_IF_ERROR(ld.matrices(p + "ffn_gate_exps.weight", ne, ff, c.dim, &l.exp_gate));
  SERVAL_RETURN_IF_ERROR(ld.matrices(p + "ffn_up_exps.weight", ne, ff, c.dim, &l.exp_up));
  SERVAL_RETURN_IF_ERROR(ld.matrices(p + "ffn_down_exps.weight", ne, c.dim, ff, &l.exp_down));
  if (c.block.moe_biases) {
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "ffn_gate_inp.bias", ne, &l.router_bias));
    SERVAL_RETURN_IF_ERROR(ld.vecs(p + "ffn_gate_exps.bias", ne, ff, &l.exp_gate_b));
    SERVAL_RETURN_IF_ERROR(ld.vecs(p + "ffn_up_exps.bias", ne, ff, &l.exp_up_b));
    SERVAL_RETURN_IF_ERROR(ld.vecs(p + "ffn_down_exps.bias", ne, c.dim, &l.exp_down_b));
  }
  if (c.block.post_ffn_norm) SERVAL_RETURN_IF_ERROR(ld.vec(p + "post_ffw_norm.weight", c.dim, &l.post_ffn_norm));
  return {};
}

Status load_ffn(TensorLoader& ld, const ModelConfig& c, int64_t il, LayerWeights& l, bool fused_up_gate) {
  const std::string p = "blk." + std::to_string(il) + ".";
  SERVAL_RETURN_IF_ERROR(ld.vec(p + "ffn_norm.weight", c.dim, &l.ffn_norm));
  if (fused_up_gate && !ld.has(p + "ffn_gate.weight")) {
    // One ffn_up of 2 * ffn rows: the gate's rows, then the up projection's.
    Matrix up;
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_up.weight", 2 * c.ffn_dim, c.dim, &up));
    l.w_gate = row_view(up, 0, c.ffn_dim);
    l.w_up = row_view(up, c.ffn_dim, c.ffn_dim);
  } else {
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim, &l.w_gate));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_up.weight", c.ffn_dim, c.dim, &l.w_up));
  }
  SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_down.weight", c.dim, c.ffn_dim, &l.w_down));
  if (c.block.post_ffn_norm) SERVAL_RETURN_IF_ERROR(ld.vec(p + "post_ffw_norm.weight", c.dim, &l.post_ffn_norm));
  return {};
}

Status load_standard(TensorLoader& ld, const ModelConfig& c, ModelWeights& w, bool fused_up_gate) {
  // Mixture-of-experts layers are a family feature of their own (not here yet):
  // refuse them by name rather than with a missing ffn_gate.
  if (auto n = ld.file().get_int(c.arch + ".expert_count"); !c.block.moe && n.ok() && *n > 0)
    return unsupported("metadata key '" + c.arch + ".expert_count' = " + std::to_string(*n) +
                       ": mixture-of-experts '" + c.arch + "' models are not supported yet");
  SERVAL_RETURN_IF_ERROR(load_embeddings(ld, c, w));
  w.layers.resize((size_t)c.n_layers);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    SERVAL_RETURN_IF_ERROR(load_attention(ld, c, il, w.layers[(size_t)il]));
    if (c.block.moe) SERVAL_RETURN_IF_ERROR(load_moe_ffn(ld, c, il, w.layers[(size_t)il]));
    else SERVAL_RETURN_IF_ERROR(load_ffn(ld, c, il, w.layers[(size_t)il], fused_up_gate));
  }
  return {};
}

Status read_encoder_hparams(const HparamReader& r, ModelConfig& c) {
  c.encoder = true;
  SERVAL_RETURN_IF_ERROR(r.get_float("attention.layer_norm_epsilon", 0.0, 1.0, &c.norm_eps));
  bool causal = false;
  SERVAL_RETURN_IF_ERROR(r.get_bool("attention.causal", &causal));
  if (causal)
    return unsupported("metadata key '" + r.prefix() + "attention.causal' = true: causal '" + c.arch +
                       "' models are not supported (encoders attend to the whole input)");
  if (!r.file().get_int(r.prefix() + "pooling_type").ok()) c.pooling = Pooling::mean;
  if (c.pooling == Pooling::none) {
    c.pooling = Pooling::mean;
    c.warnings.push_back("metadata key '" + r.prefix() +
                         "pooling_type' = none (one embedding per token): serving mean-pooled embeddings");
  }
  return {};
}

Status load_encoder(TensorLoader& ld, const ModelConfig& c, ModelWeights& w) {
  const gguf::GgufFile& f = ld.file();
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) return not_found("tensor 'token_embd.weight' is missing");
  if (emb->dims.size() != 2 || emb->dims[0] != dim || emb->dims[1] < 1 || emb->dims[1] > (1 << 24))
    return invalid_file("tensor 'token_embd.weight': expected shape [" + std::to_string(dim) + ", n_vocab], got " +
                        shape_str(emb->dims));
  SERVAL_RETURN_IF_ERROR(ld.matrix("token_embd.weight", emb->dims[1], dim, &w.token_embd));
  // Token types: every token is type 0 ("sentence A"), as llama.cpp runs them.
  const gguf::TensorInfo* types = f.find_tensor("token_types.weight");
  if (!types) return not_found("tensor 'token_types.weight' is missing");
  if (types->dims.size() != 2 || types->dims[0] != dim || types->dims[1] < 1 || types->dims[1] > 1024)
    return invalid_file("tensor 'token_types.weight': expected shape [" + std::to_string(dim) +
                        ", n_token_types], got " + shape_str(types->dims));
  Matrix tt;
  SERVAL_RETURN_IF_ERROR(ld.matrix("token_types.weight", types->dims[1], dim, &tt));
  w.token_type0.resize((size_t)dim);
  ref::dequantize_row(tt.type, tt.data, w.token_type0.data(), dim);
  if (c.enc.abs_pos) SERVAL_RETURN_IF_ERROR(ld.matrix("position_embd.weight", c.n_ctx_train, dim, &w.pos_embd));
  SERVAL_RETURN_IF_ERROR(ld.vec("token_embd_norm.weight", dim, &w.embd_norm));
  SERVAL_RETURN_IF_ERROR(ld.vec("token_embd_norm.bias", dim, &w.embd_norm_b));
  const bool bert = c.enc.abs_pos;  // bert's projections all carry biases; nomic-bert's need not
  w.layers.resize((size_t)c.n_layers);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    LayerWeights& l = w.layers[(size_t)il];
    const std::string p = "blk." + std::to_string(il) + ".";
    if (ld.has(p + "attn_qkv.weight")) {
      Matrix qkv;
      SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_qkv.weight", q_dim + 2 * kv_dim, dim, &qkv));
      l.wq = row_view(qkv, 0, q_dim);
      l.wk = row_view(qkv, q_dim, kv_dim);
      l.wv = row_view(qkv, q_dim + kv_dim, kv_dim);
      std::vector<float> b;
      SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_qkv.bias", q_dim + 2 * kv_dim, &b, /*optional=*/true));
      if (!b.empty()) {
        l.bq.assign(b.begin(), b.begin() + q_dim);
        l.bk.assign(b.begin() + q_dim, b.begin() + q_dim + kv_dim);
        l.bv.assign(b.begin() + q_dim + kv_dim, b.end());
      }
    } else {
      SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_q.weight", q_dim, dim, &l.wq));
      SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_k.weight", kv_dim, dim, &l.wk));
      SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_v.weight", kv_dim, dim, &l.wv));
      SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_q.bias", q_dim, &l.bq, !bert));
      SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_k.bias", kv_dim, &l.bk, !bert));
      SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_v.bias", kv_dim, &l.bv, !bert));
    }
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_output.weight", dim, q_dim, &l.wo));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_output.bias", dim, &l.bo, !bert));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_output_norm.weight", dim, &l.attn_out_norm));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_output_norm.bias", dim, &l.attn_out_norm_b));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_up.weight", c.ffn_dim, dim, &l.w_up));
    if (c.enc.gated) SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_gate.weight", c.ffn_dim, dim, &l.w_gate));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_down.weight", dim, c.ffn_dim, &l.w_down));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "ffn_up.bias", c.ffn_dim, &l.b_up, !bert));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "ffn_down.bias", dim, &l.b_down, !bert));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "layer_output_norm.weight", dim, &l.layer_out_norm));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "layer_output_norm.bias", dim, &l.layer_out_norm_b));
  }
  // Classification head (rerankers): cls, then cls.output when present.
  SERVAL_RETURN_IF_ERROR(ld.matrix("cls.weight", dim, dim, &w.cls, /*optional=*/true));
  if (w.cls.data) {
    SERVAL_RETURN_IF_ERROR(ld.vec("cls.bias", dim, &w.cls_b, /*optional=*/true));  // optional, as in llama.cpp
    if (const gguf::TensorInfo* co = f.find_tensor("cls.output.weight")) {
      const int64_t n_out = co->dims.size() == 2 ? co->dims[1] : 1;
      if (n_out < 1 || n_out > dim)
        return invalid_file("tensor 'cls.output.weight': expected shape [" + std::to_string(dim) + ", n], got " +
                            shape_str(co->dims));
      SERVAL_RETURN_IF_ERROR(ld.matrix("cls.output.weight", n_out, dim, &w.cls_out));
      SERVAL_RETURN_IF_ERROR(ld.vec("cls.output.bias", n_out, &w.cls_out_b, /*optional=*/true));
    }
  }
  if (c.pooling == Pooling::rank && !w.cls.data)
    return invalid_file("metadata key '" + c.arch + ".pooling_type' = rank, but tensor 'cls.weight' (the " +
                        "classification head) is missing");
  return {};
}

void set_swa_period(ModelConfig& c, int64_t period) {
  c.layer_swa.assign((size_t)c.n_layers, 0);
  for (int64_t il = 0; il < c.n_layers; ++il) c.layer_swa[(size_t)il] = (il + 1) % period != 0;
}

void set_swa_all(ModelConfig& c) { c.layer_swa.assign((size_t)c.n_layers, 1); }

}  // namespace serval
