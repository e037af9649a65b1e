#include "model/batch_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/quants.h"
#include "model/blocks.h"

namespace serval {

namespace {

// Query tokens per attention tile (kernels/attention.h): large enough that a
// prefill chunk decodes each K/V chunk once for many queries, small enough to
// leave (sequence, KV head, tile) tasks for every thread.
constexpr int32_t kQueryTile = 16;

// The least work (multiply-adds, weights and attention) for which a step uses
// the pool at all. Below it (a model of a few million parameters decoding a
// few tokens) a step takes ~100 µs on one thread, and its kernels' chunks are
// so short that the hand-offs, and on a shared machine a worker whose core was
// taken away mid-chunk, cost more than the second core gives: such a step runs
// on the calling thread alone, and a tiny model is not slower with more
// threads. (kernels::kMinChunkMacs still decides the split of bigger steps.)
constexpr int64_t kMinParallelStepMacs = int64_t(1) << 26;

// SERVAL_ATTN selects the attention path, for A/B benchmarks:
//   tile (default): tiles of up to kQueryTile tokens; token: tiles of one
//   token (one pass over K/V per token, the old cost); legacy: the old F32
//   per-token kernel (kernels::attention; F32 KV only, else tile).
// The results of tile and token are bit-identical (batch invariance).
enum class AttnMode { tile, token, legacy };
AttnMode attn_mode() {
  static const AttnMode m = [] {
    const char* e = std::getenv("SERVAL_ATTN");
    if (e && std::strcmp(e, "token") == 0) return AttnMode::token;
    if (e && std::strcmp(e, "legacy") == 0) return AttnMode::legacy;
    return AttnMode::tile;
  }();
  return m;
}

// hidden = act(gate) * up over count elements, element by element (any split
// gives the same bits), split over the pool from a batch's worth (16 x 5632:
// ~3 % of a 16-sequence step on one thread).
void gated_act_split(FfnActivation act, float* hidden, const float* gate, const float* up, int64_t count,
                     ThreadPool* pool) {
  constexpr int64_t kPiece = 4096;
  auto run = [&](int64_t b, int64_t e) {
    const int64_t i0 = b * kPiece, i1 = std::min(count, e * kPiece);
    blocks::gated_act_fast(act, hidden + i0, gate + i0, up + i0, i1 - i0);
  };
  const int64_t pieces = (count + kPiece - 1) / kPiece;
  if (pool) pool->parallel_for(pieces, run, 8);
  else run(0, pieces);
}

}  // namespace

BatchForward::BatchForward(const Model& model, KvStorage& kv, ThreadPool* pool)
    : model_(model), kv_(kv), pool_(pool) {
  const ModelConfig& c = model.config();
  if (c.block.moe) expert_tokens_.assign((size_t)(c.n_layers * c.n_expert), 0);
}

// Grouped expert matmul: the tokens are grouped by the experts they route to,
// and each expert's matrices multiply all of its tokens' rows at once (its
// weights are read once per step, not once per token). Each row's result is
// independent of the other rows (kernels/matmul.h), and a token sums its
// experts' outputs in its own routing order, so a token's result does not
// depend on which other tokens share its experts (batch invariance).
// With every expert matrix packed, all experts' gate and up products run in one
// kernels::matmul_grouped, and all down products in another: two hand-offs to
// the pool per layer instead of two per expert, and each thread streams whole
// runs of experts' matrices (the same bits as one product at a time).
// In: xn_ [n, dim] (the FFN's normed input). Out: proj_ [n, dim].
template <class MM, class MMSame>
void BatchForward::moe_ffn(const LayerWeights& l, int64_t n, const MM& mm, const MMSame& mm_same_input,
                           ThreadPool* pool) {
  const ModelConfig& c = model_.config();
  const int64_t dim = c.dim, ne = c.n_expert, k_used = c.n_expert_used, ff = c.expert_ffn_dim;
  router_.resize((size_t)(n * ne));
  mm(l.router, xn_.data(), n, router_.data());
  sel_.resize((size_t)(n * k_used));
  sel_w_.resize((size_t)(n * k_used));
  for (int64_t i = 0; i < n; ++i) {
    float* lg = router_.data() + i * ne;
    if (!l.router_bias.empty())
      for (int64_t e = 0; e < ne; ++e) lg[e] += l.router_bias[(size_t)e];
    blocks::route(c, lg, sel_.data() + i * k_used, sel_w_.data() + i * k_used);
  }
  // Group order: the (token i, slot k) rows, r = i * k_used + k, by expert,
  // then token. group_pos_[r]: r's place in it; group_tok_[g]: the token of
  // its row g.
  const int64_t total = n * k_used;
  group_start_.assign((size_t)(ne + 1), 0);
  for (int32_t e : sel_) ++group_start_[(size_t)e + 1];
  for (int64_t e = 0; e < ne; ++e) group_start_[(size_t)e + 1] += group_start_[(size_t)e];
  group_pos_.resize((size_t)total);
  group_tok_.resize((size_t)total);
  {
    std::vector<int64_t> at(group_start_.begin(), group_start_.end() - 1);
    for (int64_t r = 0; r < total; ++r) {
      const int64_t g = at[(size_t)sel_[(size_t)r]]++;
      group_pos_[(size_t)r] = g;
      group_tok_[(size_t)g] = r / k_used;
    }
  }
  const int64_t layer = &l - model_.weights().layers.data();
  ++moe_layer_passes_;
  moe_out_.resize((size_t)(total * dim));
  if ((int64_t)gate_.size() < total * ff) {
    gate_.resize((size_t)(total * ff));
    up_.resize((size_t)(total * ff));
    hidden_.resize((size_t)(total * ff));
  }
  bool grouped = true;
  for (int64_t e = 0; e < ne && grouped; ++e)
    if (group_start_[(size_t)e + 1] > group_start_[(size_t)e])
      grouped = l.exp_gate[(size_t)e].packed && l.exp_up[(size_t)e].packed && l.exp_down[(size_t)e].packed;
  // Every row's input gathered in group order, where the products (one at a
  // time) or the observer take it that way; the grouped call gathers the
  // quantized rows itself.
  if (!grouped || observer_) {
    moe_in_.resize((size_t)(total * dim));
    for (int64_t g = 0; g < total; ++g)
      std::memcpy(moe_in_.data() + g * dim, xn_.data() + group_tok_[(size_t)g] * dim, (size_t)dim * sizeof(float));
  }
  // (expert, first row, rows) of each expert some token chose.
  auto for_each_expert = [&](auto&& fn) {
    for (int64_t e = 0; e < ne; ++e) {
      const int64_t r0 = group_start_[(size_t)e], m = group_start_[(size_t)e + 1] - r0;
      if (m > 0) fn(e, r0, m);
    }
  };
  for_each_expert([&](int64_t e, int64_t, int64_t m) {
    expert_tokens_[(size_t)(layer * ne + e)] += m;
    ++expert_reads_;
  });

  // gate and up, all experts.
  if (grouped) {
    moe_products_.clear();
    for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
      if (observer_) {
        (*observer_)(l.exp_gate[(size_t)e], moe_in_.data() + r0 * dim, m);
        (*observer_)(l.exp_up[(size_t)e], moe_in_.data() + r0 * dim, m);
      }
      const int64_t* toks = group_tok_.data() + r0;
      moe_products_.push_back({l.exp_gate[(size_t)e].packed.get(), xn_.data(), m, gate_.data() + r0 * ff, toks});
      moe_products_.push_back({l.exp_up[(size_t)e].packed.get(), xn_.data(), m, up_.data() + r0 * ff, toks});
    });
    kernels::matmul_grouped(moe_products_.data(), moe_products_.size(), pool);
  } else {
    for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
      mm_same_input({{&l.exp_gate[(size_t)e], gate_.data() + r0 * ff}, {&l.exp_up[(size_t)e], up_.data() + r0 * ff}},
                    moe_in_.data() + r0 * dim, m, nullptr);
    });
  }
  if (!l.exp_gate_b.empty())
    for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
      for (int64_t j = r0; j < r0 + m; ++j)
        for (int64_t f = 0; f < ff; ++f) {
          gate_[(size_t)(j * ff + f)] += l.exp_gate_b[(size_t)(e * ff + f)];
          up_[(size_t)(j * ff + f)] += l.exp_up_b[(size_t)(e * ff + f)];
        }
    });
  gated_act_split(c.block.act, hidden_.data(), gate_.data(), up_.data(), total * ff, pool);
  // down, all experts.
  if (grouped) {
    moe_products_.clear();
    for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
      const float* he = hidden_.data() + r0 * ff;
      if (observer_) (*observer_)(l.exp_down[(size_t)e], he, m);
      moe_products_.push_back({l.exp_down[(size_t)e].packed.get(), he, m, moe_out_.data() + r0 * dim});
    });
    kernels::matmul_grouped(moe_products_.data(), moe_products_.size(), pool);
  } else {
    for_each_expert([&](int64_t e, int64_t r0, int64_t m) {
      mm(l.exp_down[(size_t)e], hidden_.data() + r0 * ff, m, moe_out_.data() + r0 * dim);
    });
  }
  // Each token's experts' outputs (plus their biases), weighted, in its
  // routing order.
  for (int64_t i = 0; i < n; ++i) {
    float* out = proj_.data() + i * dim;
    for (int64_t k = 0; k < k_used; ++k) {
      const int64_t r = i * k_used + k;
      const float w = sel_w_[(size_t)r];
      const float* y = moe_out_.data() + group_pos_[(size_t)r] * dim;
      const float* b = l.exp_down_b.empty() ? nullptr : l.exp_down_b.data() + sel_[(size_t)r] * dim;
      if (b) {
        if (k == 0) for (int64_t d = 0; d < dim; ++d) out[d] = w * (y[d] + b[d]);
        else for (int64_t d = 0; d < dim; ++d) out[d] += w * (y[d] + b[d]);
      } else {
        if (k == 0) for (int64_t d = 0; d < dim; ++d) out[d] = w * y[d];
        else for (int64_t d = 0; d < dim; ++d) out[d] += w * y[d];
      }
    }
  }
}

