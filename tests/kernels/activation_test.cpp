// The vectorizable GELU (kernels/activation.h) against the scalar reference
// (ref::gelu, std::tanh): within 4e-7 of |x| over the range that matters,
// x itself far above, (-)0 far below (where the reference's float tanh
// rounds to 0 as well), NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/ref/ops.h"

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

}  // namespace
}  // namespace serval
