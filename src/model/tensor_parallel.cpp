#include "model/tensor_parallel.h"

#include <utility>
#include <vector>

namespace serval {

namespace {

// Rows [r0, r0 + n) of m: a view.
void slice_rows(Matrix& m, int64_t r0, int64_t n) {
  if (!m.data) return;  // absent (e.g. no gate in an ungated FFN)
  m.data += (size_t)r0 * row_size(m.type, m.cols);
  m.rows = n;
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
                         {"feed_forward_length", c.ffn_dim},
                         {"embedding_length", c.dim}})
    if (std::string why = parts(what, n); !why.empty()) return why;
  return "";
}

Status shard_model(ModelConfig& c, ModelWeights& w, TensorParallel tp) {
  if (tp.size < 2 || tp.rank < 0 || tp.rank >= tp.size)
    return invalid_argument("tensor parallel: rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size));
  if (std::string why = tensor_parallel_refusal(c, w, tp.size); !why.empty()) return unsupported(why);
  const int64_t hd = c.head_dim;
  const int64_t heads = c.n_heads / tp.size, kv_heads = c.n_kv_heads / tp.size, ffn = c.ffn_dim / tp.size;
  const int64_t out = c.dim / tp.size;
  const int64_t q0 = tp.rank * heads * hd, kv0 = tp.rank * kv_heads * hd, f0 = tp.rank * ffn, d0 = tp.rank * out;
  for (LayerWeights& l : w.layers) {
    slice_rows(l.wq, q0, heads * hd);
    slice_rows(l.wk, kv0, kv_heads * hd);
    slice_rows(l.wv, kv0, kv_heads * hd);
    slice_rows(l.wo, d0, out);
    slice_vec(l.bo, d0, out);
    slice_vec(l.bq, q0, heads * hd);
    slice_vec(l.bk, kv0, kv_heads * hd);
    slice_vec(l.bv, kv0, kv_heads * hd);
    slice_vec(l.sinks, tp.rank * heads, heads);
    slice_rows(l.w_gate, f0, ffn);
    slice_rows(l.w_up, f0, ffn);
    slice_rows(l.w_down, d0, out);
  }
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_dim = ffn;
  c.tp = tp;
  return {};
}

}  // namespace serval