Status BatchForward::tp_gather(const float* local, int64_t n, int64_t w, std::vector<float>& full) {
  const int64_t size = model_.config().tp.size;
  tp_recv_.resize((size_t)(size * n * w));
  SERVAL_RETURN_IF_ERROR(collective_->allgather(local, (size_t)(n * w), tp_recv_.data()));
  if ((int64_t)full.size() < n * w * size) full.resize((size_t)(n * w * size));
  for (int64_t r = 0; r < size; ++r)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(full.data() + (i * size + r) * w, tp_recv_.data() + (r * n + i) * w, (size_t)w * sizeof(float));
  return {};
}

void BatchForward::ensure_capacity(int64_t n) {
  const ModelConfig& c = model_.config();
  auto grow = [n](std::vector<float>& v, int64_t width) {
    if ((int64_t)v.size() < n * width) v.resize((size_t)(n * width));
  };
  grow(x_, c.dim);
  grow(xn_, c.dim);
  grow(q_, c.q_dim());
  grow(k_, c.kv_dim());
  grow(v_, c.kv_dim());
  grow(attn_, c.q_dim());
  grow(proj_, c.dim);
  const int64_t ffn = std::max(c.ffn_dim, c.expert_ffn_dim);
  grow(gate_, ffn);
  grow(up_, ffn);
  grow(hidden_, ffn);
  if (c.tp.size > 1) {
    grow(tp_part_, c.dim / c.tp.size);
    grow(tp_full_, std::max(c.q_dim(), ffn) * c.tp.size);
  }

}

