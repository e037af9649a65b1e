#include "model/lora.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/fp16.h"
#include "gguf/gguf_writer.h"

#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/ref/quants.h"
#include "model/tensor_loader.h"

namespace serval {

namespace {

constexpr const char* kSuffixA = ".lora_a";
constexpr const char* kSuffixB = ".lora_b";

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::char_traits<char>::length(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// A 2-D tensor widened to F32, row-major [dims[1]][dims[0]].
Expected<std::vector<float>> widen(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  if (t.type != DType::f32 && t.type != DType::f16 && t.type != DType::bf16 && t.type != DType::q8_0)
    return invalid_argument("LoRA tensor '" + t.name + "': type " + std::string(dtype_name(t.type)) +
                            " (adapters are read in F32, F16, BF16 or Q8_0)");
  const int64_t cols = t.dims[0], rows = t.dims[1];
  std::vector<float> out((size_t)(rows * cols));
  const auto data = f.tensor_data(t);
  const size_t rb = row_size(t.type, cols);
  for (int64_t r = 0; r < rows; ++r) ref::dequantize_row(t.type, data.data() + (size_t)r * rb, out.data() + r * cols, cols);
  return out;
}

}  // namespace

const Matrix* adaptable_matrix(const Model& base, const std::string& name) {
  const ModelWeights& w = base.weights();
  if (base.file().find_tensor(name) == nullptr) return nullptr;  // fused (phi3's attn_qkv views) or absent
  if (name == "output.weight") return w.tied_output ? nullptr : &w.output;
  int layer = -1, used = 0;
  char what[32] = {0};
  if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight%n", &layer, what, &used) != 2 || (size_t)used != name.size())
    return nullptr;
  if (layer < 0 || layer >= (int)w.layers.size()) return nullptr;
  const LayerWeights& l = w.layers[(size_t)layer];
  const std::string s = what;
  if (s == "attn_q") return &l.wq;
  if (s == "attn_k") return &l.wk;
  if (s == "attn_v") return &l.wv;
  if (s == "attn_output") return &l.wo;
  if (s == "ffn_gate" && l.w_gate.rows > 0) return &l.w_gate;
  if (s == "ffn_up" && l.w_up.rows > 0) return &l.w_up;
  if (s == "ffn_down" && l.w_down.rows > 0) return &l.w_down;
  return nullptr;
}

Expected<std::shared_ptr<const LoraAdapter>> LoraAdapter::load(const std::string& path, const Model& base,
                                                               float user_scale) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) return f.status().with_context(path);
  auto a = from_file(*f, base, user_scale);
  if (!a.ok()) return a.status().with_context(path);
  return a;
}

