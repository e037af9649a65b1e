#include "model/reference_forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/ref/ops.h"
#include "kernels/ref/quants.h"
#include "model/blocks.h"

namespace serval {

ReferenceForward::ReferenceForward(const Model& model, int64_t n_ctx, ThreadPool* pool)
    : model_(model), pool_(pool), n_ctx_(n_ctx) {
  const ModelConfig& c = model.config();
  const size_t kv = (size_t)(c.n_layers * n_ctx * c.kv_dim());
  k_cache_.assign(kv, 0.0f);
  v_cache_.assign(kv, 0.0f);
  x_.resize((size_t)c.dim);
  xn_.resize((size_t)c.dim);
  q_.resize((size_t)c.q_dim());
  k_.resize((size_t)c.kv_dim());
  v_.resize((size_t)c.kv_dim());
  att_.resize((size_t)n_ctx);
  attn_out_.resize((size_t)c.q_dim());
  proj_.resize((size_t)c.dim);
  const int64_t ffn = std::max(c.ffn_dim, c.expert_ffn_dim);
  gate_.resize((size_t)ffn);
  up_.resize((size_t)ffn);
  ffn_.resize((size_t)ffn);
}

void ReferenceForward::truncate(int64_t n) {
  SERVAL_ASSERT(n >= 0 && n <= n_past_);
  n_past_ = n;
}

void ReferenceForward::matvec(const Matrix& m, const float* x, float* y) {
  if (observer_) (*observer_)(m, x, 1);
  const size_t stride = row_size(m.type, m.cols);
  auto rows = [&](int64_t begin, int64_t end) {
    ref::matvec(m.type, m.data + (size_t)begin * stride, end - begin, m.cols, x, y + begin);
  };
  if (pool_) pool_->parallel_for(m.rows, rows, 16);
  else rows(0, m.rows);
}

Status ReferenceForward::eval(int32_t token, std::span<float> logits, std::span<float> hidden) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  if (c.encoder) return invalid_argument("'" + c.arch + "' is an encoder: reference_embed() runs it");
  if (token < 0 || token >= c.n_vocab)
    return invalid_argument("token id " + std::to_string(token) + " is out of range [0, " +
                            std::to_string(c.n_vocab) + ")");
  if (n_past_ >= n_ctx_)
    return {StatusCode::resource_exhausted, "context is full (" + std::to_string(n_ctx_) + " tokens)"};
  if (!logits.empty() && (int64_t)logits.size() != c.n_vocab)
    return invalid_argument("logits buffer has " + std::to_string(logits.size()) + " floats, expected " +
                            std::to_string(c.n_vocab));

  const int64_t pos = n_past_;
  const int64_t dim = c.dim, hd = c.head_dim, kv_dim = c.kv_dim();
  const int64_t group = c.n_heads / c.n_kv_heads;
  const float scale = c.query_scale();

  // x = token_embd[token]
  ref::dequantize_row(w.token_embd.type, w.token_embd.data + (size_t)token * row_size(w.token_embd.type, dim),
                      x_.data(), dim);
  for (int64_t i = 0; i < dim; ++i) x_[(size_t)i] *= c.embd_scale;
  std::vector<float> cs((size_t)c.rope_dim);

