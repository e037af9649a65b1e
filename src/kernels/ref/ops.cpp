#include "kernels/ref/ops.h"

#include <cmath>

#include "kernels/ref/quants.h"

namespace serval::ref {

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float scale = (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void matvec(DType t, const void* w, int64_t rows, int64_t cols, const float* x, float* y) {
  const size_t stride = row_size(t, cols);
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r) y[r] = dot_row(t, base + (size_t)r * stride, x, cols);
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float freq_base,
          RopeLayout layout) {
  const int64_t half = rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = (double)pos * std::pow((double)freq_base, -2.0 * (double)i / (double)rope_dim);
    const float c = (float)std::cos(theta), s = (float)std::sin(theta);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim;
      const int64_t a = layout == RopeLayout::adjacent ? 2 * i : i;
      const int64_t b = layout == RopeLayout::adjacent ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace serval::ref