Expected<std::shared_ptr<const LoraAdapter>> LoraAdapter::from_file(const gguf::GgufFile& f, const Model& base,
                                                                    float user_scale) {
  if (!(user_scale > -1e6f && user_scale < 1e6f)) return invalid_argument("LoRA scale must be a finite number");
  auto type = f.get_string("general.type");
  if (!type.ok() || *type != "adapter") return invalid_argument("not a LoRA adapter: general.type is not \"adapter\"");
  auto atype = f.get_string("adapter.type");
  if (!atype.ok() || *atype != "lora")
    return invalid_argument("not a LoRA adapter: adapter.type is " + (atype.ok() ? "\"" + *atype + "\"" : "missing"));
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return invalid_argument("LoRA adapter: general.architecture is missing");
  if (*arch != base.config().arch)
    return invalid_argument("LoRA adapter for architecture '" + *arch + "', the base model is '" + base.config().arch + "'");
  if (base.config().tp.size > 1) return invalid_argument("LoRA adapters are not supported with tensor parallelism");
  float alpha = 0.0f;
  if (f.has("adapter.lora.alpha")) {
    auto al = f.get_float("adapter.lora.alpha");
    if (!al.ok() || !(*al >= 0.0 && *al < 1e6)) return invalid_argument("adapter.lora.alpha: expected a number in [0, 1e6)");
    alpha = (float)*al;
  }

  auto out = std::shared_ptr<LoraAdapter>(new LoraAdapter());
  out->alpha_ = alpha;
  bool have_scale = false;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool is_a = ends_with(t.name, kSuffixA), is_b = ends_with(t.name, kSuffixB);
    if (!is_a && !is_b)
      return invalid_argument("LoRA tensor '" + t.name + "': not a .lora_a / .lora_b tensor");
    if (is_b) {
      const std::string pair = t.name.substr(0, t.name.size() - 7) + kSuffixA;
      if (!f.find_tensor(pair)) return invalid_argument("LoRA tensor '" + t.name + "' has no '" + pair + "'");
      continue;
    }
    const std::string base_name = t.name.substr(0, t.name.size() - 7);
    const gguf::TensorInfo* tb = f.find_tensor(base_name + kSuffixB);
    if (!tb) return invalid_argument("LoRA tensor '" + t.name + "' has no '" + base_name + kSuffixB + "'");
    const Matrix* m = adaptable_matrix(base, base_name);
    if (!m)
      return invalid_argument("LoRA tensor '" + t.name + "': the base model has no adaptable matrix '" + base_name +
                              "' (serval adapts attn_q/k/v/output, ffn_gate/up/down and an untied output)");
    if (t.dims.size() != 2 || tb->dims.size() != 2)
      return invalid_argument("LoRA tensor '" + t.name + "': expected 2-D .lora_a and .lora_b");
    const int64_t rank = t.dims[1];
    // A: {cols, rank}; B: {rank, rows} (ggml order), as llama.cpp checks them.
    if (t.dims[0] != m->cols || tb->dims[1] != m->rows)
      return invalid_argument("LoRA tensor '" + base_name + "': shape A " + shape_str(t.dims) + ", B " +
                              shape_str(tb->dims) + " does not fit the base matrix [" + std::to_string(m->cols) + ", " +
                              std::to_string(m->rows) + "]");
    if (tb->dims[0] != rank)
      return invalid_argument("LoRA tensor '" + base_name + "': .lora_a rank " + std::to_string(rank) +
                              " but .lora_b rank " + std::to_string(tb->dims[0]) + " (lora_a not transposed?)");
    if (rank < 1 || rank > 4096) return invalid_argument("LoRA tensor '" + base_name + "': rank out of [1, 4096]");
    LoraDelta d;
    d.rank = rank;
    d.rows = m->rows;
    d.cols = m->cols;
    d.name = base_name;
    if (t.type == DType::f16 && tb->type == DType::f16) {
      // Kept as stored (transposed): the steps read half the bytes.
      const auto* A = reinterpret_cast<const uint16_t*>(f.tensor_data(t).data());
      const auto* B = reinterpret_cast<const uint16_t*>(f.tensor_data(*tb).data());
      d.f16 = true;
      d.at16.resize((size_t)(d.cols * rank));
      for (int64_t k = 0; k < rank; ++k)
        for (int64_t i = 0; i < d.cols; ++i) std::memcpy(&d.at16[(size_t)(i * rank + k)], A + k * d.cols + i, 2);
      d.bt16.resize((size_t)(rank * d.rows));
      for (int64_t j = 0; j < d.rows; ++j)
        for (int64_t k = 0; k < rank; ++k) std::memcpy(&d.bt16[(size_t)kernels::lora_b_index(k, j, rank, d.rows)], B + j * rank + k, 2);
    } else {
      auto A = widen(f, t);
      if (!A.ok()) return A.status();
      auto B = widen(f, *tb);
      if (!B.ok()) return B.status();
      d.at.resize((size_t)(d.cols * rank));
      for (int64_t k = 0; k < rank; ++k)
        for (int64_t i = 0; i < d.cols; ++i) d.at[(size_t)(i * rank + k)] = (*A)[(size_t)(k * d.cols + i)];
      d.bt.resize((size_t)(rank * d.rows));
      for (int64_t j = 0; j < d.rows; ++j)
        for (int64_t k = 0; k < rank; ++k) d.bt[(size_t)kernels::lora_b_index(k, j, rank, d.rows)] = (*B)[(size_t)(j * rank + k)];
    }
    // One scale for the adapter (llama.cpp: alpha / rank with the rank of each
    // tensor; adapters use one rank throughout, and a mix is refused).
    const float s = alpha > 0.0f ? user_scale * alpha / (float)rank : user_scale;
    if (have_scale && s != out->scale_)
      return invalid_argument("LoRA tensor '" + base_name + "': rank " + std::to_string(rank) +
                              " differs from the adapter's other tensors");
    out->scale_ = s;
    have_scale = true;
    out->rank_ = std::max(out->rank_, rank);
    if (!out->by_matrix_.emplace(m, std::move(d)).second)
      return invalid_argument("LoRA tensor '" + base_name + "' appears twice");
  }
  if (out->by_matrix_.empty()) return invalid_argument("LoRA adapter has no tensors");
  return std::shared_ptr<const LoraAdapter>(std::move(out));
}

float LoraDelta::a(int64_t k, int64_t i) const {
  const size_t e = (size_t)(i * rank + k);
  return f16 ? fp16_to_fp32(at16[e]) : at[e];
}

float LoraDelta::b(int64_t j, int64_t k) const {
  const size_t e = (size_t)kernels::lora_b_index(k, j, rank, rows);
  return f16 ? fp16_to_fp32(bt16[e]) : bt[e];
}