  for (int64_t il = 0; il < c.n_layers; ++il) {
    const LayerWeights& l = w.layers[(size_t)il];
    // --- attention ---
    ref::rmsnorm(xn_.data(), x_.data(), l.attn_norm.data(), dim, c.rms_eps);
    matvec(l.wq, xn_.data(), q_.data());
    matvec(l.wk, xn_.data(), k_.data());
    matvec(l.wv, xn_.data(), v_.data());
    if (!l.bq.empty()) for (int64_t i = 0; i < c.q_dim(); ++i) q_[(size_t)i] += l.bq[(size_t)i];
    if (!l.bk.empty()) for (int64_t i = 0; i < kv_dim; ++i) k_[(size_t)i] += l.bk[(size_t)i];
    if (!l.bv.empty()) for (int64_t i = 0; i < kv_dim; ++i) v_[(size_t)i] += l.bv[(size_t)i];
    if (c.block.qk_norm) {
      blocks::head_rmsnorm(q_.data(), c.n_heads, hd, l.q_norm.data(), c.rms_eps);
      blocks::head_rmsnorm(k_.data(), c.n_kv_heads, hd, l.k_norm.data(), c.rms_eps);
    }
    const ref::RopeSpec rope = blocks::layer_rope(c, w, il);
    ref::rope_cos_sin(rope, pos, cs.data());
    ref::rope_apply(q_.data(), c.n_heads, hd, rope, cs.data());
    ref::rope_apply(k_.data(), c.n_kv_heads, hd, rope, cs.data());
    // Sliding-window layers see the last `window` positions, itself included.
    const int64_t lo = c.window(il) > 0 ? std::max<int64_t>(0, pos + 1 - c.window(il)) : 0;

    float* kc = k_cache_.data() + (size_t)(il * n_ctx_ * kv_dim);
    float* vc = v_cache_.data() + (size_t)(il * n_ctx_ * kv_dim);
    std::copy(k_.begin(), k_.end(), kc + pos * kv_dim);
    std::copy(v_.begin(), v_.end(), vc + pos * kv_dim);

    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t kvh = h / group;
      const float* qh = q_.data() + h * hd;
      for (int64_t t = lo; t <= pos; ++t) {
        const float* kt = kc + t * kv_dim + kvh * hd;
        double s = 0.0;
        for (int64_t i = 0; i < hd; ++i) s += (double)qh[i] * kt[i];
        att_[(size_t)t] = (float)s * scale;
      }
      if (c.attn_softcap > 0.0f) ref::softcap(att_.data() + lo, pos + 1 - lo, c.attn_softcap);
      if (!l.sinks.empty()) {
        // The sink logit joins the softmax's denominator only.
        float mx = l.sinks[(size_t)h];
        for (int64_t t = lo; t <= pos; ++t) mx = std::max(mx, att_[(size_t)t]);
        double z = std::exp((double)l.sinks[(size_t)h] - mx);
        for (int64_t t = lo; t <= pos; ++t) z += std::exp((double)att_[(size_t)t] - mx);
        for (int64_t t = lo; t <= pos; ++t) att_[(size_t)t] = (float)(std::exp((double)att_[(size_t)t] - mx) / z);
      } else {
        ref::softmax(att_.data() + lo, pos + 1 - lo);
      }
      float* out = attn_out_.data() + h * hd;
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int64_t t = lo; t <= pos; ++t) acc += (double)att_[(size_t)t] * vc[t * kv_dim + kvh * hd + i];
        out[i] = (float)acc;
      }
    }
    matvec(l.wo, attn_out_.data(), proj_.data());
    for (size_t i = 0; i < l.bo.size(); ++i) proj_[i] += l.bo[i];
    if (c.block.post_attn_norm) ref::rmsnorm(proj_.data(), proj_.data(), l.post_attn_norm.data(), dim, c.rms_eps);
    for (int64_t i = 0; i < dim; ++i) x_[(size_t)i] += proj_[(size_t)i];

    // --- feed-forward (SwiGLU) ---
    ref::rmsnorm(xn_.data(), x_.data(), l.ffn_norm.data(), dim, c.rms_eps);
    if (c.block.moe) {
      // Route, then sum the chosen experts' outputs with their weights.
      const int64_t ne = c.n_expert, k_used = c.n_expert_used, ff = c.expert_ffn_dim;
      std::vector<float> logits((size_t)ne), weights((size_t)k_used), y((size_t)dim);
      std::vector<int32_t> ids((size_t)k_used);
      matvec(l.router, xn_.data(), logits.data());
      for (size_t e = 0; e < l.router_bias.size(); ++e) logits[e] += l.router_bias[e];
      blocks::route(c, logits.data(), ids.data(), weights.data());
      std::fill(proj_.begin(), proj_.end(), 0.0f);
      for (int64_t k = 0; k < k_used; ++k) {
        const int32_t e = ids[(size_t)k];
        matvec(l.exp_gate[(size_t)e], xn_.data(), gate_.data());
        matvec(l.exp_up[(size_t)e], xn_.data(), up_.data());
        if (!l.exp_gate_b.empty())
          for (int64_t f = 0; f < ff; ++f) {
            gate_[(size_t)f] += l.exp_gate_b[(size_t)(e * ff + f)];
            up_[(size_t)f] += l.exp_up_b[(size_t)(e * ff + f)];
          }
        blocks::gated_act(c.block.act, ffn_.data(), gate_.data(), up_.data(), ff);
        matvec(l.exp_down[(size_t)e], ffn_.data(), y.data());
        for (int64_t d = 0; d < dim; ++d)
          proj_[(size_t)d] += weights[(size_t)k] * (y[(size_t)d] + (l.exp_down_b.empty() ? 0.0f : l.exp_down_b[(size_t)(e * dim + d)]));
      }
    } else {
      matvec(l.w_gate, xn_.data(), gate_.data());
      matvec(l.w_up, xn_.data(), up_.data());
      blocks::gated_act(c.block.act, ffn_.data(), gate_.data(), up_.data(), c.ffn_dim);
      matvec(l.w_down, ffn_.data(), proj_.data());
    }
    if (c.block.post_ffn_norm) ref::rmsnorm(proj_.data(), proj_.data(), l.post_ffn_norm.data(), dim, c.rms_eps);
    for (int64_t i = 0; i < dim; ++i) x_[(size_t)i] += proj_[(size_t)i];
  }
  ++n_past_;

  if (!logits.empty() || !hidden.empty()) {
    ref::rmsnorm(xn_.data(), x_.data(), w.output_norm.data(), dim, c.rms_eps);
    if (!hidden.empty()) std::copy(xn_.begin(), xn_.begin() + dim, hidden.begin());
    if (!logits.empty()) {
      matvec(w.output, xn_.data(), logits.data());
      if (c.final_softcap > 0.0f) ref::softcap(logits.data(), c.n_vocab, c.final_softcap);
    }
  }
  return {};
}

