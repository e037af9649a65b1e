#include "kernels/activation.h"

#include <bit>

#include "kernels/activation_isa.h"
#include "kernels/matmul.h"

namespace serval::kernels {

namespace {

// exp(t) for t in [-80, 80] (callers clamp): t = k ln2 + r, |r| <= ln2/2,
// exp(r) by its Taylor polynomial to r^6, times 2^k built in the exponent bits.
// The clamp keeps every intermediate normal: at t = -87 the product p * 2^-126
// can be subnormal, and a subnormal operand costs a microcode assist of about
// a hundred cycles for the whole vector (silu_mul took 17 % of a decode step
// that way). Past |t| = 80 neither caller's result depends on t: 1 + e^-80 == 1
// in float, and the large-t side is replaced by a select.
inline float exp_reduced(float t) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float kf = (t * kLog2e + kRound) - kRound;
  const float r = (t - kf * kLn2Hi) - kf * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t k = (int32_t)kf;
  return p * std::bit_cast<float>((k + 127) << 23);
}

}  // namespace

void gelu(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    float t = -2.0f * kSqrt2OverPi * v * (1.0f + 0.044715f * v * v);  // -2u
    // Selects, not branches (minps / maxps / blend with -fno-trapping-math,
    // src/CMakeLists.txt); written so that a NaN t becomes a number (the
    // float-to-int conversion below must never see one; v carries the NaN).
    t = t < 80.0f ? t : 80.0f;
    t = t > -80.0f ? t : -80.0f;
    const float y = v / (1.0f + exp_reduced(t));
    x[i] = v < -10.0f ? -0.0f : y;  // gelu(v) < 1e-22 in magnitude there; v / (1 + e^80) is not, for huge |v|
  }
}

void silu_mul(float* out, const float* gate, const float* up, int64_t n) {
  // The SIMD levels: the same bits, 16 lanes at a time (activation_isa.h).
  switch (active_isa()) {
    case Isa::ref: break;
    case Isa::avx2:
    case Isa::avx2vnni: return detail::silu_mul_avx2()(out, gate, up, n);
    case Isa::avx512:
    case Isa::avx512vnni: return detail::silu_mul_avx512()(out, gate, up, n);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i];
    // Selects, as in gelu: a NaN gate gives a NaN t, which the clamps turn
    // into a number for the conversion in exp_reduced; g carries the NaN.
    float t = -g;
    t = t < 80.0f ? t : 80.0f;
    t = t > -80.0f ? t : -80.0f;
    const float s = g / (1.0f + exp_reduced(t));
    out[i] = (g < -80.0f ? -0.0f : s) * u;
  }
}

}  // namespace serval::kernels
