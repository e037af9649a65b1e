// LoRA adapters in llama.cpp's GGUF adapter format, applied on top of a base
// model's weights without copying or merging them.
//
// File: `general.type = "adapter"`, `adapter.type = "lora"`,
// `adapter.lora.alpha` (optional; 0 or absent: no alpha scaling),
// `general.architecture` equal to the base's, and for each adapted base
// matrix `<base tensor>.lora_a` (GGUF dims {cols, rank}: A, [rank, cols]) and
// `<base tensor>.lora_b` (dims {rank, rows}: B, [rows, rank]), F32 / F16 /
// BF16 / Q8_0. The delta of a base matrix W is scale * B·A with
// scale = user_scale * alpha / rank (user_scale without alpha), as llama.cpp
// computes it: y = W·x + scale * B·(A·x).
//
// Adaptable: the attention and dense FFN matrices of every layer
// (attn_q/k/v/output, ffn_gate/up/down) and the output matrix. Anything else
// (token_embd, fused attn_qkv, expert stacks, unknown names) is refused naming
// the tensor, as are shapes that do not match the base.
//
// Application (apply_lora): per token, t = A·x then y += scale * B·t, both in
// a fixed order over A's and B's elements (axpy loops over transposed copies,
// vectorizable without reassociation), so a token's result never depends on
// what else is in the batch. BatchForward runs the tokens of each adapter as a
// group: one pass of the step's base matmul for all tokens, then each
// adapter's update for its own rows (S-LoRA/Punica style).
//
// Immutable after load: safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model.h"

namespace serval {

// The low-rank update of one base matrix ([rows, cols]).
// A and B are kept in F16 when the file stores both so (half the bytes the
// steps read), else widened to F32.
struct LoraDelta {
  int64_t rank = 0, rows = 0, cols = 0;
  std::string name;           // the base tensor's name
  bool f16 = false;           // at16/bt16 hold A and B, else at/bt
  std::vector<float> at;      // A transposed: [cols][rank]
  std::vector<float> bt;      // B in kernels::lora_row's blocks (kernels::lora_b_index)
  std::vector<uint16_t> at16, bt16;
  float a(int64_t k, int64_t i) const;  // A[k][i], widened
  float b(int64_t j, int64_t k) const;  // B[j][k], widened
};

class LoraAdapter {
 public:
  // Reads and checks `path` against `base` (architecture, every tensor's
  // name and shape). user_scale: the multiplier of `--lora NAME=FILE:SCALE`.
  static Expected<std::shared_ptr<const LoraAdapter>> load(const std::string& path, const Model& base,
                                                           float user_scale = 1.0f);
  static Expected<std::shared_ptr<const LoraAdapter>> from_file(const gguf::GgufFile& f, const Model& base,
                                                                float user_scale = 1.0f);

  // The update of base matrix m (a member of base.weights()), or null.
  const LoraDelta* delta(const Matrix& m) const {
    auto it = by_matrix_.find(&m);
    return it == by_matrix_.end() ? nullptr : &it->second;
  }
  float scale() const { return scale_; }
  float alpha() const { return alpha_; }
  int64_t rank() const { return rank_; }  // the largest rank of its tensors
  size_t n_matrices() const { return by_matrix_.size(); }
  size_t bytes() const;  // of its copies of A and B
  // For each adapted base matrix, in no particular order.
  const std::unordered_map<const Matrix*, LoraDelta>& deltas() const { return by_matrix_; }

 private:
  std::unordered_map<const Matrix*, LoraDelta> by_matrix_;
  float scale_ = 1.0f, alpha_ = 0.0f;
  int64_t rank_ = 0;
};

// The base matrix a GGUF tensor name denotes in `base` (the names LoRA files
// use), or null when it is not adaptable.
const Matrix* adaptable_matrix(const Model& base, const std::string& tensor_name);

// One row of a batch to update for one base matrix: y[row] += scale * B·(A·x[row]).
struct LoraRow {
  const LoraDelta* d;  // all rows of one call adapt the same base matrix (same shape)
  float scale;
  int64_t row;         // of x (stride d->cols) and y (stride d->rows)
};
// Applies every listed row's update (each row's result is independent of the
// others): consecutive rows of one adapter go to kernels::lora_rows in groups
// of kernels::kLoraGroupRows (the adapter's bytes read once per group), the
// groups spread over the pool. Optional pool.
void apply_lora(std::span<const LoraRow> rows, const float* x, float* y, ThreadPool* pool);

// W + scale * B·A for base matrix m ([rows][cols] F32), computed the obvious
// way: the reference that adapter outputs are checked against.
std::vector<float> merged_matrix(const Matrix& m, const LoraDelta& d, float scale);
// Writes `base` with `a` merged in (`serval lora merge`): every adapted
// matrix as F32 (or F16 with f16 set), every other tensor and key as stored.
Status write_merged_model(const Model& base, const LoraAdapter& a, const std::string& out_path, bool f16 = false);

}  // namespace serval
