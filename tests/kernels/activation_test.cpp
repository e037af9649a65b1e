// The vectorizable GELU (kernels/activation.h) against the scalar reference
// (ref::gelu, std::tanh): within 4e-7 of |x| over the range that matters,
// x itself far above, (-)0 far below (where the reference's float tanh
// rounds to 0 as well), NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/ref/ops.h"
#include "kernels/isa_levels.h"

namespace serval {
namespace {

TEST(Activation, GeluMatchesReference) {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.00137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 1e6f, -1e6f, 3e38f, -3e38f}) x.push_back(v);
  std::vector<float> fast = x, ref = x;
  kernels::gelu(fast.data(), (int64_t)fast.size());
  ref::gelu(ref.data(), (int64_t)ref.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs((double)fast[i] - ref[i]);
    const double tol = 4e-7 * std::fabs(x[i]) + 1e-30;  // relative to the input: gelu(x) = x * (0..1)
    worst = std::max(worst, err / (std::fabs(x[i]) + 1e-30));
    EXPECT_LE(err, tol) << "x = " << x[i] << ": " << fast[i] << " vs " << ref[i];
  }
  std::printf("worst relative error (to |x|): %.3g\n", worst);
  // Far out: exactly x above, (-)0 below, whatever the magnitude.
  std::vector<float> far = {-10.5f, -1e6f, -3e38f, -std::numeric_limits<float>::infinity(), 1e6f, 3e38f,
                            std::numeric_limits<float>::infinity()};
  kernels::gelu(far.data(), (int64_t)far.size());
  for (int i = 0; i < 4; ++i) EXPECT_LE(std::fabs(far[(size_t)i]), 1e-20f) << i;
  EXPECT_EQ(far[4], 1e6f);
  EXPECT_EQ(far[5], 3e38f);
  EXPECT_EQ(far[6], std::numeric_limits<float>::infinity());
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  kernels::gelu(nan.data(), 2);
  EXPECT_TRUE(std::isnan(nan[0]));
  EXPECT_NEAR(nan[1], 0.841192f, 1e-5f);
}

// SwiGLU's gate: kernels::silu_mul against ref::swiglu (std::exp), relative
// to |gate * up|; the far ends exactly; NaN kept; out aliasing up.
TEST(Activation, SiluMulMatchesReference) {
  std::vector<float> g, u;
  for (float v = -95.0f; v <= 95.0f; v += 0.00731f) {
    g.push_back(v);
    u.push_back(0.75f - 0.001f * v);
  }
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f}) {
    g.push_back(v);
    u.push_back(-3.0f);
  }
  std::vector<float> fast(g.size()), ref(g.size());
  kernels::silu_mul(fast.data(), g.data(), u.data(), (int64_t)g.size());
  ref::swiglu(ref.data(), g.data(), u.data(), (int64_t)g.size());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double scale = std::fabs((double)g[i] * u[i]) + 1e-35;
    const double err = std::fabs((double)fast[i] - ref[i]);
    worst = std::max(worst, err / scale);
    EXPECT_LE(err, 4e-7 * scale) << "gate = " << g[i] << ": " << fast[i] << " vs " << ref[i];
  }
  std::printf("worst relative error (to |gate * up|): %.3g\n", worst);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> fg = {100.0f, 1e6f, 3e38f, -100.0f, -1e6f, -3e38f, -inf, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> fu = {2.0f, 0.5f, 1.0f, 2.0f, 2.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> out(fg.size());
  kernels::silu_mul(out.data(), fg.data(), fu.data(), (int64_t)fg.size());
  EXPECT_EQ(out[0], 200.0f);
  EXPECT_EQ(out[1], 5e5f);
  EXPECT_EQ(out[2], 3e38f);
  for (int i = 3; i < 7; ++i) EXPECT_EQ(out[(size_t)i], 0.0f) << i;  // -0 * up
  EXPECT_TRUE(std::isnan(out[7]));
  // In place over up, as the forward passes call it.
  std::vector<float> gate = {1.0f, -2.0f, 0.5f}, up = {3.0f, 1.0f, -4.0f}, want(3);
  ref::swiglu(want.data(), gate.data(), up.data(), 3);
  kernels::silu_mul(up.data(), gate.data(), up.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(up[(size_t)i], want[(size_t)i], 4e-7f * std::fabs(want[(size_t)i]) + 1e-30f);
}

// The SIMD levels' silu_mul (kernels/x86/activation_tmpl.inc) against the
// scalar loop (the ref level), bit for bit: the clamps' ends, NaN, infinities,
// signed zeros, subnormals, and lengths that leave a masked tail.
TEST(Activation, SiluMulSameBitsAtEveryLevel) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> g, u;
  for (float v = -90.0f; v <= 90.0f; v += 0.0913f) g.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-40f, -1e-40f, 80.0f, -80.0f, 79.99999f, -79.99999f, 80.00001f, -80.00001f,
                  87.0f, -87.0f, 1e30f, -1e30f, inf, -inf, std::numeric_limits<float>::quiet_NaN()})
    g.push_back(v);
  for (size_t i = 0; i < g.size(); ++i) u.push_back(i % 7 == 0 ? -0.0f : 1.25f - 0.013f * (float)(i % 97));
  const Isa keep = kernels::active_isa();
  kernels::set_isa(Isa::ref);
  std::vector<float> want(g.size());
  kernels::silu_mul(want.data(), g.data(), u.data(), (int64_t)g.size());
  for (Isa level : test::available_isa_levels()) {
    if (level == Isa::ref) continue;
    kernels::set_isa(level);
    for (int64_t n : {(int64_t)g.size(), (int64_t)1, (int64_t)15, (int64_t)17, (int64_t)33}) {
      std::vector<float> got((size_t)n, 7.0f);
      kernels::silu_mul(got.data(), g.data() + g.size() - (size_t)n, u.data() + u.size() - (size_t)n, n);
      for (int64_t i = 0; i < n; ++i) {
        const size_t j = g.size() - (size_t)n + (size_t)i;
        EXPECT_EQ(std::memcmp(&got[(size_t)i], &want[j], 4), 0)
            << isa_name(level) << " n = " << n << " gate = " << g[j] << ": " << got[(size_t)i] << " vs " << want[j];
      }
    }
  }
  kernels::set_isa(keep);
}

}  // namespace
}  // namespace serval
