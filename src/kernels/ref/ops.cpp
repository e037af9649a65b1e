#include "kernels/ref/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/ref/quants.h"

namespace serval::ref {

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float scale = (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void layernorm(float* out, const float* x, const float* w, const float* b, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / (double)n;
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
  const double scale = 1.0 / std::sqrt(ss / (double)n + (double)eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (float)(((double)x[i] - mean) * scale) * w[i] + b[i];
}

void matvec(DType t, const void* w, int64_t rows, int64_t cols, const float* x, float* y) {
  const size_t stride = row_size(t, cols);
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r) y[r] = dot_row(t, base + (size_t)r * stride, x, cols);
}

void rope_cos_sin(const RopeSpec& r, int64_t pos, float* cs) {
  const int64_t half = r.rope_dim / 2;
  float corr0 = 0.0f, corr1 = 0.0f;
  if (r.ext_factor != 0.0f) {
    // ggml_rope_yarn_corr_dims: the dims whose wavelength spans beta_fast and
    // beta_slow turns over the original context.
    auto corr_dim = [&](float n_rot) {
      return (float)r.rope_dim * std::log((float)r.n_ctx_orig / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
             (2.0f * std::log(r.freq_base));
    };
    corr0 = std::max(0.0f, std::floor(corr_dim(r.beta_fast)));
    corr1 = std::min((float)(r.rope_dim - 1), std::ceil(corr_dim(r.beta_slow)));
  }
  for (int64_t i = 0; i < half; ++i) {
    double theta_extrap = (double)pos * std::pow((double)r.freq_base, -2.0 * (double)i / (double)r.rope_dim);
    if (r.freq_factors) theta_extrap /= (double)r.freq_factors[i];
    double theta = (double)r.freq_scale * theta_extrap;
    double mscale = r.attn_factor;
    if (r.ext_factor != 0.0f) {
      const float y = ((float)i - corr0) / std::max(0.001f, corr1 - corr0);
      const double ramp = (1.0 - std::min(1.0f, std::max(0.0f, y))) * (double)r.ext_factor;
      theta = theta * (1.0 - ramp) + theta_extrap * ramp;
      mscale *= 1.0 + 0.1 * std::log(1.0 / (double)r.freq_scale);
    }
    cs[2 * i] = (float)(std::cos(theta) * mscale);
    cs[2 * i + 1] = (float)(std::sin(theta) * mscale);
  }
}

void rope_apply(float* x, int64_t n_heads, int64_t head_dim, const RopeSpec& r, const float* cs) {
  const int64_t half = r.rope_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const int64_t a = r.layout == RopeLayout::adjacent ? 2 * i : i;
      const int64_t b = r.layout == RopeLayout::adjacent ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float freq_base,
          RopeLayout layout) {
  RopeSpec r;
  r.layout = layout;
  r.rope_dim = rope_dim;
  r.freq_base = freq_base;
  std::vector<float> cs((size_t)rope_dim);
  rope_cos_sin(r, pos, cs.data());
  rope_apply(x, n_heads, head_dim, r, cs.data());
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

void gelu(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = x[i];
    x[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + 0.044715f * g * g)));
  }
}

void geglu(float* out, const float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + 0.044715f * g * g))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

}  // namespace serval::ref
