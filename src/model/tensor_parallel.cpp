#include "model/tensor_parallel.h"

#include <cstring>
#include <tuple>
#include <utility>
#include <memory>
#include <vector>

namespace serval {

namespace {

int64_t block_elems(DType t) {
  auto tr = dtype_traits(t);
  return tr ? (int64_t)tr->block_size : 0;
}

// Rows [r0, r0 + n) of m: a view.
void slice_rows(Matrix& m, int64_t r0, int64_t n) {
  if (!m.data) return;  // absent (e.g. no gate in an ungated FFN)
  m.data += (size_t)r0 * row_size(m.type, m.cols);
  m.rows = n;
}

// Columns [c0, c0 + n) of m: copied (rows are not contiguous in them).
void slice_cols(Matrix& m, int64_t c0, int64_t n) {
  if (!m.data) return;
  const size_t full = row_size(m.type, m.cols), off = row_size(m.type, c0), part = row_size(m.type, n);
  auto buf = std::make_shared<std::vector<uint8_t>>(part * (size_t)m.rows);
  for (int64_t r = 0; r < m.rows; ++r) std::memcpy(buf->data() + (size_t)r * part, m.data + (size_t)r * full + off, part);
  m.owned = buf;
  m.data = buf->data();
  m.cols = n;
}

template <class T>
void slice_vec(std::vector<T>& v, int64_t start, int64_t n) {
  if (v.empty()) return;
  v = std::vector<T>(v.begin() + start, v.begin() + start + n);
}

}  // namespace

std::string tensor_parallel_refusal(const ModelConfig& c, const ModelWeights& w, int32_t size) {
  if (size < 1) return "the tensor-parallel size must be at least 1";
  if (size == 1) return "";
  if (c.encoder) return "'" + c.arch + "' is an encoder: tensor parallelism splits decoders only";
  if (c.block.moe) return "mixture-of-experts models are not split by tensor parallelism yet";
  auto parts = [&](const char* what, int64_t n) -> std::string {
    if (n % size != 0)
      return std::string(what) + " (" + std::to_string(n) + ") is not a multiple of the tensor-parallel size " +
             std::to_string(size);
    return "";
  };
  for (auto [what, n] : {std::pair<const char*, int64_t>{"attention.head_count", c.n_heads},
                         {"attention.head_count_kv", c.n_kv_heads},
                         {"feed_forward_length", c.ffn_dim}})
    if (std::string why = parts(what, n); !why.empty()) return why;
  // A column split must fall on a quantization block of the matrix it cuts.
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const LayerWeights& l = w.layers[il];
    for (auto [name, m, cut] : {std::tuple<const char*, const Matrix*, int64_t>{"attn_output", &l.wo, c.q_dim() / size},
                                {"ffn_down", &l.w_down, c.ffn_dim / size}}) {
      const int64_t be = block_elems(m->type);
      if (be == 0 || cut % be != 0)
        return "blk." + std::to_string(il) + "." + name + " (" + std::string(dtype_name(m->type)) + ", blocks of " +
               std::to_string(be) + ") cannot be split into column slices of " + std::to_string(cut);
    }
  }
  return "";
}

Status shard_model(ModelConfig& c, ModelWeights& w, TensorParallel tp) {
  if (tp.size < 2 || tp.rank < 0 || tp.rank >= tp.size)
    return invalid_argument("tensor parallel: rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size));
  if (std::string why = tensor_parallel_refusal(c, w, tp.size); !why.empty()) return unsupported(why);
  const int64_t hd = c.head_dim;
  const int64_t heads = c.n_heads / tp.size, kv_heads = c.n_kv_heads / tp.size, ffn = c.ffn_dim / tp.size;
  const int64_t q0 = tp.rank * heads * hd, kv0 = tp.rank * kv_heads * hd, f0 = tp.rank * ffn;
  for (LayerWeights& l : w.layers) {
    slice_rows(l.wq, q0, heads * hd);
    slice_rows(l.wk, kv0, kv_heads * hd);
    slice_rows(l.wv, kv0, kv_heads * hd);
    slice_cols(l.wo, q0, heads * hd);
    slice_vec(l.bq, q0, heads * hd);
    slice_vec(l.bk, kv0, kv_heads * hd);
    slice_vec(l.bv, kv0, kv_heads * hd);
    slice_vec(l.sinks, tp.rank * heads, heads);
    slice_rows(l.w_gate, f0, ffn);
    slice_rows(l.w_up, f0, ffn);
    slice_cols(l.w_down, f0, ffn);
    if (tp.rank != 0) l.bo.clear();  // added once, by rank 0, before the all-reduce
  }
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_dim = ffn;
  c.tp = tp;
  return {};
}

}  // namespace serval