size_t LoraAdapter::bytes() const {
  size_t n = 0;
  for (const auto& [m, d] : by_matrix_)
    n += (d.at.size() + d.bt.size()) * sizeof(float) + (d.at16.size() + d.bt16.size()) * sizeof(uint16_t);
  return n;
}

void apply_lora(std::span<const LoraRow> rows, const float* x, float* y, ThreadPool* pool) {
  if (rows.empty()) return;
  // Units of work: up to kernels::kLoraGroupRows consecutive rows of one
  // adapter (the caller lists each adapter's rows together), run in one kernel
  // call that reads the adapter's A and B once for all of them.
  thread_local std::vector<std::pair<int64_t, int64_t>> units;  // [begin, end) of rows
  units.clear();
  for (int64_t q = 0, n = (int64_t)rows.size(); q < n;) {
    int64_t e = q + 1;
    while (e < n && e - q < kernels::kLoraGroupRows && rows[(size_t)e].d == rows[(size_t)q].d &&
           rows[(size_t)e].scale == rows[(size_t)q].scale)
      ++e;
    units.emplace_back(q, e);
    q = e;
  }
  const std::vector<std::pair<int64_t, int64_t>>& us = units;
  auto run = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> t;
    const float* xs[kernels::kLoraGroupRows];
    float* ys[kernels::kLoraGroupRows];
    for (int64_t u = b; u < e; ++u) {
      const auto [r0, r1] = us[(size_t)u];
      const LoraRow& lr = rows[(size_t)r0];
      const LoraDelta& d = *lr.d;
      const int n = (int)(r1 - r0);
      if ((int64_t)t.size() < d.rank * n) t.resize((size_t)(d.rank * n));
      for (int i = 0; i < n; ++i) {
        xs[i] = x + rows[(size_t)(r0 + i)].row * d.cols;
        ys[i] = y + rows[(size_t)(r0 + i)].row * d.rows;
      }
      if (d.f16)
        kernels::lora_rows_f16(d.at16.data(), d.bt16.data(), d.rank, d.cols, d.rows, lr.scale, xs, ys, n, t.data());
      else
        kernels::lora_rows(d.at.data(), d.bt.data(), d.rank, d.cols, d.rows, lr.scale, xs, ys, n, t.data());
    }
  };
  const int64_t n_units = (int64_t)us.size();
  const LoraDelta& d0 = *rows[0].d;
  const int64_t macs_per_unit = std::max<int64_t>(1, d0.rank * (d0.cols + d0.rows));
  if (pool && n_units > 1 && n_units * macs_per_unit >= kernels::kMinChunkMacs / 4)
    pool->parallel_for(n_units, run, std::max<int64_t>(1, kernels::kMinChunkMacs / 4 / macs_per_unit));
  else
    run(0, n_units);
}

std::vector<float> merged_matrix(const Matrix& m, const LoraDelta& d, float scale) {
  std::vector<float> w((size_t)(m.rows * m.cols));
  const size_t rb = row_size(m.type, m.cols);
  for (int64_t j = 0; j < m.rows; ++j) {
    float* wr = w.data() + j * m.cols;
    ref::dequantize_row(m.type, m.data + (size_t)j * rb, wr, m.cols);
    for (int64_t i = 0; i < m.cols; ++i) {
      double ba = 0;  // (B·A)[j][i] = sum_k B[j][k] A[k][i]
      for (int64_t k = 0; k < d.rank; ++k) ba += (double)d.b(j, k) * (double)d.a(k, i);
      wr[i] += (float)(scale * ba);
    }
  }
  return w;
}

Status write_merged_model(const Model& base, const LoraAdapter& a, const std::string& out_path, bool f16) {
  const gguf::GgufFile& f = base.file();
  std::unordered_map<std::string, std::pair<const Matrix*, const LoraDelta*>> adapted;
  for (const auto& [m, d] : a.deltas()) adapted[d.name] = {m, &d};
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : f.metadata()) w.add(kv.key, kv.value);
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto it = adapted.find(t.name);
    if (it == adapted.end()) {
      const auto data = f.tensor_data(t);
      w.add_tensor(t.name, t.dims, t.type, [data](uint8_t* dst, uint64_t n) { std::memcpy(dst, data.data(), n); });
      continue;
    }
    const Matrix* m = it->second.first;
    const LoraDelta* d = it->second.second;
    const float scale = a.scale();
    w.add_tensor(t.name, t.dims, f16 ? DType::f16 : DType::f32, [m, d, scale, f16](uint8_t* dst, uint64_t n) {
      const std::vector<float> merged = merged_matrix(*m, *d, scale);
      if (!f16) {
        std::memcpy(dst, merged.data(), n);
        return;
      }
      auto* h = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < merged.size(); ++i) h[i] = fp32_to_fp16(merged[i]);
    });
  }
  return w.write_file(out_path);
}

}  // namespace serval