namespace {

// y = W x (+ b) through the reference dot products.
std::vector<float> ref_linear(const Matrix& m, const std::vector<float>& x, const std::vector<float>& b = {}) {
  std::vector<float> y((size_t)m.rows);
  ref::matvec(m.type, m.data, m.rows, m.cols, x.data(), y.data());
  for (size_t i = 0; i < b.size(); ++i) y[i] += b[i];
  return y;
}

// The encoder layout (model_config.h EncoderRecipe) over one input: the last
// layer's output rows, [len][dim].
std::vector<std::vector<float>> reference_encode(const Model& model, std::span<const int32_t> tokens) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t dim = c.dim, hd = c.head_dim, len = (int64_t)tokens.size();
  const int64_t group = c.n_heads / c.n_kv_heads;
  std::vector<std::vector<float>> x((size_t)len, std::vector<float>((size_t)dim));
  std::vector<float> row((size_t)dim);
  for (int64_t p = 0; p < len; ++p) {
    ref::dequantize_row(w.token_embd.type, w.token_embd.data + (size_t)tokens[(size_t)p] * row_size(w.token_embd.type, dim),
                        x[(size_t)p].data(), dim);
    for (int64_t d = 0; d < dim; ++d) x[(size_t)p][(size_t)d] += w.token_type0[(size_t)d];
    if (c.enc.abs_pos) {
      ref::dequantize_row(w.pos_embd.type, w.pos_embd.data + (size_t)p * row_size(w.pos_embd.type, dim), row.data(), dim);
      for (int64_t d = 0; d < dim; ++d) x[(size_t)p][(size_t)d] += row[(size_t)d];
    }
    ref::layernorm(x[(size_t)p].data(), x[(size_t)p].data(), w.embd_norm.data(), w.embd_norm_b.data(), dim, c.norm_eps);
  }
  std::vector<float> cs((size_t)c.rope_dim);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const LayerWeights& l = w.layers[(size_t)il];
    std::vector<std::vector<float>> q, k, v;
    for (int64_t p = 0; p < len; ++p) {
      q.push_back(ref_linear(l.wq, x[(size_t)p], l.bq));
      k.push_back(ref_linear(l.wk, x[(size_t)p], l.bk));
      v.push_back(ref_linear(l.wv, x[(size_t)p], l.bv));
      if (c.enc.rope) {
        ref::rope_cos_sin(c.rope, p, cs.data());
        ref::rope_apply(q.back().data(), c.n_heads, hd, c.rope, cs.data());
        ref::rope_apply(k.back().data(), c.n_kv_heads, hd, c.rope, cs.data());
      }
    }
    for (int64_t i = 0; i < len; ++i) {
      std::vector<float> a((size_t)c.q_dim());
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> sc((size_t)len);
        double mx = -INFINITY;
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += (double)q[(size_t)i][(size_t)(h * hd + d)] * k[(size_t)j][(size_t)(kvh * hd + d)];
          sc[(size_t)j] = dot / std::sqrt((double)hd);
          mx = std::max(mx, sc[(size_t)j]);
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += sc[(size_t)j] / z * v[(size_t)j][(size_t)(kvh * hd + d)];
          a[(size_t)(h * hd + d)] = (float)acc;
        }
      }
      std::vector<float> o = ref_linear(l.wo, a, l.bo);
      for (int64_t d = 0; d < dim; ++d) o[(size_t)d] += x[(size_t)i][(size_t)d];
      ref::layernorm(o.data(), o.data(), l.attn_out_norm.data(), l.attn_out_norm_b.data(), dim, c.norm_eps);
      std::vector<float> up = ref_linear(l.w_up, o, l.b_up);
      if (c.enc.gated) {
        std::vector<float> gate = ref_linear(l.w_gate, o);
        ref::swiglu(up.data(), gate.data(), up.data(), c.ffn_dim);
      } else {
        ref::gelu(up.data(), c.ffn_dim);
      }
      std::vector<float> f = ref_linear(l.w_down, up, l.b_down);
      for (int64_t d = 0; d < dim; ++d) f[(size_t)d] += o[(size_t)d];
      ref::layernorm(f.data(), f.data(), l.layer_out_norm.data(), l.layer_out_norm_b.data(), dim, c.norm_eps);
      x[(size_t)i] = std::move(f);  // the other tokens read only q/k/v of this layer: x may change now
    }
  }
  return x;
}

}  // namespace

