#include "model/embed_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/activation.h"
#include "kernels/matmul.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/quants.h"
#include "kv_cache/kv_storage.h"
#include "model/batch_forward.h"

namespace serval {

namespace {

// Below this many multiply-adds a call runs on the calling thread alone (as
// BatchForward does): hand-offs would cost more than the second core gives.
constexpr int64_t kMinParallelMacs = int64_t(1) << 26;

}  // namespace

EmbedForward::EmbedForward(const Model& model, ThreadPool* pool, Pooling pooling, KvType scratch_kv)
    : model_(model), pool_(pool), pooling_(pooling == Pooling::none ? model.config().pooling : pooling),
      scratch_kv_(scratch_kv) {}

int64_t EmbedForward::out_dim() const { return pooling_ == Pooling::rank ? 1 : model_.config().dim; }

Status EmbedForward::embed(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out) {
  const ModelConfig& c = model_.config();
  if (pooling_ == Pooling::none)
    return invalid_argument("the model has no pooling type: it does not produce embeddings");
  if (pooling_ == Pooling::rank && !model_.weights().cls.data)
    return invalid_argument("rank pooling needs the model's classification head (cls.weight)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) return invalid_argument("input " + std::to_string(i) + " is empty");
    if (c.encoder && c.enc.abs_pos && (int64_t)inputs[i].size() > c.n_ctx_train)
      return invalid_argument("input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                              " tokens, more than the model's " + std::to_string(c.n_ctx_train) + " positions");
    for (TokenId t : inputs[i])
      if (t < 0 || t >= c.n_vocab)
        return invalid_argument("token id " + std::to_string(t) + " is out of range [0, " +
                                std::to_string(c.n_vocab) + ")");
  }
  out->clear();
  if (inputs.empty()) return {};
  return c.encoder ? encode(inputs, out) : decode(inputs, out);
}

void EmbedForward::pool_rows(std::span<const std::vector<TokenId>> inputs, const float* x, std::vector<float>* out) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const int64_t dim = c.dim;
  const int64_t n_in = (int64_t)inputs.size();
  std::vector<float> first((size_t)(n_in * dim));  // rank: each input's first row
  out->assign((size_t)(n_in * out_dim()), 0.0f);
  int64_t at = 0;
  for (int64_t s = 0; s < n_in; ++s) {
    const int64_t len = (int64_t)inputs[(size_t)s].size();
    const float* rows = x + at * dim;
    float* o = out->data() + s * out_dim();
    switch (pooling_) {
      case Pooling::mean: {
        std::vector<double> acc((size_t)dim, 0.0);
        for (int64_t t = 0; t < len; ++t)
          for (int64_t d = 0; d < dim; ++d) acc[(size_t)d] += rows[t * dim + d];
        for (int64_t d = 0; d < dim; ++d) o[d] = (float)(acc[(size_t)d] / (double)len);
        break;
      }
      case Pooling::cls: std::memcpy(o, rows, (size_t)dim * sizeof(float)); break;
      case Pooling::last: std::memcpy(o, rows + (len - 1) * dim, (size_t)dim * sizeof(float)); break;
      case Pooling::rank: std::memcpy(first.data() + s * dim, rows, (size_t)dim * sizeof(float)); break;
      case Pooling::none: break;
    }
    at += len;
  }
  if (pooling_ != Pooling::rank) return;
  // The classification head over the [CLS] rows: tanh(cls x + b), then cls.output.
  auto mm = [&](const Matrix& m, const float* in, int64_t n, float* y) {
    if (m.packed) kernels::matmul(*m.packed, in, n, y, nullptr);
    else kernels::matmul(m.type, m.data, m.rows, m.cols, in, n, y, nullptr);
  };
  std::vector<float> h((size_t)(n_in * dim));
  mm(w.cls, first.data(), n_in, h.data());
  for (int64_t s = 0; s < n_in; ++s)
    for (int64_t d = 0; d < dim; ++d)
      h[(size_t)(s * dim + d)] = std::tanh(h[(size_t)(s * dim + d)] + (w.cls_b.empty() ? 0.0f : w.cls_b[(size_t)d]));
  if (!w.cls_out.data) {
    for (int64_t s = 0; s < n_in; ++s) (*out)[(size_t)s] = h[(size_t)(s * dim)];
    return;
  }
  const int64_t n_cls = w.cls_out.rows;
  std::vector<float> y((size_t)(n_in * n_cls));
  mm(w.cls_out, h.data(), n_in, y.data());
  for (int64_t s = 0; s < n_in; ++s)
    (*out)[(size_t)s] = y[(size_t)(s * n_cls)] + (w.cls_out_b.empty() ? 0.0f : w.cls_out_b[0]);
}

Status EmbedForward::encode(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hd = c.head_dim, ffn = c.ffn_dim;
  const int64_t group = c.n_heads / c.n_kv_heads;
  int64_t n = 0, max_len = 0, attn_macs = 0;
  std::vector<int64_t> start, pos;  // each input's first token; each token's position in its input
  for (const auto& in : inputs) {
    start.push_back(n);
    for (size_t p = 0; p < in.size(); ++p) pos.push_back((int64_t)p);
    n += (int64_t)in.size();
    max_len = std::max<int64_t>(max_len, (int64_t)in.size());
    attn_macs += (int64_t)in.size() * (int64_t)in.size() * 2 * q_dim;
  }
  const int64_t layer_macs = dim * (2 * q_dim + 2 * kv_dim + (c.enc.gated ? 3 : 2) * ffn);
  ThreadPool* const pool = c.n_layers * (n * layer_macs + attn_macs) >= kMinParallelMacs ? pool_ : nullptr;
  auto grow = [n](std::vector<float>& v, int64_t width) {
    if ((int64_t)v.size() < n * width) v.resize((size_t)(n * width));
  };
  grow(x_, dim);
  grow(q_, q_dim);
  grow(k_, kv_dim);
  grow(v_, kv_dim);
  grow(attn_, q_dim);
  grow(proj_, dim);
  grow(up_, ffn);
  if (c.enc.gated) grow(gate_, ffn);
  auto mm = [&](const Matrix& m, const float* in, float* y) {
    if (m.packed) kernels::matmul(*m.packed, in, n, y, pool);
    else kernels::matmul(m.type, m.data, m.rows, m.cols, in, n, y, pool);
  };
  // fn(i) for every token i, over the pool (element-wise work: the order
  // within a token never depends on the split).
  auto rows = [&](const std::function<void(int64_t)>& fn) {
    auto range = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(i);
    };
    if (pool) pool->parallel_for(n, range, 8);
    else range(0, n);
  };