Status BatchForward::forward(const Batch& batch, std::vector<float>* logits, std::vector<float>* hidden) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const KvGeometry& g = kv_.geometry();
  const int64_t n = (int64_t)batch.tokens.size();
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hd = c.head_dim;
  if (c.encoder) return invalid_argument("'" + c.arch + "' is an encoder: it embeds (EmbedForward), never decodes");
  if (c.tp.size > 1 && !collective_)
    return invalid_argument("a tensor-parallel shard (rank " + std::to_string(c.tp.rank) + " of " +
                            std::to_string(c.tp.size) + ") needs its all-gather (set_collective)");
  if (g.kv_dim != kv_dim || g.n_layers != c.n_layers)
    return invalid_argument("KV storage geometry does not match the model");
  if (std::string why = kv_type_check(g.type, hd); !why.empty()) return invalid_argument(why);
  // Layers in the sliding-window pool must attend in the model's window (their
  // blocks behind it are released).
  const bool swa_pool = kv_.has_swa_pool();
  for (int64_t il = 0; il < c.n_layers && swa_pool; ++il)
    if (g.in_swa_pool((int32_t)il) && !c.is_swa(il))
      return invalid_argument("KV storage puts layer " + std::to_string(il) +
                              " in the sliding-window pool, but it attends to the whole context");

  // Validate the batch and map every token to (sequence, position).
  std::vector<int32_t> tok_seq((size_t)n);
  std::vector<int64_t> tok_pos((size_t)n);
  int64_t at = 0, n_out = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const BatchSeq& bs = batch.seqs[s];
    if (bs.n_tokens < 1 || at + bs.n_tokens > n) return invalid_argument("batch: sequence token counts do not add up");
    const int64_t end = bs.start_pos + bs.n_tokens;
    if ((int64_t)bs.block_table.size() * g.block_size < end)
      return invalid_argument("batch: block table of sequence " + std::to_string(s) + " holds " +
                              std::to_string(bs.block_table.size() * g.block_size) + " positions, needs " +
                              std::to_string(end));
    for (BlockId b : bs.block_table)
      if (b < 0 || b >= kv_.n_blocks()) return invalid_argument("batch: block id " + std::to_string(b) + " out of range");
    if (swa_pool) {
      if (bs.swa_block_table.size() != bs.block_table.size())
        return invalid_argument("batch: sliding-window block table of sequence " + std::to_string(s) + " has " +
                                std::to_string(bs.swa_block_table.size()) + " blocks, the main table " +
                                std::to_string(bs.block_table.size()));
      // Blocks from the window of the chunk's first position on must be there.
      const int64_t first = std::max<int64_t>(0, bs.start_pos - c.sliding_window + 1) / g.block_size;
      for (size_t j = 0; j < bs.swa_block_table.size(); ++j) {
        const BlockId b = bs.swa_block_table[j];
        if (b >= kv_.n_swa_blocks() || b < -1 || (b == -1 && (int64_t)j >= first))
          return invalid_argument("batch: sliding-window block id " + std::to_string(b) + " at " + std::to_string(j) +
                                  " is out of range or released");
      }
    }
    for (int32_t i = 0; i < bs.n_tokens; ++i, ++at) {
      tok_seq[(size_t)at] = (int32_t)s;
      tok_pos[(size_t)at] = bs.start_pos + i;
    }
    if (bs.needs_logits && (bs.n_logits < 1 || bs.n_logits > bs.n_tokens))
      return invalid_argument("batch: sequence " + std::to_string(s) + " wants logits for " +
                              std::to_string(bs.n_logits) + " of its " + std::to_string(bs.n_tokens) + " tokens");
    n_out += bs.needs_logits ? bs.n_logits : 0;
  }
  if (at != n) return invalid_argument("batch: sequence token counts do not add up");
  for (TokenId t : batch.tokens)
    if (t < 0 || t >= c.n_vocab)
      return invalid_argument("token id " + std::to_string(t) + " is out of range [0, " + std::to_string(c.n_vocab) + ")");
  if (n == 0) {
    logits->clear();
    if (hidden) hidden->clear();
    return {};
  }
  ensure_capacity(n);

  // x = token embeddings
  const size_t emb_stride = row_size(w.token_embd.type, dim);
  for (int64_t i = 0; i < n; ++i) {
    float* xi = x_.data() + i * dim;
    ref::dequantize_row(w.token_embd.type, w.token_embd.data + (size_t)batch.tokens[(size_t)i] * emb_stride, xi, dim);
    if (c.embd_scale != 1.0f)
      for (int64_t j = 0; j < dim; ++j) xi[j] *= c.embd_scale;
  }
  // RoPE angles of every token: one table for the full-attention layers and,
  // where the family rotates its sliding-window layers differently, one for those.
  const ref::RopeSpec rope_full = blocks::rope_of(c, w, false), rope_local = blocks::rope_of(c, w, true);
  const bool two_ropes = c.has_swa() && blocks::rope_differs(c.rope, c.rope_swa);
  const int64_t rd = c.rope_dim;
  cs_full_.resize((size_t)(n * rd));
  if (two_ropes) cs_swa_.resize((size_t)(n * rd));
  for (int64_t i = 0; i < n; ++i) {
    ref::rope_cos_sin(rope_full, tok_pos[(size_t)i], cs_full_.data() + i * rd);
    if (two_ropes) ref::rope_cos_sin(rope_local, tok_pos[(size_t)i], cs_swa_.data() + i * rd);
  }

  // The step's multiply-adds: every layer's matrices and attention over the
  // context for each token, the output matrix for each output row.
  int64_t step_macs = n_out * dim * c.n_vocab;
  const int64_t layer_params =
      dim * (2 * q_dim + 2 * kv_dim + (c.block.moe ? c.n_expert + 3 * c.n_expert_used * c.expert_ffn_dim : 3 * c.ffn_dim));
  for (int64_t i = 0; i < n && step_macs < kMinParallelStepMacs; ++i)
    step_macs += c.n_layers * (layer_params + 2 * (tok_pos[(size_t)i] + 1) * q_dim);
  ThreadPool* const pool = step_macs >= kMinParallelStepMacs ? pool_ : nullptr;

  // LoRA adapters: the token rows of each adapter, and the output rows of
  // each (logits rows), grouped by adapter, in batch order.
  struct LoraGroup {
    const LoraAdapter* lora;
    std::vector<int64_t> rows;
  };
  std::vector<LoraGroup> lora_tok, lora_out;
  std::vector<LoraRow> lora_rows;  // one matrix's rows to update (scratch of mm)
  {
    auto group_of = [](std::vector<LoraGroup>& gs, const LoraAdapter* a) -> std::vector<int64_t>& {
      for (LoraGroup& gr : gs)
        if (gr.lora == a) return gr.rows;
      gs.push_back({a, {}});
      return gs.back().rows;
    };
    int64_t t0 = 0, o0 = 0;
    for (const BatchSeq& bs : batch.seqs) {
      if (bs.lora) {
        auto& tr = group_of(lora_tok, bs.lora);
        for (int32_t i = 0; i < bs.n_tokens; ++i) tr.push_back(t0 + i);
        if (bs.needs_logits) {
          auto& orow = group_of(lora_out, bs.lora);
          for (int32_t i = 0; i < bs.n_logits; ++i) orow.push_back(o0 + i);
        }
      }
      t0 += bs.n_tokens;
      o0 += bs.needs_logits ? bs.n_logits : 0;
    }
  }
  // rows_of: the LoRA groups of the rows of `in` (token rows, output rows), or null.
  auto add_lora = [&](const Matrix& m, const float* in, float* out, const std::vector<LoraGroup>* rows_of) {
    if (!rows_of) return;
    lora_rows.clear();
    for (const LoraGroup& gr : *rows_of)
      if (const LoraDelta* d = gr.lora->delta(m))
        for (int64_t r : gr.rows) lora_rows.push_back({d, gr.lora->scale(), r});
    apply_lora(lora_rows, in, out, pool);
  };
  auto mm = [&](const Matrix& m, const float* in, int64_t rows_n, float* out,
                const std::vector<LoraGroup>* rows_of = nullptr) {
    if (observer_) (*observer_)(m, in, rows_n);
    if (m.packed) kernels::matmul(*m.packed, in, rows_n, out, pool);
    else kernels::matmul(m.type, m.data, m.rows, m.cols, in, rows_n, out, pool);
    add_lora(m, in, out, rows_of);
  };
  const std::vector<LoraGroup>* const tok_loras = lora_tok.empty() ? nullptr : &lora_tok;
  // Products of one input (a layer's Q, K, V; gate and up): with every
  // matrix packed, one matmul_many (the input quantized once, one hand-off
  // to the pool; the same bits as mm one by one), then each one's LoRA rows.
  auto mm_same_input = [&](std::initializer_list<std::pair<const Matrix*, float*>> products, const float* in,
                           int64_t rows_n, const std::vector<LoraGroup>* rows_of) {
    kernels::PackedProduct pp[4] = {};
    size_t count = 0;
    for (const auto& [m, out] : products)
      if (m->packed && count < 4) pp[count++] = {m->packed.get(), out};
    if (count != products.size()) {
      for (const auto& [m, out] : products) mm(*m, in, rows_n, out, rows_of);
      return;
    }
    if (observer_)
      for (const auto& [m, out] : products) (*observer_)(*m, in, rows_n);
    kernels::matmul_many(pp, count, in, rows_n, pool);
    for (const auto& [m, out] : products) add_lora(*m, in, out, rows_of);
  };
  // Runs fn over [0, count) on the pool, in chunks of at least `grain` items.
  auto par = [&](int64_t count, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1) {
    if (pool) pool->parallel_for(count, fn, grain);
    else fn(0, count);
  };
  // Runs fn(i) for each token row i: on the pool when there are enough rows
  // to share (a row's norm or RoPE takes microseconds; one hand-off costs about
  // as much), else here. Each row's result is computed the same way wherever.
  auto each_row = [&](const std::function<void(int64_t)>& fn) {
    if (pool && n >= 4)
      pool->parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) fn(i);
      });
    else
      for (int64_t i = 0; i < n; ++i) fn(i);
  };
  const float scale = c.query_scale();

  // Block pointers per sequence, refreshed per layer.
  std::vector<std::vector<const uint8_t*>> kb(batch.seqs.size()), vb(batch.seqs.size());
  const size_t row_bytes = g.row_bytes();
  const bool legacy = attn_mode() == AttnMode::legacy && g.type == KvType::f32 && !c.has_swa() &&
                      c.attn_softcap == 0.0f;
  // Attention tiles: runs of up to max_m consecutive tokens of one sequence.
  struct Tile {
    size_t seq;
    int64_t tok;
    int32_t m;
  };
  std::vector<Tile> tiles;
  const int32_t max_m = attn_mode() == AttnMode::token ? 1 : kQueryTile;
  for (size_t s = 0, tok = 0; s < batch.seqs.size(); tok += (size_t)batch.seqs[s].n_tokens, ++s)
    for (int32_t i = 0; i < batch.seqs[s].n_tokens; i += max_m)
      tiles.push_back({s, (int64_t)tok + i, std::min(max_m, batch.seqs[s].n_tokens - i)});
  // The pool splits work into contiguous chunks, and a tile's cost grows with
  // its position: order tiles largest, smallest, 2nd largest, 2nd smallest, ...
  // so every chunk gets a fair share. (Which thread runs a tile never changes
  // its result.)
  {
    auto cost = [&](const Tile& t) { return (tok_pos[(size_t)t.tok] + t.m) * t.m; };
    std::vector<Tile> by_cost = tiles;
    std::stable_sort(by_cost.begin(), by_cost.end(), [&](const Tile& a, const Tile& b) { return cost(a) > cost(b); });
    for (size_t i = 0, lo = 0, hi = by_cost.size(); lo < hi; ++i)
      tiles[i] = (i % 2 == 0) ? by_cost[lo++] : by_cost[--hi];
  }

  // Attention tasks per pool chunk: at least kernels::kMinChunkMacs of work
  // each (the same in every layer), so a tiny model or a short context stays
  // on this thread.
  int64_t attn_macs = 0;
  for (const Tile& tl : tiles) attn_macs += (int64_t)tl.m * (tok_pos[(size_t)tl.tok] + tl.m) * hd * 2 * c.n_heads;
  const int64_t attn_tasks = (int64_t)tiles.size() * c.n_kv_heads;
  const int64_t attn_grain =
      attn_macs > 0 ? std::max<int64_t>(1, kernels::kMinChunkMacs * attn_tasks / attn_macs) : attn_tasks;

  for (int64_t il = 0; il < c.n_layers; ++il) {
    const LayerWeights& l = w.layers[(size_t)il];
    const bool local_rope = two_ropes && c.is_swa(il);
    const ref::RopeSpec& layer_rope = c.is_swa(il) ? rope_local : rope_full;
    const int32_t window = c.window(il);
    const bool in_swa_pool = swa_pool && g.in_swa_pool((int32_t)il);
    each_row([&](int64_t i) {
      ref::rmsnorm(xn_.data() + i * dim, x_.data() + i * dim, l.attn_norm.data(), dim, c.rms_eps);
    });
    mm_same_input({{&l.wq, q_.data()}, {&l.wk, k_.data()}, {&l.wv, v_.data()}}, xn_.data(), n, tok_loras);
    // Each token's biases, norms, RoPE and K/V write touch only its own rows
    // and its own cache slot.
    each_row([&](int64_t i) {
      float* q = q_.data() + i * q_dim;
      float* k = k_.data() + i * kv_dim;
      float* v = v_.data() + i * kv_dim;
      if (!l.bq.empty()) for (int64_t j = 0; j < q_dim; ++j) q[j] += l.bq[(size_t)j];
      if (!l.bk.empty()) for (int64_t j = 0; j < kv_dim; ++j) k[j] += l.bk[(size_t)j];
      if (!l.bv.empty()) for (int64_t j = 0; j < kv_dim; ++j) v[j] += l.bv[(size_t)j];
      const int64_t pos = tok_pos[(size_t)i];
      if (c.block.qk_norm) {
        blocks::head_rmsnorm(q, c.n_heads, hd, l.q_norm.data(), c.rms_eps);
        blocks::head_rmsnorm(k, c.n_kv_heads, hd, l.k_norm.data(), c.rms_eps);
      }
      const float* cs = (local_rope ? cs_swa_.data() : cs_full_.data()) + i * rd;
      ref::rope_apply(q, c.n_heads, hd, layer_rope, cs);
      ref::rope_apply(k, c.n_kv_heads, hd, layer_rope, cs);
      // Write this token's K/V into its slot.
      const BatchSeq& bs = batch.seqs[(size_t)tok_seq[(size_t)i]];
      const BlockId blk = (in_swa_pool ? bs.swa_block_table : bs.block_table)[(size_t)(pos / g.block_size)];
      const int64_t slot = pos % g.block_size;
      kernels::kv_store_row(g.type, k, kv_dim, kv_.k((int32_t)il, blk) + slot * row_bytes);
      kernels::kv_store_row(g.type, v, kv_dim, kv_.v((int32_t)il, blk) + slot * row_bytes);
    });
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const auto& table = in_swa_pool ? batch.seqs[s].swa_block_table : batch.seqs[s].block_table;
      kb[s].resize(table.size());
      vb[s].resize(table.size());
      for (size_t j = 0; j < table.size(); ++j) {  // released blocks (-1) are never read
        kb[s][j] = table[j] < 0 ? nullptr : kv_.k((int32_t)il, table[j]);
        vb[s][j] = table[j] < 0 ? nullptr : kv_.v((int32_t)il, table[j]);
      }
    }
    if (legacy) {
      // The old F32 kernel, one token per task (all of its heads).
      par(n, [&](int64_t b, int64_t e) {
        thread_local std::vector<float> scratch;
        thread_local std::vector<const float*> kf, vf;
        for (int64_t i = b; i < e; ++i) {
          const int64_t n_ctx = tok_pos[(size_t)i] + 1;
          if ((int64_t)scratch.size() < n_ctx) scratch.resize((size_t)n_ctx);
          const size_t s = (size_t)tok_seq[(size_t)i];
          kf.resize(kb[s].size());
          vf.resize(vb[s].size());
          for (size_t j = 0; j < kf.size(); ++j) {
            kf[j] = reinterpret_cast<const float*>(kb[s][j]);
            vf[j] = reinterpret_cast<const float*>(vb[s][j]);
          }
          kernels::attention(q_.data() + i * q_dim, kf.data(), vf.data(), g.block_size, kv_dim, n_ctx,
                             (int32_t)c.n_heads, (int32_t)c.n_kv_heads, (int32_t)hd, scale, attn_.data() + i * q_dim,
                             scratch.data());
        }
      });
    } else {
      // One task per (tile, KV head): each reads its K/V positions once for
      // all of the tile's tokens and query heads.
      par((int64_t)tiles.size() * c.n_kv_heads, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) {
          const Tile& tl = tiles[(size_t)(w / c.n_kv_heads)];
          kernels::AttentionTile t;
          t.q = q_.data() + tl.tok * q_dim;
          t.q_stride = q_dim;
          t.k = {kb[tl.seq].data(), g.block_size, row_bytes, g.type};
          t.v = {vb[tl.seq].data(), g.block_size, row_bytes, g.type};
          t.p0 = tok_pos[(size_t)tl.tok];
          t.m = tl.m;
          t.n_heads = (int32_t)c.n_heads;
          t.n_kv_heads = (int32_t)c.n_kv_heads;
          t.head_dim = (int32_t)hd;
          t.kv_head = (int32_t)(w % c.n_kv_heads);
          t.scale = scale;
          t.window = window;
          t.softcap = c.attn_softcap;
          t.sinks = l.sinks.empty() ? nullptr : l.sinks.data();
          t.out = attn_.data() + tl.tok * q_dim;
          t.out_stride = q_dim;
          kernels::attention_tile(t);
        }
      }, attn_grain);
    }
    // A shard gathers every rank's heads, projects onto its own output rows
    // (all columns: the whole model's arithmetic), then gathers the rows.
    const bool tp = c.tp.size > 1;
    if (tp) SERVAL_RETURN_IF_ERROR(tp_gather(attn_.data(), n, q_dim, tp_full_));
    float* const wo_out = tp ? tp_part_.data() : proj_.data();
    const int64_t wo_rows = l.wo.rows;
    mm(l.wo, tp ? tp_full_.data() : attn_.data(), n, wo_out, tok_loras);
    if (!l.bo.empty())
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < wo_rows; ++j) wo_out[(size_t)(i * wo_rows + j)] += l.bo[(size_t)j];
    if (tp) SERVAL_RETURN_IF_ERROR(tp_gather(tp_part_.data(), n, wo_rows, proj_));
    each_row([&](int64_t i) {
      float* p = proj_.data() + i * dim;
      float* x = x_.data() + i * dim;
      if (c.block.post_attn_norm) ref::rmsnorm(p, p, l.post_attn_norm.data(), dim, c.rms_eps);
      for (int64_t j = 0; j < dim; ++j) x[j] += p[j];
      ref::rmsnorm(xn_.data() + i * dim, x, l.ffn_norm.data(), dim, c.rms_eps);
    });
    if (c.block.moe) {
      moe_ffn(l, n, mm, mm_same_input, pool);
    } else {
      mm_same_input({{&l.w_gate, gate_.data()}, {&l.w_up, up_.data()}}, xn_.data(), n, tok_loras);
      gated_act_split(c.block.act, hidden_.data(), gate_.data(), up_.data(), n * c.ffn_dim, pool);
      if (tp) {
        SERVAL_RETURN_IF_ERROR(tp_gather(hidden_.data(), n, c.ffn_dim, tp_full_));
        mm(l.w_down, tp_full_.data(), n, tp_part_.data());
        SERVAL_RETURN_IF_ERROR(tp_gather(tp_part_.data(), n, l.w_down.rows, proj_));
      } else {
        mm(l.w_down, hidden_.data(), n, proj_.data(), tok_loras);
      }
    }
    each_row([&](int64_t i) {
      float* p = proj_.data() + i * dim;
      float* x = x_.data() + i * dim;
      if (c.block.post_ffn_norm) ref::rmsnorm(p, p, l.post_ffn_norm.data(), dim, c.rms_eps);
      for (int64_t j = 0; j < dim; ++j) x[j] += p[j];
    });
  }

  // Final norm and output projection for the rows that need logits.
  out_rows_.resize((size_t)(n_out * dim));
  int64_t o = 0, tok_end = 0;
  for (const BatchSeq& bs : batch.seqs) {
    tok_end += bs.n_tokens;
    if (!bs.needs_logits) continue;
    for (int64_t t = tok_end - bs.n_logits; t < tok_end; ++t, ++o)
      ref::rmsnorm(out_rows_.data() + o * dim, x_.data() + t * dim, w.output_norm.data(), dim, c.rms_eps);
  }
  if (hidden) {
    hidden->clear();
    tok_end = 0;
    for (const BatchSeq& bs : batch.seqs) {
      tok_end += bs.n_tokens;
      if (!bs.want_hidden) continue;
      for (int64_t t = tok_end - bs.n_tokens; t < tok_end; ++t) {
        hidden->resize(hidden->size() + (size_t)dim);
        ref::rmsnorm(hidden->data() + hidden->size() - (size_t)dim, x_.data() + t * dim, w.output_norm.data(), dim,
                     c.rms_eps);
      }
    }
  }
  logits->resize((size_t)(n_out * c.n_vocab));
  if (n_out > 0) mm(w.output, out_rows_.data(), n_out, logits->data(), lora_out.empty() ? nullptr : &lora_out);
  if (c.final_softcap > 0.0f) ref::softcap(logits->data(), n_out * c.n_vocab, c.final_softcap);
  return {};
}

const char* BatchForward::kernel_level() { return kernels::active_isa_name(); }

}  // namespace serval