Expected<std::vector<float>> reference_embed(const Model& model, std::span<const int32_t> tokens, Pooling pooling,
                                             ThreadPool* pool) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  if (pooling == Pooling::none) pooling = c.pooling;
  if (pooling == Pooling::none) return invalid_argument("the model has no pooling type");
  if (tokens.empty()) return invalid_argument("empty input");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.n_vocab) return invalid_argument("token id " + std::to_string(t) + " is out of range");
  std::vector<std::vector<float>> rows;
  if (c.encoder) {
    if (c.enc.abs_pos && (int64_t)tokens.size() > c.n_ctx_train) return invalid_argument("input is too long");
    rows = reference_encode(model, tokens);
  } else {
    ReferenceForward ref(model, (int64_t)tokens.size(), pool);
    for (int32_t t : tokens) {
      rows.emplace_back((size_t)c.dim);
      SERVAL_RETURN_IF_ERROR(ref.eval(t, {}, rows.back()));
    }
  }
  const int64_t dim = c.dim;
  std::vector<float> out((size_t)dim);
  switch (pooling) {
    case Pooling::mean:
      for (int64_t d = 0; d < dim; ++d) {
        double acc = 0;
        for (const auto& r : rows) acc += r[(size_t)d];
        out[(size_t)d] = (float)(acc / (double)rows.size());
      }
      return out;
    case Pooling::cls: return rows.front();
    case Pooling::last: return rows.back();
    case Pooling::rank: {
      if (!w.cls.data) return invalid_argument("rank pooling needs cls.weight");
      std::vector<float> h = ref_linear(w.cls, rows.front(), w.cls_b);
      for (float& v : h) v = std::tanh(v);
      if (!w.cls_out.data) return std::vector<float>{h[0]};
      return std::vector<float>{ref_linear(w.cls_out, h, w.cls_out_b)[0]};
    }
    case Pooling::none: break;
  }
  return invalid_argument("the model has no pooling type");
}

}  // namespace serval