  // x = LayerNorm(x + proj (+ bias), weight, norm bias), per token over the pool.
  auto residual_norm = [&](const std::vector<float>& bias, const std::vector<float>& nw, const std::vector<float>& nb) {
    rows([&](int64_t i) {
      float* xi = x_.data() + i * dim;
      const float* pi = proj_.data() + i * dim;
      if (bias.empty())
        for (int64_t d = 0; d < dim; ++d) xi[d] += pi[d];
      else
        for (int64_t d = 0; d < dim; ++d) xi[d] += pi[d] + bias[(size_t)d];
      ref::layernorm(xi, xi, nw.data(), nb.data(), dim, c.norm_eps);
    });
  };

  // Embeddings: token + type 0 (+ position), then LayerNorm.
  std::vector<TokenId> tokens;
  for (const auto& in : inputs) tokens.insert(tokens.end(), in.begin(), in.end());
  const size_t emb_stride = row_size(w.token_embd.type, dim);
  rows([&](int64_t i) {
    thread_local std::vector<float> pos_row;
    float* xi = x_.data() + i * dim;
    ref::dequantize_row(w.token_embd.type, w.token_embd.data + (size_t)tokens[(size_t)i] * emb_stride, xi, dim);
    for (int64_t d = 0; d < dim; ++d) xi[d] += w.token_type0[(size_t)d];
    if (c.enc.abs_pos) {
      pos_row.resize((size_t)dim);
      ref::dequantize_row(w.pos_embd.type, w.pos_embd.data + (size_t)pos[(size_t)i] * row_size(w.pos_embd.type, dim),
                          pos_row.data(), dim);
      for (int64_t d = 0; d < dim; ++d) xi[d] += pos_row[(size_t)d];
    }
    ref::layernorm(xi, xi, w.embd_norm.data(), w.embd_norm_b.data(), dim, c.norm_eps);
  });
  // RoPE angles by position (nomic-bert).
  std::vector<float> cs;
  if (c.enc.rope) {
    cs.resize((size_t)(max_len * c.rope_dim));
    for (int64_t p = 0; p < max_len; ++p) ref::rope_cos_sin(c.rope, p, cs.data() + p * c.rope_dim);
  }
  const float scale = 1.0f / std::sqrt((float)hd);
  const int64_t n_tasks = (int64_t)inputs.size() * c.n_heads;

