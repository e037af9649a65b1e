// Batched matrix products and attention of the forward pass: the one dispatch
// point the model calls (SIMD/GPU variants plug in here; ref/ holds the scalar
// references they are tested against).
//
// Batch invariance: every output element is computed by the same code in the
// same reduction order whatever the batch size or composition, so a sequence
// gets bit-identical results alone or batched with others.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "tensor/dtype.h"

namespace serval::kernels {

// Y[i, r] = dot(W[r, :], X[i, :]) for i < n, r < rows. W is [rows, cols] of type
// t (row_size(t, cols) bytes per row); X is [n, cols] F32; Y is [n, rows] F32.
// Each weight row is decoded once per call for the whole batch.
void matmul(DType t, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            ThreadPool* pool);

// Fixed-order F32 dot product (8 interleaved partial sums, then pairwise).
float dot_f32(const float* a, const float* b, int64_t n);

// Causal attention of one query token over positions [0, n_ctx) whose K/V rows
// live in blocks: position p is row p % block_size of k_blocks[p / block_size]
// (each block [block_size, kv_stride] F32, head h's slice at h * head_dim).
// q: [n_heads, head_dim]; out: [n_heads, head_dim]; scratch: n_ctx floats.
// Grouped-query: query head h reads KV head h / (n_heads / n_kv_heads).
void attention(const float* q, const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
               int64_t kv_stride, int64_t n_ctx, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale,
               float* out, float* scratch);

}  // namespace serval::kernels
