#include "kernels/matmul.h"

#include <cmath>
#include <vector>

#include "kernels/ref/quants.h"

namespace serval::kernels {

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void matmul(DType t, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            ThreadPool* pool) {
  const size_t stride = row_size(t, cols);
  const auto* base = static_cast<const uint8_t*>(w);
  auto work = [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> row;
    if ((int64_t)row.size() < cols) row.resize((size_t)cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr;
      if (t == DType::f32) {
        wr = reinterpret_cast<const float*>(base + (size_t)r * stride);
      } else {
        ref::dequantize_row(t, base + (size_t)r * stride, row.data(), cols);
        wr = row.data();
      }
      for (int64_t i = 0; i < n; ++i) y[i * rows + r] = dot_f32(wr, x + i * cols, cols);
    }
  };
  if (pool) pool->parallel_for(rows, work, 16);
  else work(0, rows);
}

void attention(const float* q, const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
               int64_t kv_stride, int64_t n_ctx, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale,
               float* out, float* scratch) {
  const int32_t group = n_heads / n_kv_heads;
  for (int32_t h = 0; h < n_heads; ++h) {
    const int64_t koff = (int64_t)(h / group) * head_dim;
    const float* qh = q + (int64_t)h * head_dim;
    float mx = -INFINITY;
    for (int64_t p = 0; p < n_ctx; ++p) {
      const float* kp = k_blocks[p / block_size] + (p % block_size) * kv_stride + koff;
      scratch[p] = dot_f32(qh, kp, head_dim) * scale;
      mx = scratch[p] > mx ? scratch[p] : mx;
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < n_ctx; ++p) {
      scratch[p] = std::exp(scratch[p] - mx);
      sum += scratch[p];
    }
    const float inv = 1.0f / sum;
    float* oh = out + (int64_t)h * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) oh[d] = 0.0f;
    for (int64_t p = 0; p < n_ctx; ++p) {
      const float* vp = v_blocks[p / block_size] + (p % block_size) * kv_stride + koff;
      const float wgt = scratch[p] * inv;
      for (int32_t d = 0; d < head_dim; ++d) oh[d] += wgt * vp[d];
    }
  }
}

}  // namespace serval::kernels