  for (int64_t il = 0; il < c.n_layers; ++il) {
    const LayerWeights& l = w.layers[(size_t)il];
    mm(l.wq, x_.data(), q_.data());
    mm(l.wk, x_.data(), k_.data());
    mm(l.wv, x_.data(), v_.data());
    rows([&](int64_t i) {
      float* q = q_.data() + i * q_dim;
      float* k = k_.data() + i * kv_dim;
      float* v = v_.data() + i * kv_dim;
      for (size_t j = 0; j < l.bq.size(); ++j) q[j] += l.bq[j];
      for (size_t j = 0; j < l.bk.size(); ++j) k[j] += l.bk[j];
      for (size_t j = 0; j < l.bv.size(); ++j) v[j] += l.bv[j];
      if (c.enc.rope) {
        const float* cs_i = cs.data() + pos[(size_t)i] * c.rope_dim;
        ref::rope_apply(q, c.n_heads, hd, c.rope, cs_i);
        ref::rope_apply(k, c.n_kv_heads, hd, c.rope, cs_i);
      }
    });
    // Attention over the whole input, one task per (input, head).
    auto attend = [&](int64_t b, int64_t e) {
      std::vector<float> sc((size_t)max_len);
      for (int64_t t = b; t < e; ++t) {
        const size_t s = (size_t)(t / c.n_heads);
        const int64_t h = t % c.n_heads, kvh = h / group, len = (int64_t)inputs[s].size(), i0 = start[s];
        for (int64_t i = 0; i < len; ++i) {
          const float* qi = q_.data() + (i0 + i) * q_dim + h * hd;
          for (int64_t j = 0; j < len; ++j)
            sc[(size_t)j] = kernels::dot_f32(qi, k_.data() + (i0 + j) * kv_dim + kvh * hd, hd) * scale;
          ref::softmax(sc.data(), len);
          float* o = attn_.data() + (i0 + i) * q_dim + h * hd;
          std::fill(o, o + hd, 0.0f);
          for (int64_t j = 0; j < len; ++j) {
            const float* vj = v_.data() + (i0 + j) * kv_dim + kvh * hd;
            const float pj = sc[(size_t)j];
            for (int64_t d = 0; d < hd; ++d) o[d] += pj * vj[d];
          }
        }
      }
    };
    if (pool) pool->parallel_for(n_tasks, attend, 1);
    else attend(0, n_tasks);
    mm(l.wo, attn_.data(), proj_.data());
    residual_norm(l.bo, l.attn_out_norm, l.attn_out_norm_b);
    mm(l.w_up, x_.data(), up_.data());
    if (c.enc.gated) mm(l.w_gate, x_.data(), gate_.data());
    rows([&](int64_t i) {
      float* ui = up_.data() + i * ffn;
      if (!l.b_up.empty())
        for (int64_t f = 0; f < ffn; ++f) ui[f] += l.b_up[(size_t)f];
      if (c.enc.gated) kernels::silu_mul(ui, gate_.data() + i * ffn, ui, ffn);
      else kernels::gelu(ui, ffn);
    });
    mm(l.w_down, up_.data(), proj_.data());
    residual_norm(l.b_down, l.layer_out_norm, l.layer_out_norm_b);
  }
  pool_rows(inputs, x_.data(), out);
  return {};
}

Status EmbedForward::decode(std::span<const std::vector<TokenId>> inputs, std::vector<float>* out) {
  const ModelConfig& c = model_.config();
  constexpr int32_t kBlock = 16;
  // A scratch KV pool holding exactly this call's inputs, freed on return.
  int64_t n_blocks = 0;
  for (const auto& in : inputs) n_blocks += ((int64_t)in.size() + kBlock - 1) / kBlock;
  if (n_blocks > (1 << 30)) return invalid_argument("embedding batch is too large");
  auto storage = KvStorage::create(KvGeometry{(int32_t)c.n_layers, (int32_t)c.kv_dim(), kBlock, scratch_kv_},
                                   (int32_t)n_blocks);
  if (!storage.ok()) return storage.status();
  std::vector<std::vector<BlockId>> tables(inputs.size());
  Batch batch;
  BlockId next = 0;
  for (size_t s = 0; s < inputs.size(); ++s) {
    const int64_t len = (int64_t)inputs[s].size();
    for (int64_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) tables[s].push_back(next++);
    batch.tokens.insert(batch.tokens.end(), inputs[s].begin(), inputs[s].end());
    batch.seqs.emplace_back(0, (int32_t)len, tables[s], /*logits=*/false, 1, /*hidden=*/true);
  }
  BatchForward fwd(model_, *storage, pool_);
  std::vector<float> logits, hidden;
  SERVAL_RETURN_IF_ERROR(fwd.forward(batch, &logits, &hidden));
  pool_rows(inputs, hidden.data(), out);
  return {};
}

}  // namespace serval
