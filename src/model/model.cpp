#include "model/model.h"

#include <cstdlib>

#include "kernels/ref/quants.h"

namespace serval {
namespace {

std::string shape_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

class Loader {
 public:
  explicit Loader(const gguf::GgufFile& f) : f_(f) {}

  // A tensor of exactly `dims` (ggml order). Missing: not_found unless optional.
  Expected<const gguf::TensorInfo*> get(const std::string& name, const std::vector<int64_t>& dims, bool optional) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (optional) return static_cast<const gguf::TensorInfo*>(nullptr);
      return not_found("tensor '" + name + "' is missing");
    }
    // Trailing dims of 1 are equivalent ([n] == [n, 1]).
    std::vector<int64_t> have = t->dims;
    while (have.size() > dims.size() && have.back() == 1) have.pop_back();
    if (have != dims)
      return invalid_file("tensor '" + name + "': expected shape " + shape_str(dims) + ", got " + shape_str(t->dims));
    if (!ref::can_dequantize(t->type))
      return unsupported("tensor '" + name + "': type " + std::string(dtype_name(t->type)) + " is not supported");
    return t;
  }

  Status matrix(const std::string& name, int64_t rows, int64_t cols, Matrix* out, bool optional = false) {
    auto t = get(name, {cols, rows}, optional);
    if (!t.ok()) return t.status();
    if (!*t) return {};
    out->type = (*t)->type;
    out->rows = rows;
    out->cols = cols;
    out->data = f_.tensor_data(**t).data();
    return {};
  }

  Status vec(const std::string& name, int64_t n, std::vector<float>* out, bool optional = false) {
    auto t = get(name, {n}, optional);
    if (!t.ok()) return t.status();
    if (!*t) return {};
    out->resize((size_t)n);
    ref::dequantize_row((*t)->type, f_.tensor_data(**t).data(), out->data(), n);
    return {};
  }

 private:
  const gguf::GgufFile& f_;
};

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) return f.status();
  return from_file(std::move(f.value()));
}

Expected<std::unique_ptr<Model>> Model::from_file(gguf::GgufFile file) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  auto cfg = read_model_config(m->file_);
  if (!cfg.ok()) return cfg.status();
  m->config_ = *cfg;
  SERVAL_RETURN_IF_ERROR(m->load_weights());
  const char* pack = std::getenv("SERVAL_PACK_WEIGHTS");
  if (!(pack && std::string(pack) == "0")) m->pack_weights();
  return m;
}

void Model::pack_weights() {
  // The stored copy leaves the resident set once packed (the reference
  // forward still reads it: it faults back in, from the page cache).
  auto pack = [this](Matrix& m, bool release) {
    if (!m.data || !kernels::PackedMatrix::packable(m.type)) return;
    m.packed =
        std::make_shared<const kernels::PackedMatrix>(kernels::PackedMatrix::pack(m.type, m.data, m.rows, m.cols));
    if (release) file_.release(m.data, row_size(m.type, m.cols) * (size_t)m.rows);
  };
  ModelWeights& w = weights_;
  pack(w.output, !w.tied_output);  // token_embd is read by row (embedding lookup): stays as stored
  for (LayerWeights& l : w.layers)
    for (Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) pack(*m, true);
}

Status Model::load_weights() {
  Loader ld(file_);
  ModelConfig& c = config_;
  const gguf::TensorInfo* emb = file_.find_tensor("token_embd.weight");
  if (!emb) return not_found("tensor 'token_embd.weight' is missing");
  if (emb->dims.size() != 2 || emb->dims[0] != c.dim)
    return invalid_file("tensor 'token_embd.weight': expected shape [" + std::to_string(c.dim) + ", n_vocab], got " +
                        shape_str(emb->dims));
  c.n_vocab = emb->dims[1];
  if (c.n_vocab < 1 || c.n_vocab > (1 << 24))
    return invalid_file("tensor 'token_embd.weight': n_vocab " + std::to_string(c.n_vocab) + " out of range");
  // The tokenizer, when present, must agree with the embedding.
  if (auto toks = file_.get_array("tokenizer.ggml.tokens", gguf::ValueType::string); toks.ok()) {
    if ((int64_t)(*toks)->items.size() != c.n_vocab)
      return invalid_file("metadata key 'tokenizer.ggml.tokens': expected " + std::to_string(c.n_vocab) +
                          " tokens (rows of token_embd.weight), got " + std::to_string((*toks)->items.size()));
  }

  ModelWeights& w = weights_;
  SERVAL_RETURN_IF_ERROR(ld.matrix("token_embd.weight", c.n_vocab, c.dim, &w.token_embd));
  SERVAL_RETURN_IF_ERROR(ld.vec("output_norm.weight", c.dim, &w.output_norm));
  SERVAL_RETURN_IF_ERROR(ld.matrix("output.weight", c.n_vocab, c.dim, &w.output, /*optional=*/true));
  if (!w.output.data) {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  w.layers.resize((size_t)c.n_layers);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[(size_t)i];
    const std::string p = "blk." + std::to_string(i) + ".";
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_norm.weight", c.dim, &l.attn_norm));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_q.weight", c.q_dim(), c.dim, &l.wq));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_k.weight", c.kv_dim(), c.dim, &l.wk));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_v.weight", c.kv_dim(), c.dim, &l.wv));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "attn_output.weight", c.dim, c.q_dim(), &l.wo));
    const bool need_bias = c.arch.qkv_bias;
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_q.bias", c.q_dim(), &l.bq, !need_bias));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_k.bias", c.kv_dim(), &l.bk, !need_bias));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "attn_v.bias", c.kv_dim(), &l.bv, !need_bias));
    SERVAL_RETURN_IF_ERROR(ld.vec(p + "ffn_norm.weight", c.dim, &l.ffn_norm));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim, &l.w_gate));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_up.weight", c.ffn_dim, c.dim, &l.w_up));
    SERVAL_RETURN_IF_ERROR(ld.matrix(p + "ffn_down.weight", c.dim, c.ffn_dim, &l.w_down));
  }
  return {};
}

}  // namespace serval
